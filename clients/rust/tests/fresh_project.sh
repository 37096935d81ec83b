#!/usr/bin/env bash
# The packaged crate, used as a user would: package.sh builds ticketing-client-VERSION.crate, it
# is unpacked into a temporary folder, a fresh `cargo new` project depends on the unpacked crate
# by path, its main.rs is the README's own code (the first ```rust block and the ```rust,ignore
# `main` of its Install section, with the address of a real server started here), and it is
# built offline and run. Proves that the crate builds by itself (no file of the repository
# needed), that the README's example compiles there and works against the real server.
#
# Needs $TICKETING_BIN (the server) and the dependencies in cargo's cache (test.sh fetches them).
# Prints "fresh project: 1 passed, 0 failed" (or exits non-zero).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${TICKETING_BIN:?set TICKETING_BIN to the server binary}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target}" CARGO_TERM_COLOR=never

# A fixed path outside this workspace (inside it, cargo would take the unpacked crate for a member):
# cargo then reuses this crate's build from the last run instead of adding one more copy per
# temporary path. A lock keeps two runs apart; emptied first, removed at the end.
tmp="${TMPDIR:-/tmp}/rust-fresh-project"
exec 9>"$tmp.lock"
flock 9
rm -rf "$tmp"
mkdir -p "$tmp"
pid=""
cleanup() {
  if [[ -n "$pid" ]]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "fresh project: $*" >&2
  echo "fresh project: 0 passed, 1 failed"
  exit 1
}

# 1. The crate, as package.sh makes it (offline: the registry's own check is package.sh's job).
crate="$("$here/package.sh" --offline | tail -n 1)"
[[ "$crate" == *.crate && -f "$crate" ]] || fail "package.sh printed no crate"
mkdir "$tmp/unpacked"
tar xzf "$crate" -C "$tmp/unpacked"
pkg="$(echo "$tmp"/unpacked/ticketing-client-*)"
[[ -f "$pkg/Cargo.toml" ]] || fail "no Cargo.toml in $crate"
for p in tests examples test.sh package.sh conformance-driver dev; do
  [[ ! -e "$pkg/$p" ]] || fail "the crate ships $p"
done

# 2. A fresh project that depends on it by path, as the README's Install section says.
cargo new --quiet --offline --vcs none --bin --name readme-example "$tmp/app"
cd "$tmp/app"
cargo add --quiet --offline --path "$pkg"
cargo add --quiet --offline tokio --features macros,rt-multi-thread
# The same debug settings as clients/rust, so that cargo reuses the dependencies it built there.
cat >>Cargo.toml <<'EOF'

[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
debug = false
EOF
grep -q '^ticketing-client = {.* path = ' Cargo.toml || fail "cargo add wrote no path dependency"
# The versions the crate was tested with (its Cargo.lock ships in the .crate): an offline build can
# only use what cargo's cache holds, and these are there; cargo adds this project, drops the rest.
cp "$pkg/Cargo.lock" Cargo.lock

# 3. The README's code, taken from the README itself (so the README cannot rot).
readme="$here/README.md"
example="$(awk '/^```rust$/ { on = 1; next } on && /^```$/ { exit } on' "$readme")"
main="$(awk '/^```rust,ignore$/ { on = 1; next } on && /^```$/ { exit } on' "$readme")"
[[ "$example" == *"async fn charge_order"* ]] || fail "no charge_order example in the README's first rust block"
[[ "$main" == *"fn main"* && "$main" == *'"127.0.0.1:7070"'* ]] || fail "no main calling 127.0.0.1:7070 in the README"

# 4. The real server, on a free port.
mkdir "$tmp/data"
# The log exists before the server starts: the background shell opens it when it gets to it,
# which on a busy machine is after the first look below (and sed on a missing file failed the
# script under set -e).
: >"$tmp/server.log"
TICKETING_ADDR=127.0.0.1:0 TICKETING_DATA_DIR="$tmp/data" TICKETING_STARTUP_GRACE=0 \
  "$TICKETING_BIN" server >/dev/null 2>>"$tmp/server.log" &
pid=$!
addr=""
for _ in $(seq 300); do
  addr="$(sed -n 's/.* msg=listening addr=\([^ ]*\).*/\1/p' "$tmp/server.log" | head -n 1)"
  [[ -n "$addr" ]] && break
  kill -0 "$pid" 2>/dev/null || fail "the server exited: $(cat "$tmp/server.log")"
  sleep 0.1
done
[[ -n "$addr" ]] || fail "the server did not report msg=listening: $(cat "$tmp/server.log")"

printf '%s\n\n%s\n' "$example" "${main//127.0.0.1:7070/$addr}" >src/main.rs

# 5. Build offline (warnings fail too) and run.
cargo build --offline 2>&1 | tee "$tmp/build.log" || fail "cargo build failed"
if grep -q '^warning' "$tmp/build.log"; then
  fail "the build printed warnings"
fi
out="$("$CARGO_TARGET_DIR/debug/readme-example")" || fail "the example failed: $out"
echo "$out"
[[ "$out" =~ ^charged\ with\ fencing\ token\ [1-9][0-9]*$ ]] || fail "unexpected output: $out"
echo "fresh project: 1 passed, 0 failed"
