#!/usr/bin/env bash
# Builds the Rust client and runs all of its checks on a fresh machine: rustfmt, clippy (warnings
# are errors), then `cargo test`: unit tests against protocol/vectors.json and constants.json, a
# fake server for the failure paths, the real server, the conformance driver (an example, built by
# cargo test and started by ./conformance-driver), and the doctests; then the packaged crate
# (package.sh) built and run in a fresh project (tests/fresh_project.sh). The tests and examples
# belong to the workspace member dev/ (not published); the library is the package
# ticketing-client. The server comes from $TICKETING_BIN, or is built here with
# `go build ./cmd/ticketing`. Exits non-zero on any failure and ends with an "N passed, N failed"
# line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"
export CARGO_TARGET_DIR="$here/target" CARGO_TERM_COLOR=never RUST_BACKTRACE="${RUST_BACKTRACE:-0}"

# Debian packages the tests need: the openssl CLI makes the TLS test certificates.
missing=()
for p in openssl; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  apt-get update
  apt-get install -y --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 "${missing[@]}"
fi
# rustfmt and clippy ship with the rustup toolchain; add them where a minimal profile left them out.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

tmp=""
if [[ -z "${TICKETING_BIN:-}" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$root" && go build -o "$tmp/ticketing" ./cmd/ticketing)
  export TICKETING_BIN="$tmp/ticketing"
fi

# Every dependency of Cargo.lock into cargo's cache (all platforms), so that package.sh and the
# fresh project of tests/fresh_project.sh can build offline.
cargo fetch --locked
cargo fmt --all --check
cargo clippy --locked --all-targets -- -D warnings
log="$(mktemp)"
trap 'rm -rf "$log" ${tmp:+"$tmp"}' EXIT
status=0
# The conformance driver first: ./conformance-driver runs it, and tests/it/driver.rs drives it.
cargo build --locked --example conformance_driver --example crosslang_waiter
cargo test --locked --tests 2>&1 | tee "$log" || status=$?
cargo test --locked --doc 2>&1 | tee -a "$log" || status=$?
"$here/tests/fresh_project.sh" 2>&1 | tee -a "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     /^fresh project: [0-9]+ passed, [0-9]+ failed$/ { p += $3; f += $5 }
     END { printf "rust: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
