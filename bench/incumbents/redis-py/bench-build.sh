#!/usr/bin/env bash
# bench-build.sh OUTDIR: the redis-py incumbent's venv, in this folder's .venv (git-ignored),
# with requirements.txt installed by pip when missing (the only step that reaches the registry;
# quick and offline once done). OUTDIR is not used. Needs Python >= 3.11 (python3, or $PYTHON).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
py=${PYTHON:-python3}
command -v "$py" >/dev/null 2>&1 || { echo "bench-build.sh: $py not found (Python >= 3.11 needed)" >&2; exit 1; }
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || { echo "bench-build.sh: $py is older than Python 3.11" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv >/dev/null || { rm -rf .venv; echo "bench-build.sh: python -m venv failed" >&2; exit 1; }
fi
want=$(sed -n 's/^redis==//p' requirements.txt)
have=$(.venv/bin/python -c 'import redis; print(redis.__version__)' 2>/dev/null || true)
if [ "$have" != "$want" ]; then
    if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt >&2; then
        echo "bench-build.sh: pip install -r requirements.txt failed (registry unreachable?)" >&2
        exit 1
    fi
fi
