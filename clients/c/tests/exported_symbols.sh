#!/usr/bin/env bash
# Checks that the shared library exports exactly the public API: every function declared with
# TK_API in the public headers, and nothing else (no internal tk__* function, no helper).
# Usage: exported_symbols.sh LIBTICKETING.so INCLUDE_DIR
set -euo pipefail
lib="$1"
inc="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# the public API: "TK_API <type> [*]tk_name(" in the installed headers
sed -n -E 's/^TK_API (const )?[a-z_0-9]+ \**(tk_[a-z_0-9]+)\(.*/\2/p' "$inc"/ticketing/*.h | sort -u > "$tmp/api"
# what the library exports (defined dynamic symbols, without symbol versions)
nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u > "$tmp/exported"

api_count=$(wc -l < "$tmp/api")
if ((api_count < 50)); then
    echo "exported_symbols: found only $api_count TK_API declarations in $inc/ticketing" >&2
    exit 1
fi
extra="$(comm -13 "$tmp/api" "$tmp/exported")"
missing="$(comm -23 "$tmp/api" "$tmp/exported")"
if [[ -n "$extra" ]]; then
    echo "exported_symbols: $lib exports symbols that are not public API:" >&2
    echo "$extra" | sed 's/^/  /' >&2
fi
if [[ -n "$missing" ]]; then
    echo "exported_symbols: $lib does not export these public functions:" >&2
    echo "$missing" | sed 's/^/  /' >&2
fi
[[ -z "$extra" && -z "$missing" ]] || exit 1
echo "exported_symbols: $(wc -l < "$tmp/exported") symbols exported, all public API ($api_count TK_API functions)"
