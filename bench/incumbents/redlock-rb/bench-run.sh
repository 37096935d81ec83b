#!/usr/bin/env bash
# Runs the redlock-rb incumbent built by bench-build.sh against the Redis server at --addr:
#   bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
shift # OUTDIR: the gems are in this folder
if [[ -d "$here/build/gems/gems" ]] && ls "$here"/build/gems/gems | grep -q '^redlock-'; then
  export GEM_HOME="$here/build/gems" GEM_PATH="$here/build/gems"
  exec ruby "$here/bench.rb" "$@"
fi
exec ruby -I "$here/vendor/redlock-1.3.2/lib" "$here/bench.rb" "$@"
