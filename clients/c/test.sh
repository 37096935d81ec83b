#!/usr/bin/env bash
# Sets up, builds and tests the C/C++ client on a fresh machine (Debian 12):
#   1. installs the missing Debian packages (g++ cmake ninja-build pkg-config libgtest-dev
#      libgmock-dev libssl-dev nlohmann-json3-dev; g++ brings gcc, libc6-dev and the sanitizer
#      runtimes), skipped when dpkg-query shows them all installed;
#   2. builds the library (static and shared), the C++ wrapper, the tests, the conformance driver
#      and the benchmark into clients/c/build (-DTICKETING_BUILD_TESTS=ON -DTICKETING_BUILD_TOOLS=ON;
#      the default build is the library only) and runs every test with ctest (unit tests against
#      protocol/vectors.json and constants.json, fake-server tests, integration tests against the
#      real server, the C++ wrapper under C++17 and its std::stop_token overloads under C++20, the
#      README example, the shared library's exported symbols);
#   3. package.sh (source and binary packages into dist/c/, checked) and tests/fresh_project.sh:
#      the binary package unpacked into a temporary prefix, the README's C and C++ examples built
#      against it with pkg-config and in a fresh CMake project (find_package), run against the
#      real server;
#   4. builds the library and tests again with AddressSanitizer + UBSan into clients/c/build-asan
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
cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTICKETING_BUILD_TESTS=ON -DTICKETING_BUILD_TOOLS=ON > /dev/null
cmake --build "$here/build"
ctest --test-dir "$here/build" -j "$jobs" --timeout 180 "$@"

echo "test.sh: package.sh and the fresh project"
bash "$here/tests/fresh_project.sh"

echo "test.sh: AddressSanitizer + UBSan build and test"
cmake -S "$here" -B "$here/build-asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTICKETING_SANITIZE=ON \
    -DTICKETING_BUILD_TESTS=ON -DTICKETING_BUILD_TOOLS=OFF -DTICKETING_BUILD_SHARED=OFF > /dev/null
cmake --build "$here/build-asan" --target ticketing_tests ticketing_tests_cpp20 readme_example
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$here/build-asan" -j "$jobs" --timeout 180 "$@"

echo "test.sh: all C/C++ client tests passed in $((SECONDS - start)) s"
