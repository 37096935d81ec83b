#!/usr/bin/env bash
# bench-build.sh OUTDIR: builds the Redisson incumbent (RedissonBench.java, Redisson's RLock on
# Redis) with Maven, which fetches Redisson and its dependencies into the local repository the first
# time, and writes the program's class path to OUTDIR/classpath for bench-run.sh. Quick when
# nothing changed. Needs a JDK 17 and Maven.
set -euo pipefail
out=${1:?usage: bench-build.sh OUTDIR}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for tool in java mvn; do
  command -v "$tool" >/dev/null || { echo "bench-build.sh: $tool is missing (a JDK 17 and Maven)" >&2; exit 1; }
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
stamp="$out/classpath"
if [[ -s "$stamp" && -z "$(find "$here/pom.xml" "$here/src" -newer "$stamp" -print -quit)" ]]; then
  fresh=1
  IFS=: read -r -a entries < "$stamp"
  for e in "${entries[@]}"; do [[ -e "$e" ]] || fresh=0; done
  (( fresh )) && exit 0
fi
log="$out/build.log"
export MAVEN_OPTS="${MAVEN_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"
if ! (cd "$here" && mvn -B -ntp -Dstyle.color=never package) >"$log" 2>&1; then
  echo "bench-build.sh: the Maven build failed (see $log: $(grep -m1 -E '^\[ERROR\]' "$log" || tail -1 "$log"))" >&2
  exit 1
fi
printf '%s:%s\n' "$here/target/classes" "$(cat "$here/target/classpath.txt")" > "$stamp.tmp"
mv "$stamp.tmp" "$stamp"
