#!/usr/bin/env bash
# The Ruby client's benchmark program needs no build: it runs lib/ from this checkout with the
# system's ruby. This checks that ruby is there and that the program and the library parse.
#   bench-build.sh OUTDIR   (OUTDIR is not used)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v ruby >/dev/null 2>&1; then
  echo "bench-build.sh: ruby is missing (clients/ruby/setup.sh installs Debian's ruby)" >&2
  exit 1
fi
if ! ruby -I "$here/../lib" -e 'require "ticketing"' >/dev/null 2>&1; then
  echo "bench-build.sh: the Ruby client's lib/ does not load" >&2
  exit 1
fi
ruby -c "$here/bench.rb" >/dev/null
