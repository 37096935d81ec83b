#!/usr/bin/env bash
# Runs the Rust client's benchmark under the benchmark program contract:
#   bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--runtime current-thread|multi-thread]
# One ticketing::Client, N tokio tasks, each looping acquire (its own key, lease 10 s, try once)
# then release; 1 s of warm-up, then S seconds counted; one JSON line on stdout.
# The runtime is tokio's current-thread one unless --runtime says otherwise. Measured on the
# 2-core benchmark machine (5 interleaved rounds, medians, same run): current-thread 8.8k pairs/s
# at 1 task and 104k at 16, for 40 and 2.6 us of client CPU per pair; multi-thread 6.0k and 77k,
# for 65 and 4.9 us. With one connection as the bottleneck, the second worker only adds
# cross-thread wake-ups and contention for the client's state lock (tasks woken together by one
# batch of answers, then stolen by the other worker).
set -euo pipefail
out="${1:?usage: bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--runtime current-thread|multi-thread]}"
shift
bin="$(cd "$out" && pwd)/rust-target/release/examples/bench"
exec "$bin" --runtime current-thread "$@"
