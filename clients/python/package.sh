#!/usr/bin/env bash
# Builds the Python client's publishable artifacts, the sdist and the wheel of the distribution
# "ticketing-client" (import name "ticketing"), into $REPO/dist/python/ (or the folder given as
# $1) with `python -m build` (the wheel is built from the sdist), checks them with
# `twine check --strict` (its report on stderr), and prints their paths on stdout, one a line.
# Exits non-zero on any error or warning.
# Uses clients/python/.venv as test.sh sets it up, and sets it up the same way when the build
# tools are missing; after that it runs offline (`--no-isolation`: the venv's setuptools builds).
# Publishing, by hand: .venv/bin/python -m twine upload dist/python/*
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../dist/python}
cd "$here"
# shellcheck source=venv.sh
. ./venv.sh
if ! .venv/bin/python -c 'import build, twine, setuptools' >/dev/null 2>&1; then
    setup_venv
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/ticketing_client-*
log=$(mktemp /tmp/python-package.XXXXXX)
trap 'rm -f "$log"' EXIT
# A failed or warned build leaves no artifact behind to be uploaded by mistake.
fail() {
    rm -f "$out"/ticketing_client-*
    echo "package.sh: $1" >&2
    exit 1
}
# PYTHONDONTWRITEBYTECODE (set on some machines) only makes setuptools warn that it skips
# byte-compiling, which a wheel does not ship anyway.
if ! env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m build --no-isolation --outdir "$out" . >"$log" 2>&1; then
    cat "$log" >&2
    fail "python -m build failed"
fi
if grep -i 'warn' "$log" >&2; then
    echo "-- the whole log:" >&2
    cat "$log" >&2
    fail "python -m build warned (the lines before the log)"
fi
artifacts=("$out"/ticketing_client-*)
.venv/bin/python -m twine --no-color check --strict "${artifacts[@]}" >&2 || fail "twine check failed"
printf '%s\n' "${artifacts[@]}"
