#!/usr/bin/env bash
# Builds the npm package of the JavaScript client into <repo>/dist/js/ (ticketing-client-VERSION.tgz:
# dist/esm and dist/cjs with their .d.ts, README.md, LICENSE, package.json) and runs npm's own
# pre-publish checks on it (npm pack, npm publish --dry-run, both offline). Exits non-zero on any
# error or warning; prints the artifact's path last. Needs Node.js 20+ and npm; runs `npm ci`
# first when TypeScript is not installed here (the only step that needs the registry).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/dist/js"
cd "$here"

if [[ ! -d node_modules/typescript ]]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
mkdir -p "$out"
rm -f "$out"/*.tgz
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

# npm pack runs "prepack" (scripts/ensure-built.cjs: builds dist/ unless it is up to date).
npm pack --offline --pack-destination "$out" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
if grep -Ei '^npm (warn|error)' "$log" >&2; then
  echo "package.sh: npm pack warned (above)" >&2
  exit 1
fi
tgz="$out/$(tail -n 1 "$log")"
[[ -f "$tgz" ]] || { cat "$log" >&2; echo "package.sh: no package written" >&2; exit 1; }

# The published file list: the built library, its types, README.md, LICENSE and package.json only.
unexpected="$(tar -tzf "$tgz" | grep -Ev '^package/(package\.json|README\.md|LICENSE|dist/(esm|cjs)/[a-z]+\.(js|d\.ts)|dist/cjs/package\.json)$' || true)"
if [[ -n "$unexpected" ]]; then
  echo "package.sh: unexpected files in the package:" >&2
  echo "$unexpected" >&2
  exit 1
fi

# npm publish --dry-run validates the manifest as a real publish would (it uploads nothing). Its one
# warning here is about credentials, not the package: "This command requires you to be logged in".
npm publish --dry-run --offline --ignore-scripts >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
if grep -Ei '^npm (warn|error)' "$log" | grep -v 'requires you to be logged in' >&2; then
  echo "package.sh: npm publish --dry-run warned (above)" >&2
  exit 1
fi
echo "clients/js: npm pack and npm publish --dry-run: no warnings"
echo "$tgz"
