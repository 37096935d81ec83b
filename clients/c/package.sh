#!/usr/bin/env bash
# Builds the C/C++ client's release artifacts into <repo>/dist/c/ and checks them:
#   ticketing-VERSION.tar.gz              the source package: the library's sources and headers,
#                                         CMakeLists.txt, the CMake and pkg-config templates,
#                                         README.md and LICENSE (no tests, tools or test.sh)
#   ticketing-VERSION-linux-ARCH.tar.gz   the binary package: `cmake --install` of a Release build
#                                         made from that source package (include/, lib/ with
#                                         libticketing.a and libticketing.so, lib/pkgconfig,
#                                         lib/cmake/ticketing, share/doc/ticketing)
# C has no package registry; the checks a registry would make are made here: the source package
# configures and builds by itself with no warning (-Werror, and any "warning" in the logs fails),
# the version is the repository's VERSION, the install tree holds exactly the expected files, the
# shared library's soname is libticketing.so.MAJOR.MINOR and it exports only the public API
# (tests/exported_symbols.sh), and `pkg-config --validate` accepts the .pc file.
# Needs what the library needs (a C compiler, CMake, OpenSSL headers, pkg-config), no network.
# Prints the two artifact paths last; exits non-zero on any error or warning.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dist="$root/dist/c"
work="$here/build-pkg"

fail() {
    echo "package.sh: $*" >&2
    exit 1
}

version="$(sed -n -E 's/^project\(ticketing VERSION ([0-9.]+) .*/\1/p' "$here/CMakeLists.txt")"
[[ -n "$version" ]] || fail "no project(ticketing VERSION ...) in CMakeLists.txt"
if [[ -f "$root/VERSION" ]]; then
    [[ "$(tr -d '[:space:]' < "$root/VERSION")" == "$version" ]] ||
        fail "CMakeLists.txt says $version, the repository's VERSION says $(cat "$root/VERSION")"
fi
grep -q "^#define TK_VERSION \"$version\"" "$here/include/ticketing/ticketing.h" ||
    fail "TK_VERSION in include/ticketing/ticketing.h is not \"$version\""
arch="$(uname -m)"
src_name="ticketing-$version"
bin_name="ticketing-$version-linux-$arch"
# reproducible archives: fixed times, owners and order
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$here" log -1 --format=%ct -- . 2> /dev/null || date +%s)}"
tar_opts=(--sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" --mode=u+rw,go+r,go-w)

rm -rf "$work"
mkdir -p "$work" "$dist"
rm -f "$dist/$src_name.tar.gz" "$dist/$bin_name.tar.gz"

# 1. The source package: exactly these files.
(
    cd "$here"
    printf '%s\n' CMakeLists.txt README.md LICENSE ticketing.pc.in cmake/ticketingConfig.cmake.in \
        include/ticketing/*.h include/ticketing/*.hpp src/*.c src/*.h
) > "$work/files"
mkdir "$work/$src_name"
(cd "$here" && tar cf - -T "$work/files") | tar xf - -C "$work/$src_name"
tar "${tar_opts[@]}" -cf - -C "$work" "$src_name" | gzip -n -9 > "$dist/$src_name.tar.gz"

# 2. Build and install from the unpacked source package only (proves it is complete).
mkdir "$work/unpacked"
tar xzf "$dist/$src_name.tar.gz" -C "$work/unpacked"
gen=()
if command -v ninja > /dev/null; then gen=(-G Ninja); fi
log="$work/build.log"
{
    cmake -S "$work/unpacked/$src_name" -B "$work/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_C_FLAGS=-Werror &&
        cmake --build "$work/build" -j 2 &&
        cmake --install "$work/build" --prefix "$work/stage/$bin_name"
} > "$log" 2>&1 || { cat "$log" >&2; fail "the source package does not build (log above)"; }
if grep -i "warning" "$log" >&2; then
    fail "warnings while building the source package (above; full log: $log)"
fi

# 3. Check the install tree.
stage="$work/stage/$bin_name"
so="lib/libticketing.so.${version%.*}"
cat > "$work/expected" <<LIST
include/ticketing/export.h
include/ticketing/ticketing.h
include/ticketing/ticketing.hpp
include/ticketing/wire.h
lib/cmake/ticketing/ticketingConfig.cmake
lib/cmake/ticketing/ticketingConfigVersion.cmake
lib/cmake/ticketing/ticketingTargets-release.cmake
lib/cmake/ticketing/ticketingTargets.cmake
lib/libticketing.a
lib/libticketing.so
$so
lib/libticketing.so.$version
lib/pkgconfig/ticketing.pc
share/doc/ticketing/LICENSE
share/doc/ticketing/README.md
LIST
(cd "$stage" && find . -mindepth 1 ! -type d | sed 's|^\./||' | LC_ALL=C sort) > "$work/installed"
LC_ALL=C sort -o "$work/expected" "$work/expected"
diff -u "$work/expected" "$work/installed" >&2 || fail "the install tree differs from the expected files (diff above)"
soname="$(readelf -d "$stage/lib/libticketing.so.$version" | sed -n -E 's/.*\(SONAME\).*\[(.*)\]/\1/p')"
[[ "$soname" == "$(basename "$so")" ]] || fail "soname is '$soname', expected $(basename "$so")"
bash "$here/tests/exported_symbols.sh" "$stage/lib/libticketing.so.$version" "$stage/include" >&2
PKG_CONFIG_PATH="$stage/lib/pkgconfig" pkg-config --validate ticketing >&2 || fail "pkg-config --validate failed"
pcv="$(PKG_CONFIG_PATH="$stage/lib/pkgconfig" pkg-config --modversion ticketing)"
[[ "$pcv" == "$version" ]] || fail "ticketing.pc says version $pcv"
cmp -s "$stage/share/doc/ticketing/LICENSE" "$here/LICENSE" || fail "LICENSE was not installed as is"
if [[ -f "$root/LICENSE" ]]; then
    cmp -s "$here/LICENSE" "$root/LICENSE" || fail "clients/c/LICENSE differs from the repository's LICENSE"
fi

# 4. The binary package.
tar "${tar_opts[@]}" -cf - -C "$work/stage" "$bin_name" | gzip -n -9 > "$dist/$bin_name.tar.gz"
echo "package.sh: checks passed (source package builds with no warning; $(wc -l < "$work/installed") files installed; public API only exported; pkg-config --validate ok)" >&2
echo "$dist/$src_name.tar.gz"
echo "$dist/$bin_name.tar.gz"
