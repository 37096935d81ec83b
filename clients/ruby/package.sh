#!/usr/bin/env bash
# Builds the Ruby client's publishable artifact, the gem ticketing-<VERSION>.gem, into
# $REPO/dist/ruby/ (or the folder given as $1) with `gem build --strict` (every warning of the
# gem's own checks is an error), checks that it holds only lib/, README.md and LICENSE and that its
# version is the repository's VERSION, and prints its path on stdout. Exits non-zero on any error
# or warning, leaving no artifact behind. Offline; installs Debian's ruby first when missing (as
# test.sh does). Publishing, by hand: gem push dist/ruby/ticketing-0.3.0.gem
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/dist/ruby}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$here"
# shellcheck source=setup.sh
. ./setup.sh
command -v gem >/dev/null 2>&1 || setup_ruby

version=$(ruby -Ilib -rticketing/version -e 'print Ticketing::VERSION')
gem_file="$out/ticketing-$version.gem"
rm -f "$out"/ticketing-*.gem
log=$(mktemp /tmp/ruby-package.XXXXXX)
trap 'rm -f "$log"' EXIT
fail() {
  rm -f "$out"/ticketing-*.gem
  echo "package.sh: $1" >&2
  exit 1
}

if [[ -f "$root/VERSION" && "$(tr -d '[:space:]' <"$root/VERSION")" != "$version" ]]; then
  fail "lib/ticketing/version.rb says $version, the repository's VERSION says $(cat "$root/VERSION")"
fi
# Reproducible: the gem's date comes from SOURCE_DATE_EPOCH when set (else the last commit's).
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct 2>/dev/null || date +%s)}"
export SOURCE_DATE_EPOCH
if ! gem build --strict ticketing.gemspec --output "$gem_file" >"$log" 2>&1; then
  cat "$log" >&2
  fail "gem build failed"
fi
if grep -i 'warn' "$log" >&2; then
  fail "gem build warned (the lines above)"
fi

# What the gem holds: the library, README.md and LICENSE, nothing else.
files=$(ruby -rrubygems/package -e 'puts Gem::Package.new(ARGV[0]).spec.files' "$gem_file")
extra=$(grep -Ev '^(lib/.+\.rb|README\.md|LICENSE)$' <<<"$files" || true)
[[ -z "$extra" ]] || fail "the gem holds files it should not ship: $extra"
for f in lib/ticketing.rb README.md LICENSE; do
  grep -qx "$f" <<<"$files" || fail "the gem lacks $f"
done
echo "$gem_file"
