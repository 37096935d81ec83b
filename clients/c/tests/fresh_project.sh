#!/usr/bin/env bash
# The packaged library, used as a user would: package.sh builds the source and binary packages
# (dist/c/), the binary package is unpacked into a temporary prefix, and the README's own
# examples (its C and C++ programs, extracted from README.md so the README cannot rot) are built
# against that prefix only, and run against the real server:
#   - with pkg-config: `cc -std=c11 app.c $(pkg-config --cflags --libs ticketing)` (shared library)
#     and the same for the C++ example with c++ -std=c++17;
#   - in a fresh CMake project with find_package(ticketing 0.3 REQUIRED): the C example with
#     ticketing::ticketing (shared) and ticketing::ticketing_static, the C++ one with ticketing::cpp.
# Needs $TICKETING_BIN (the server), a C/C++ compiler, CMake, pkg-config. Usage: fresh_project.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${TICKETING_BIN:?set TICKETING_BIN to the server binary}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/c-fresh-project.XXXXXX")"
pid=""
cleanup() {
    if [[ -n "$pid" ]]; then
        kill "$pid" 2> /dev/null || true
        wait "$pid" 2> /dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "fresh project: $*" >&2
    exit 1
}

# 1. The packages, as package.sh makes them; "install" the binary one into a fresh prefix.
mapfile -t artifacts < <("$here/package.sh" | tail -n 2)
bin_pkg="${artifacts[1]:-}"
[[ "$bin_pkg" == *-linux-*.tar.gz && -f "$bin_pkg" ]] || fail "package.sh printed no binary package"
prefix="$tmp/prefix"
mkdir -p "$prefix"
tar xzf "$bin_pkg" -C "$prefix" --strip-components=1
[[ -f "$prefix/lib/pkgconfig/ticketing.pc" ]] || fail "no ticketing.pc in $bin_pkg"

# 2. The README's examples, taken from the README itself.
readme="$here/README.md"
block() { # block MARKER LANG: the ```LANG block between <!-- MARKER: begin --> and <!-- MARKER: end -->
    awk -v b="<!-- $1: begin -->" -v e="<!-- $1: end -->" -v f="\`\`\`$2" '
        $0 == b { on = 1; next }  $0 == e { on = 0 }
        on && $0 == f { code = 1; next }  on && code && $0 == "```" { code = 0; next }
        on && code' "$readme"
}
block example c > "$tmp/readme.c"
block example-cpp cpp > "$tmp/readme.cpp"
grep -q "int main" "$tmp/readme.c" || fail "no C example (<!-- example: begin -->) in README.md"
grep -q "int main" "$tmp/readme.cpp" || fail "no C++ example (<!-- example-cpp: begin -->) in README.md"

# 3. The real server, on a free port.
mkdir "$tmp/data"
: > "$tmp/server.log" # before the server starts: the loop below reads it at once (sed on a missing file fails)
TICKETING_ADDR=127.0.0.1:0 TICKETING_DATA_DIR="$tmp/data" TICKETING_STARTUP_GRACE=0 \
    "$TICKETING_BIN" server > /dev/null 2>> "$tmp/server.log" &
pid=$!
addr=""
for _ in $(seq 1 150); do
    addr="$(sed -n -E 's/.*msg=listening.* addr=([^ ]+).*/\1/p' "$tmp/server.log" | head -n 1)"
    [[ -n "$addr" ]] && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
done
[[ -n "$addr" ]] || { cat "$tmp/server.log" >&2; fail "the server did not start"; }

run() { # run NAME PROGRAM: runs a built example against the server; it must print the token line
    local out
    out="$("$2" "$addr")" || fail "$1 failed: $out"
    [[ "$out" == "holding order-1234 with fencing token "[1-9]* ]] || fail "$1 printed: $out"
    echo "fresh project: $1: $out"
}

# 4. pkg-config, as the README says (the shared library; LD_LIBRARY_PATH as for any private prefix).
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046
"${CC:-cc}" -std=c11 -Wall -Werror -o "$tmp/readme_c" "$tmp/readme.c" $(pkg-config --cflags --libs ticketing)
# shellcheck disable=SC2046
"${CXX:-c++}" -std=c++17 -Wall -Werror -o "$tmp/readme_cpp" "$tmp/readme.cpp" $(pkg-config --cflags --libs ticketing)
export LD_LIBRARY_PATH="$prefix/lib"
# (Output captured first: under pipefail, grep -q leaving early would fail the pipeline when its
# writer meets the closed pipe.)
libs="$(ldd "$tmp/readme_c")"
grep -q "libticketing.so.* => $prefix/lib/" <<< "$libs" || fail "readme_c does not use the prefix's shared library"
run "pkg-config C" "$tmp/readme_c"
run "pkg-config C++" "$tmp/readme_cpp"
unset LD_LIBRARY_PATH

# 5. A fresh CMake project with find_package(ticketing).
mkdir "$tmp/app"
cp "$tmp/readme.c" "$tmp/readme.cpp" "$tmp/app/"
cat > "$tmp/app/CMakeLists.txt" << 'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(readme_examples C CXX)
find_package(ticketing 0.3 REQUIRED)
add_executable(readme_c readme.c)
target_link_libraries(readme_c PRIVATE ticketing::ticketing)
add_executable(readme_c_static readme.c)
target_link_libraries(readme_c_static PRIVATE ticketing::ticketing_static)
add_executable(readme_cpp readme.cpp)
target_link_libraries(readme_cpp PRIVATE ticketing::cpp)
CMAKE
gen=()
if command -v ninja > /dev/null; then gen=(-G Ninja); fi
{
    cmake -S "$tmp/app" -B "$tmp/app/build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Debug \
        -DCMAKE_C_FLAGS="-Wall -Werror" -DCMAKE_CXX_FLAGS="-Wall -Werror" &&
        cmake --build "$tmp/app/build" -j 2
} > "$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log" >&2; fail "the CMake project does not build"; }
run "CMake C (ticketing::ticketing)" "$tmp/app/build/readme_c"
run "CMake C (ticketing::ticketing_static)" "$tmp/app/build/readme_c_static"
run "CMake C++ (ticketing::cpp)" "$tmp/app/build/readme_cpp"
dyn="$(readelf -d "$tmp/app/build/readme_c_static")"
if grep -q "libticketing" <<< "$dyn"; then
    fail "readme_c_static links the shared library"
fi
echo "fresh project: ok (5 programs built from the README against the installed package, run against the server)"
