#!/usr/bin/env bash
# bench-build.sh OUTDIR: prepares the Python client's benchmark program (bench.py) for
# bench-run.sh: a venv in OUTDIR/venv (no pip, no registry: the client has no dependencies) whose
# site-packages points at this checkout's clients/python/src, so the benchmark always runs the
# source as it is now. Needs Python >= 3.11 (python3, or $PYTHON). Idempotent and quick.
set -euo pipefail
out=${1:?usage: bench-build.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../src" && pwd)
py=${PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
    echo "bench-build.sh: $py not found (Python >= 3.11 needed)" >&2
    exit 1
fi
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "bench-build.sh: $py is older than Python 3.11" >&2
    exit 1
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ ! -x "$out/venv/bin/python" ]; then
    "$py" -m venv --without-pip "$out/venv" >/dev/null || { echo "bench-build.sh: python -m venv failed" >&2; exit 1; }
fi
site=$("$out/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$src" > "$site/ticketing_bench_src.pth"
"$out/venv/bin/python" -c 'import ticketing, ticketing.asyncio' || { echo "bench-build.sh: cannot import ticketing from $src" >&2; exit 1; }
