#!/usr/bin/env bash
# bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--api sync|asyncio]
# Runs bench.py with the venv bench-build.sh made in OUTDIR (exec: the harness measures the
# Python process itself).
set -euo pipefail
out=${1:?usage: bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--api sync|asyncio]}
shift
here=$(cd "$(dirname "$0")" && pwd)
exec "$out/venv/bin/python" "$here/bench.py" "$@"
