#!/usr/bin/env bash
# Build and test the Python client on a fresh machine (Debian 12, Python 3.11): a venv in
# clients/python/.venv (gitignored, made by venv.sh) with the package and its dev tools (pytest,
# mypy, build, twine), `mypy --strict`, then pytest: unit tests against protocol/*.json, a scripted
# fake server, the real server, the conformance driver, and the package (package.sh's sdist and
# wheel, the wheel installed in a fresh venv running the README's example). The integration tests
# run $TICKETING_BIN, or build the server with `go build ./cmd/ticketing` in the repository root.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"
started=$(date +%s)

# shellcheck source=venv.sh
. ./venv.sh
setup_venv

echo "== mypy --strict"
.venv/bin/python -m mypy --strict src conformance tests
echo "== pytest"
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" || status=$?
echo "clients/python/test.sh: $(( $(date +%s) - started )) s"
exit $status
