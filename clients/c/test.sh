#!/usr/bin/env bash
# Sets up, builds and tests the C/C++ client on a fresh machine (Debian 12):
#   1. installs the missing Debian packages (g++ cmake ninja-build pkg-config libgtest-dev
#      libgmock-dev libssl-dev nlohmann-json3-dev; g++ brings gcc, libc6-dev and the sanitizer
#      runtimes), skipped when dpkg-query shows them all installed;
#   2. builds the library, the C++ wrapper, the tests, the conformance driver and the benchmark
#      into clients/c/build and runs every test with ctest (unit tests against
#      protocol/vectors.json and constants.json, fake-server tests, integration tests against the
#      real server, the README example, cmake --install + consumers);
#   3. builds the library and tests again with AddressSanitizer + UBSan into clients/c/build-asan
#      and runs them all there too (any sanitizer report fails the test).
# The real server is $TICKETING_BIN, else built once from the repository root with go build (Go
# from go.mod's version up, not a Debian package: bookworm's golang is too old).
# Exits non-zero on any failure. Extra arguments go to both ctest runs (e.g. -R Integration).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
start=$SECONDS

pkgs=(g++ cmake ninja-build pkg-config libgtest-dev libgmock-dev libssl-dev nlohmann-json3-dev)
missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
    echo "test.sh: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 "${missing[@]}"
fi

if [[ -z "${TICKETING_BIN:-}" ]]; then
    command -v go > /dev/null || { echo "test.sh: set TICKETING_BIN to a server binary, or install Go to build one" >&2; exit 1; }
    mkdir -p "$here/build/test-server"
    (cd "$root" && go build -o "$here/build/test-server/ticketing" ./cmd/ticketing)
    export TICKETING_BIN="$here/build/test-server/ticketing"
fi

jobs=$(nproc 2> /dev/null || echo 2)
export CTEST_OUTPUT_ON_FAILURE=1

echo "test.sh: build (RelWithDebInfo) and test"
cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build "$here/build"
ctest --test-dir "$here/build" -j "$jobs" --timeout 180 "$@"

echo "test.sh: AddressSanitizer + UBSan build and test"
cmake -S "$here" -B "$here/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTICKETING_SANITIZE=ON \
    -DTICKETING_BUILD_TOOLS=OFF > /dev/null
cmake --build "$here/build-asan" --target ticketing_tests readme_example
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$here/build-asan" -j "$jobs" --timeout 180 -E install_and_consume "$@"

echo "test.sh: all C/C++ client tests passed in $((SECONDS - start)) s"
