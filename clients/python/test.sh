#!/usr/bin/env bash
# Set up and run the Python client's tests on a fresh machine: a venv under clients/python/.venv
# (gitignored), the package with its test extras (reinstalled from this tree on every run), then
# pytest. The integration tests build the server themselves (go build ./cmd/ticketing in the repo
# root) unless TICKETING_BIN names a built binary. Exits non-zero on failure.
set -euo pipefail
cd "$(dirname "$0")"

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check ".[test]"
exec .venv/bin/python -m pytest -q "$@"
