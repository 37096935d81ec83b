#!/usr/bin/env bash
# Runs the Rust incumbent (rslock) against the Redis server at --addr, under the benchmark program
# contract: bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--runtime ...]
# The runtime defaults to the one clients/rust/bench/bench-run.sh uses (current-thread).
set -euo pipefail
out="${1:?usage: bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S}"
shift
exec "$(cd "$out" && pwd)/rust-redis-target/release/rust-redis-lock-bench" --runtime current-thread "$@"
