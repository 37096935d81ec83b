#!/usr/bin/env bash
# Builds the Java client (core, Kotlin module, conformance driver) and runs all of its tests on a
# fresh machine: unit tests against protocol/vectors.json and constants.json, fake-server tests of
# the failure paths, integration tests against the real server, and the Kotlin coroutine tests.
# The server binary is $TICKETING_BIN, else built here once from the repository root.
# Set MAVEN_REPO=<dir> to use a separate local Maven repository. Exits non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

# Debian packages: a JDK 17 and Maven (preinstalled on our machines), openssl for the TLS tests.
pkgs=(openjdk-17-jdk-headless maven openssl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "test.sh: installing ${missing[*]}"
  apt-get update
  apt-get install -y --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 "${missing[@]}"
fi

tmp=""
if [[ -z "${TICKETING_BIN:-}" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$root" && go build -o "$tmp/ticketing" ./cmd/ticketing)
  export TICKETING_BIN="$tmp/ticketing"
fi

mvn_args=(-B -ntp -Dstyle.color=never)
if [[ -n "${MAVEN_REPO:-}" ]]; then
  mvn_args+=("-Dmaven.repo.local=$MAVEN_REPO")
fi
# C1 is enough for Maven itself and starts faster on small machines.
export MAVEN_OPTS="${MAVEN_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"

log="$(mktemp)"
status=0
mvn "${mvn_args[@]}" verify 2>&1 | tee "$log" || status=$?
# One closing line with the totals of every module (Surefire prints a line per module).
grep -E '^\[(INFO|ERROR|WARNING)\] Tests run: [0-9]+, Failures: [0-9]+, Errors: [0-9]+, Skipped: [0-9]+$' "$log" |
  awk -F'[ ,:]+' '{ run += $4; failed += $6 + $8; skipped += $10 }
    END { printf "java: %d passed, %d failed, %d skipped\n", run - failed - skipped, failed, skipped }'
rm -f "$log"
exit "$status"
