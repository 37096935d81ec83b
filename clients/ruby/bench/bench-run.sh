#!/usr/bin/env bash
# Runs the Ruby client's benchmark program (lib/ from this checkout, N threads on one client):
#   bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
shift # OUTDIR: nothing is built
exec ruby -I "$here/../lib" "$here/bench.rb" "$@"
