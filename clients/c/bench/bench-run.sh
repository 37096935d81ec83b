#!/usr/bin/env bash
# Runs one of the C client's benchmarks under the benchmark program contract:
#   bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--api nonblocking|cpp]
# --api nonblocking (the default): ticketing-bench, the non-blocking API, N slots (each a
# sequential acquire -> release loop on its own key) in one poll() loop, no library thread;
# --api cpp: ticketing-bench-cpp, the C++ wrapper's blocking API (try_acquire, Lock::release) from
# N std::threads sharing one ticketing::Client. Both print one JSON line and exit 1 past 1% errors.
set -euo pipefail
out="${1:?usage: bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--api nonblocking|cpp]}"
shift
build="$(cd "$out" && pwd)/c-build"
api=nonblocking
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    if [[ "${args[i]}" == --api ]]; then api="${args[i + 1]:-}"; fi
done
case "$api" in
nonblocking) exec "$build/ticketing-bench" "$@" ;;
cpp) exec "$build/ticketing-bench-cpp" "$@" ;;
*) echo "c bench: unknown --api $api (want nonblocking or cpp)" >&2; exit 2 ;;
esac
