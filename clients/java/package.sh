#!/usr/bin/env bash
# Builds the Java client's publishable artifacts into <repo>/dist/java/maven-repo, a Maven repository
# layout ready to upload (signatures are added at publish time):
#   io/ticketing/ticketing-parent/0.3.0/   the parent POM (license, scm, developers...)
#   io/ticketing/ticketing-client/0.3.0/   jar, sources jar, javadoc jar, POM   (Java, no dependencies)
#   io/ticketing/ticketing-kotlin/0.3.0/   jar, sources jar, javadoc jar (KDoc), POM
# The conformance driver is never installed or deployed. It then checks what a registry checks:
# every jar present, POM metadata complete, the version equal to the repository's VERSION file,
# Automatic-Module-Name and LICENSE in each library jar, and a build log with no warning (javac,
# kotlinc, javadoc with doclint, Dokka and Maven itself). Exits non-zero on any error or warning.
#
# Needs a JDK 17 and Maven (clients/java/test.sh installs them) and the Maven plugins, which the
# first run fetches from the registry and later runs find in the local repository. Tests are skipped
# unless PACKAGE_RUN_TESTS=1 (test.sh sets it, so one Maven run builds, tests and packages).
# MAVEN_REPO=<dir> uses a separate local Maven repository, as in test.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

for tool in java mvn jar; do
  command -v "$tool" >/dev/null || { echo "package.sh: $tool is missing; run clients/java/test.sh once" >&2; exit 1; }
done

version="$(tr -d '[:space:]' < "$root/VERSION")"
out="$root/dist/java"
repo="$out/maven-repo"
rm -rf "$repo"
mkdir -p "$out"

mvn_args=(-B -ntp -Dstyle.color=never -Dmaven.install.skip=true "-DaltDeploymentRepository=dist::file://$repo")
if [[ -n "${MAVEN_REPO:-}" ]]; then
  mvn_args+=("-Dmaven.repo.local=$MAVEN_REPO")
fi
if [[ "${PACKAGE_RUN_TESTS:-0}" != 1 ]]; then
  mvn_args+=(-DskipTests)
fi
export MAVEN_OPTS="${MAVEN_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"

log="$out/build.log"
status=0
mvn "${mvn_args[@]}" deploy 2>&1 | tee "$log" || status=$?
if (( status != 0 )); then
  echo "package.sh: the Maven build failed (exit $status)" >&2
  exit "$status"
fi

errors=()
# Any warning fails: Maven's own, a compiler's, javadoc's (doclint all) or Dokka's.
if warnings="$(grep -E '^\[WARNING\]|^WARNING|warning:|Failed to download' "$log")"; then
  errors+=("the build printed warnings:"$'\n'"$warnings")
fi

artifacts=()
for a in ticketing-client ticketing-kotlin; do
  dir="$repo/io/ticketing/$a/$version"
  for f in "$a-$version.pom" "$a-$version.jar" "$a-$version-sources.jar" "$a-$version-javadoc.jar"; do
    if [[ -f "$dir/$f" ]]; then artifacts+=("$dir/$f"); else errors+=("missing $dir/$f"); fi
  done
  jarfile="$dir/$a-$version.jar"
  [[ -f "$jarfile" ]] || continue
  module="$(jar --describe-module --file "$jarfile" 2>&1 | grep -m1 "automatic$" || true)"
  case "$a" in
    ticketing-client) want="io.ticketing@$version automatic" ;;
    ticketing-kotlin) want="io.ticketing.kotlin@$version automatic" ;;
  esac
  [[ "$module" == "$want" ]] || errors+=("$a: module '$module', want '$want' (Automatic-Module-Name)")
  for jf in "$jarfile" "$dir/$a-$version-sources.jar"; do
    # (Listings captured first: under pipefail, grep -q leaving early fails the pipeline when
    # the writer meets the closed pipe.)
    if [[ -f "$jf" ]] && ! grep -qx 'META-INF/LICENSE' <<< "$(jar --list --file "$jf")"; then
      errors+=("$jf has no META-INF/LICENSE")
    fi
  done
  if [[ -f "$dir/$a-$version-javadoc.jar" ]] && ! grep -q 'index.html' <<< "$(jar --list --file "$dir/$a-$version-javadoc.jar")"; then
    errors+=("$a's javadoc jar has no index.html")
  fi
done
parent="$repo/io/ticketing/ticketing-parent/$version/ticketing-parent-$version.pom"
if [[ -f "$parent" ]]; then
  artifacts+=("$parent")
  for tag in '<name>Apache-2.0</name>' '<url>https://github.com/ticketing/ticketing/tree/main/clients/java</url>' \
      '<connection>scm:git:https://github.com/ticketing/ticketing.git</connection>' \
      '<name>The Ticketing authors</name>' '<url>https://github.com/ticketing/ticketing/issues</url>' \
      "<version>$version</version>"; do
    grep -qF "$tag" "$parent" || errors+=("the parent POM lacks $tag")
  done
else
  errors+=("missing $parent")
fi
for a in ticketing-client ticketing-kotlin; do
  pom="$repo/io/ticketing/$a/$version/$a-$version.pom"
  if ! { [[ -f "$pom" ]] && grep -q '<description>' "$pom" && grep -q '<name>' "$pom"; }; then
    errors+=("$a's POM lacks a name or description")
  fi
done
if [[ -n "$(find "$repo" -path '*conformance*')" ]]; then
  errors+=("the conformance driver was deployed")
fi
if ls "$repo"/io/ticketing 2>/dev/null | grep -vxE 'ticketing-(parent|client|kotlin)' > /dev/null; then
  errors+=("unexpected artifacts: $(ls "$repo"/io/ticketing | tr '\n' ' ')")
fi

if (( ${#errors[@]} )); then
  printf 'package.sh: %s\n' "${errors[@]}" >&2
  exit 1
fi
echo "package.sh: checks passed (warnings: none); artifacts:"
printf '  %s\n' "${artifacts[@]}"
