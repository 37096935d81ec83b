#!/usr/bin/env bash
# bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--api threads|async|kotlin]
# Runs the Java client's benchmark program (Bench.java; --api kotlin: KotlinBench.kt) on the class
# path bench-build.sh wrote to OUTDIR/classpath; exec, so the harness measures the JVM itself.
# JVM flags: the serial collector (this program allocates little and keeps almost nothing: one
# thread of GC work at young collections, none in the background, where G1 would add concurrent
# and parallel GC threads on a 2-core machine and bill them to the client), a fixed 256 MiB heap
# (no resizing during the run), no hsperfdata file. C2 stays on: the figures are for a warmed JIT.
set -euo pipefail
out=${1:?usage: bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--api threads|async|kotlin]}
shift
[[ -s "$out/classpath" ]] || { echo "bench-run.sh: $out/classpath is missing; run bench-build.sh $out first" >&2; exit 1; }
exec java -XX:+UseSerialGC -Xms256m -Xmx256m -XX:-UsePerfData ${BENCH_JAVA_OPTS:-} \
  -cp "$(cat "$out/classpath")" io.ticketing.bench.Bench "$@"
