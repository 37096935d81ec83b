#!/usr/bin/env bash
# bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S: runs the Redisson incumbent (exec:
# the harness measures the JVM itself), with the same JVM flags as the Java client's program
# (clients/java/bench/bench-run.sh says why).
set -euo pipefail
out=${1:?usage: bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S}
shift
[[ -s "$out/classpath" ]] || { echo "bench-run.sh: $out/classpath is missing; run bench-build.sh $out first" >&2; exit 1; }
exec java -XX:+UseSerialGC -Xms256m -Xmx256m -XX:-UsePerfData ${BENCH_JAVA_OPTS:-} \
  -cp "$(cat "$out/classpath")" bench.RedissonBench "$@"
