#!/usr/bin/env bash
# Sets up and runs every test of the Ruby client on a fresh machine: installs Debian's ruby,
# ruby-minitest and rake when missing, builds the gem (offline), builds the server unless
# TICKETING_BIN names one, then `rake test`: the protocol vectors, the fake-server tests, the
# integration tests against the real server, the README example and the conformance driver.
# Exits non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

pkgs=(ruby ruby-minitest rake)
missing=()
for p in "${pkgs[@]}"; do
  if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != "installed" ]]; then
    missing+=("$p")
  fi
done
if (( ${#missing[@]} )); then
  sudo=""
  if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
  $sudo apt-get update -qq -o DPkg::Lock::Timeout=600
  $sudo apt-get install -y -qq --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 "${missing[@]}"
fi

mkdir -p pkg
gem build --silent ticketing.gemspec --output pkg/ticketing.gem >/dev/null
echo "built pkg/ticketing.gem ($(ruby -Ilib -rticketing/version -e 'print Ticketing::VERSION'))"

tmp=""
if [[ -z "${TICKETING_BIN:-}" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$root" && go build -o "$tmp/ticketing" ./cmd/ticketing)
  export TICKETING_BIN="$tmp/ticketing"
fi

rake test
