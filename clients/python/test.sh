#!/usr/bin/env bash
# Build and test the Python client on a fresh machine (Debian 12, Python 3.11): a venv in
# clients/python/.venv (gitignored) with the package and its test tools (pytest, mypy),
# `mypy --strict`, then pytest: unit tests against protocol/*.json, a scripted fake server, the
# real server and the conformance driver. The integration tests run $TICKETING_BIN, or build the
# server with `go build ./cmd/ticketing` in the repository root. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"
started=$(date +%s)

# Debian packages: openssl (test certificates are made at test time), python3-venv where the
# system Python lacks venv. apt only when something is missing.
need=()
command -v openssl >/dev/null 2>&1 || need+=(openssl)
"${PYTHON:-python3}" -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ] && ! dpkg-query -W "${need[@]}" >/dev/null 2>&1; then
    apt-get update
    apt-get install -y --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 "${need[@]}"
fi

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check ".[test]"

echo "== mypy --strict"
.venv/bin/python -m mypy --strict src conformance tests
echo "== pytest"
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" || status=$?
echo "clients/python/test.sh: $(( $(date +%s) - started )) s"
exit $status
