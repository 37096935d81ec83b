#!/usr/bin/env bash
# Builds the Rust incumbent (rslock on Redis; src/main.rs) in release mode into OUTDIR/rust-redis-target.
# Offline first (cargo's cache), then with the registry when a dependency is missing. Idempotent.
#   bench-build.sh OUTDIR
set -euo pipefail
out="${1:?usage: bench-build.sh OUTDIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v cargo > /dev/null || { echo "rust-redis: cargo not found (the Rust toolchain is not installed)" >&2; exit 1; }
mkdir -p "$out"
target="$(cd "$out" && pwd)/rust-redis-target"
log="$target.log"
cd "$here"
build() { cargo build --locked --release --target-dir "$target" "$@"; }
if ! build --offline > "$log" 2>&1 && ! build >> "$log" 2>&1; then
    echo "rust-redis: cargo build failed: $(grep -m1 '^error' "$log" || tail -n1 "$log") (log: $log)" >&2
    exit 1
fi
