#!/usr/bin/env bash
# Builds the C# client (library, conformance driver, tests) with Mono and runs all of its tests on
# a fresh machine: unit tests against protocol/vectors.json and constants.json, fake-server tests
# of the failure paths, integration tests against the real server (the Medallion-style provider
# included), the package check, and the README's examples compiled in a fresh folder against the
# package's Ticketing.dll (package.sh builds it into $REPO/dist/csharp) and run.
# Installs Debian's Mono and NUnit 2.6 when missing. The server binary is $TICKETING_BIN, else
# built here once from the repository root. Prints "csharp: N passed, N failed" and exits
# non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

# Debian packages: Mono's compiler and runtime, NUnit 2.6 and its console runner, openssl for the
# TLS tests' certificates.
pkgs=(mono-devel nunit-console libnunit-cil-dev openssl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "test.sh: installing ${missing[*]}"
  apt-get update
  apt-get install -y --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 "${missing[@]}"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [[ -z "${TICKETING_BIN:-}" ]]; then
  (cd "$root" && go build -o "$tmp/ticketing" ./cmd/ticketing)
  export TICKETING_BIN="$tmp/ticketing"
fi
export TICKETING_REPO_ROOT="$root"

./build.sh
./package.sh
export TICKETING_CSHARP_PACKAGE="$root/dist/csharp"

result="$here/build/TestResult.xml"
rm -f "$result"
status=0
(cd build && timeout 900 nunit-console -nologo -noshadow -labels -xml="$result" Ticketing.Tests.dll) || status=$?

# NUnit's own summary is not what CI reads: one closing line from the result file. Every test
# case that did not run and succeed (failed, errored, ignored, skipped) counts as failed.
if [[ ! -s "$result" ]]; then
  echo "csharp: 0 passed, 1 failed (nunit-console wrote no result file, exit $status)"
  exit 1
fi
total=$(grep -o '<test-case ' "$result" | wc -l)
passed=$(grep -o '<test-case [^>]*executed="True" [^>]*result="Success"' "$result" | wc -l)
failed=$((total - passed))
echo "csharp: $passed passed, $failed failed"
if (( failed > 0 || total == 0 || status != 0 )); then
  exit 1
fi
