#!/usr/bin/env bash
# bench-build.sh OUTDIR: installs this folder's dependencies (package.json: redlock v5 and
# ioredis, exact versions; package-lock.json) with npm into node_modules/ (git-ignored) when
# missing: the only step that reaches the registry. OUTDIR is not used. Needs Node.js 20+.
set -euo pipefail
cd "$(dirname "$0")"
command -v node >/dev/null 2>&1 || { echo "bench-build.sh: node not found (Node.js 20+ needed)" >&2; exit 1; }
command -v npm >/dev/null 2>&1 || { echo "bench-build.sh: npm not found" >&2; exit 1; }
if ! node -e 'require.resolve("redlock"); require.resolve("ioredis")' >/dev/null 2>&1; then
    npm ci --no-audit --no-fund --loglevel=error >&2 || { echo "bench-build.sh: npm ci failed (registry unreachable?)" >&2; exit 1; }
fi
