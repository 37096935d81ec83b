#!/usr/bin/env bash
# bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--api sync|asyncio]
# Runs bench.py with this folder's venv (exec: the harness measures the Python process itself).
set -euo pipefail
shift
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/.venv/bin/python" "$here/bench.py" "$@"
