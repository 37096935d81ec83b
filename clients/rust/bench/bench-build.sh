#!/usr/bin/env bash
# Builds the Rust client's benchmark (examples/bench.rs, the benchmark program contract of the
# repository's bench/) with cargo in release mode, into OUTDIR/rust-target. Offline first (from
# cargo's cache), then with the registry when a dependency is missing. Idempotent: a second run
# only rebuilds what changed.
#   bench-build.sh OUTDIR
set -euo pipefail
out="${1:?usage: bench-build.sh OUTDIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v cargo > /dev/null || { echo "rust bench: cargo not found (the Rust toolchain is not installed)" >&2; exit 1; }
mkdir -p "$out"
target="$(cd "$out" && pwd)/rust-target"
log="$target.log"
cd "$here"
build() { cargo build --locked --release --example bench --target-dir "$target" "$@"; }
if ! build --offline > "$log" 2>&1 && ! build >> "$log" 2>&1; then
    echo "rust bench: cargo build failed: $(grep -m1 '^error' "$log" || tail -n1 "$log") (log: $log)" >&2
    exit 1
fi
