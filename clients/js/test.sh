#!/usr/bin/env bash
# Builds the JavaScript client and runs all of its tests on a fresh machine: the openssl CLI if
# missing (test certificates are made at test time), npm ci (the tools), `npm run build:test`
# (the package's dist/ unless up to date, then the tests and the conformance driver), the server
# binary (unless TICKETING_BIN names one), then `node --test`: unit tests against protocol/*.json
# and of the deadline clock, fake-server tests, integration tests against the real server, the
# README's examples, the conformance driver, and the package (package.sh builds the .tgz and runs
# npm's checks; a fresh `npm init -y` project installs it offline and runs the README's example
# with import and with require). Exits non-zero on any failure and prints the test counts.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"
start=$SECONDS

if ! command -v openssl >/dev/null 2>&1; then
  if ! dpkg-query -W -f='${Status}' openssl 2>/dev/null | grep -q 'install ok installed'; then
    sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update
    $sudo apt-get install -y --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 openssl
  fi
fi

npm ci --no-audit --no-fund --loglevel=error
npm run --silent build:test

tmp=""
if [[ -z "${TICKETING_BIN:-}" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$root" && go build -o "$tmp/ticketing" ./cmd/ticketing)
  export TICKETING_BIN="$tmp/ticketing"
fi
echo "clients/js: built in $((SECONDS - start)) s; testing against $TICKETING_BIN"

# The TAP reporter ends with the counts (# tests, # pass, # fail).
node --test --test-reporter=tap --test-timeout=120000 dist/test/*.test.js
echo "clients/js: all tests passed in $((SECONDS - start)) s"
