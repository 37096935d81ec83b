#!/usr/bin/env bash
# Builds the JavaScript client and runs its tests on a fresh machine: npm ci (which builds the
# package), the tests' own build, the server binary (unless TICKETING_BIN names one), then
# `node --test`. Exits non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

npm ci --no-audit --no-fund --loglevel=error
npm run --silent build:test

tmp=""
if [[ -z "${TICKETING_BIN:-}" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$root" && go build -o "$tmp/ticketing" ./cmd/ticketing)
  export TICKETING_BIN="$tmp/ticketing"
fi

node --test --test-timeout=60000 dist/test/*.test.js
