#!/usr/bin/env bash
# Sets up and runs every test of the Ruby client on a fresh machine: installs Debian's ruby,
# ruby-minitest and rake when missing (setup.sh), builds and checks the gem with package.sh
# (offline), builds the server unless TICKETING_BIN names one, then `rake test`: the protocol
# vectors, the fake-server tests, the integration tests against the real server, the README
# example (from lib/, and from the gem installed into a fresh GEM_HOME) and the conformance driver.
# Exits non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

# shellcheck source=setup.sh
. ./setup.sh
setup_ruby

# The gem as published (into $REPO/dist/ruby/, checked by `gem build --strict`); test/package_test.rb
# installs it into a fresh GEM_HOME and runs the README's example with it.
TICKETING_GEM="$(./package.sh)"
export TICKETING_GEM
echo "built $TICKETING_GEM"

tmp=""
if [[ -z "${TICKETING_BIN:-}" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$root" && go build -o "$tmp/ticketing" ./cmd/ticketing)
  export TICKETING_BIN="$tmp/ticketing"
fi

rake test
