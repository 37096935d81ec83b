#!/usr/bin/env bash
# Builds the C client's benchmarks (the benchmark program contract, bench/ of the repository):
# ticketing-bench (the non-blocking API, N slots in one poll() loop) and ticketing-bench-cpp (the
# C++ wrapper's blocking API, N std::threads sharing one client), with the library they link, in a
# Release tree under OUTDIR/c-build. Idempotent: a second run only rebuilds what changed.
#   bench-build.sh OUTDIR
set -euo pipefail
out="${1:?usage: bench-build.sh OUTDIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for tool in cmake cc c++; do
    command -v "$tool" > /dev/null || { echo "c bench: $tool not found (the C client's build tools are not installed)" >&2; exit 1; }
done
mkdir -p "$out"
build="$(cd "$out" && pwd)/c-build"
log="$build.log"
gen=()
if command -v ninja > /dev/null && { [[ ! -f "$build/CMakeCache.txt" ]] || grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build/CMakeCache.txt"; }; then
    gen=(-G Ninja)
fi
if ! { cmake -S "$here" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DTICKETING_BUILD_BENCH=ON \
        -DTICKETING_BUILD_SHARED=OFF -DTICKETING_BUILD_TESTS=OFF -DTICKETING_BUILD_TOOLS=OFF &&
       cmake --build "$build" --target ticketing-bench ticketing-bench-cpp -j 2; } > "$log" 2>&1; then
    echo "c bench: build failed: $(grep -m1 -iE 'error|not found' "$log" || tail -n1 "$log") (log: $log)" >&2
    exit 1
fi
