#!/usr/bin/env bash
# bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S
# Runs bench.mjs (exec: the harness measures the node process itself).
set -euo pipefail
shift
exec node "$(dirname "$0")/bench.mjs" "$@"
