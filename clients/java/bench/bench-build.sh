#!/usr/bin/env bash
# bench-build.sh OUTDIR: builds the Java client's benchmark program (this folder, a Maven module of
# clients/java built only under -P bench, never installed or deployed) together with the client's
# own modules (core, kotlin) from this checkout, and writes the program's class path to
# OUTDIR/classpath for bench-run.sh. Maven fetches what is missing from the local repository (the
# first time: maven-dependency-plugin). Quick when nothing changed since the last build.
# Needs a JDK 17 and Maven (clients/java/test.sh installs them).
set -euo pipefail
out=${1:?usage: bench-build.sh OUTDIR}
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
java_root="$(cd "$here/.." && pwd)"
for tool in java mvn; do
  command -v "$tool" >/dev/null || { echo "bench-build.sh: $tool is missing (a JDK 17 and Maven; clients/java/test.sh installs them)" >&2; exit 1; }
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
stamp="$out/classpath"
# Up to date: the class path exists, every entry on it exists, and no source or POM is newer.
if [[ -s "$stamp" ]]; then
  fresh=1
  IFS=: read -r -a entries < "$stamp"
  for e in "${entries[@]}"; do [[ -e "$e" ]] || fresh=0; done
  if (( fresh )) && [[ -z "$(find "$java_root/pom.xml" "$java_root/core/pom.xml" "$java_root/core/src/main" \
      "$java_root/kotlin/pom.xml" "$java_root/kotlin/src/main" "$here/pom.xml" "$here/src" -newer "$stamp" -print -quit)" ]]; then
    exit 0
  fi
fi
log="$out/build.log"
export MAVEN_OPTS="${MAVEN_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"
if ! (cd "$java_root" && mvn -B -ntp -Dstyle.color=never -P bench -pl bench -am package -DskipTests \
    -Dmaven.source.skip=true -Dmaven.javadoc.skip=true -Ddokka.skip=true) >"$log" 2>&1; then
  echo "bench-build.sh: the Maven build failed (see $log: $(grep -m1 -E '^\[ERROR\]' "$log" || tail -1 "$log"))" >&2
  exit 1
fi
cp="$(cat "$here/target/classpath.txt")"
printf '%s:%s\n' "$here/target/classes" "$cp" > "$stamp.tmp"
mv "$stamp.tmp" "$stamp"
