#!/usr/bin/env bash
# bench-build.sh OUTDIR: builds the JS client (dist/, as its package does: scripts/ensure-built.cjs,
# after `npm ci` when TypeScript is missing) for bench.mjs. OUTDIR is not used. Needs Node.js 20+.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v node >/dev/null 2>&1 || { echo "bench-build.sh: node not found (Node.js 20+ needed)" >&2; exit 1; }
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
    || { echo "bench-build.sh: Node.js $(node --version) is older than 20" >&2; exit 1; }
if [ ! -d node_modules/typescript ]; then
    npm ci --no-audit --no-fund --loglevel=error >&2 || { echo "bench-build.sh: npm ci failed (registry unreachable?)" >&2; exit 1; }
fi
node scripts/ensure-built.cjs >&2 || { echo "bench-build.sh: building dist/ failed" >&2; exit 1; }
