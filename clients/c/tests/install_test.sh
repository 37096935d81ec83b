#!/usr/bin/env bash
# Installs the built client into a temporary prefix (cmake --install), then builds two tiny
# consumers against the installed copy only: a C program with pkg-config, and a C++ program
# with find_package(ticketing) in CMake. Usage: install_test.sh BUILD_DIR
set -euo pipefail
build="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
"${CMAKE:-cmake}" --install "$build" --prefix "$prefix" > "$tmp/install.log"
test -f "$prefix/include/ticketing/ticketing.h"
test -f "$prefix/include/ticketing/ticketing.hpp"
libdir="$(dirname "$(find "$prefix" -name ticketing.pc | head -n1)")/.."
pc="$(find "$prefix" -name ticketing.pc | head -n1)"
test -n "$pc"

cat > "$tmp/consumer.c" <<'C'
#include <stdio.h>
#include <ticketing/ticketing.h>
int main(void) {
    tk_error err;
    tk_client *c = NULL;
    const char *eps[] = {"127.0.0.1:1"}; /* nobody listens: the call must fail cleanly */
    tk_options o = {.endpoints = eps, .n_endpoints = 1, .dial_timeout_ms = 500};
    tk_err rc = tk_client_connect(&o, &c, &err);
    printf("%s %s\n", TK_VERSION, tk_err_kind(rc));
    return rc == TK_ERR_UNAVAILABLE ? 0 : 1;
}
C
export PKG_CONFIG_PATH="$(dirname "$pc")"
# shellcheck disable=SC2046
"${CC:-cc}" -std=c11 -o "$tmp/consumer" "$tmp/consumer.c" $(pkg-config --cflags --libs ticketing)
out="$("$tmp/consumer")"
echo "pkg-config consumer: $out"
[[ "$out" == *unavailable* ]]

mkdir -p "$tmp/cpp"
cat > "$tmp/cpp/main.cpp" <<'CPP'
#include <iostream>
#include <ticketing/ticketing.hpp>
int main() {
    ticketing::Options o;
    o.endpoints = {"127.0.0.1:1"};
    o.dial_timeout = std::chrono::milliseconds(500);
    try {
        ticketing::Client c(o);
    } catch (const ticketing::Unavailable &e) {
        std::cout << "unavailable: " << e.what() << "\n";
        return 0;
    }
    return 1;
}
CPP
cat > "$tmp/cpp/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.16)
project(consumer CXX)
find_package(ticketing REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE ticketing::cpp)
CM
gen=()
if command -v ninja > /dev/null; then gen=(-G Ninja); fi
"${CMAKE:-cmake}" -S "$tmp/cpp" -B "$tmp/cpp/build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_CXX_COMPILER="${CXX:-c++}" > "$tmp/cmake.log" || { cat "$tmp/cmake.log"; exit 1; }
"${CMAKE:-cmake}" --build "$tmp/cpp/build" > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
"$tmp/cpp/build/consumer"
echo "install_and_consume: ok"
