#!/usr/bin/env bash
# Builds the publishable crate of the Rust client, ticketing-client-VERSION.crate, into
# <repository>/dist/rust/ and runs the registry's own check: `cargo package` (the file list, the
# manifest's metadata, and a build of the packaged crate by itself), then `cargo publish --dry-run`
# (the same with the registry's index; nothing is uploaded). Prints the artifact's path. Exits
# non-zero on any error, and on any warning but the dry run's own "aborting upload due to dry run".
#
#   ./package.sh            needs the registry's index (reached by cargo itself)
#   ./package.sh --offline  `cargo package --offline` only: needs the dependencies in cargo's cache
#                           (test.sh's `cargo fetch` puts them there)
#
# A checkout with uncommitted changes is packaged as it is (--allow-dirty; the crate's
# .cargo_vcs_info.json then says "dirty"). The real upload, from a clean checkout of a release:
# `cargo publish -p ticketing-client` in this folder.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target}" CARGO_TERM_COLOR=never

offline=()
case "${1:-}" in
  "") ;;
  --offline) offline=(--offline) ;;
  *) echo "usage: $0 [--offline]" >&2; exit 2 ;;
esac

name=ticketing-client
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
crate="$CARGO_TARGET_DIR/package/$name-$version.crate"
out="$root/dist/rust"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

# Runs cargo, showing its output on stderr (stdout ends with the artifact's path alone), and fails
# on a warning (cargo itself exits 0 on those).
check() {
  local status=0
  cargo "$@" 2>&1 | tee "$log" >&2 || status=$?
  if ((status != 0)); then
    echo "package.sh: cargo $1 failed" >&2
    exit "$status"
  fi
  if grep '^warning' "$log" | grep -v '^warning: aborting upload due to dry run$' > /dev/null; then
    echo "package.sh: cargo $1 printed warnings (above)" >&2
    exit 1
  fi
}

rm -f "$crate"
check package -p "$name" --locked --allow-dirty "${offline[@]}"
if ((${#offline[@]} == 0)); then
  # The package step above already built the packaged crate; this adds the registry's checks.
  check publish -p "$name" --dry-run --no-verify --locked --allow-dirty
fi
echo "package.sh: the crate holds:" >&2
cargo package -p "$name" --list --locked --allow-dirty "${offline[@]}" | sed 's/^/  /' >&2
mkdir -p "$out"
cp "$crate" "$out/"
echo "$out/$name-$version.crate"
