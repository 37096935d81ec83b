#!/usr/bin/env bash
# Builds the C# client's benchmark program into OUTDIR (default: ./build): the library as the
# package ships it for Mono (library.sh, -optimize+ -define:MONO) and Bench.exe. Quick when both
# are newer than every source. Needs Mono's mcs (clients/csharp/test.sh installs mono-devel).
#   bench-build.sh OUTDIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/build}"
if ! command -v mcs >/dev/null 2>&1 || ! command -v mono >/dev/null 2>&1; then
  echo "bench-build.sh: Mono's mcs and mono are missing (apt-get install mono-devel; clients/csharp/test.sh installs it)" >&2
  exit 1
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$here/.."
# shellcheck source=../library.sh
. ./library.sh
newest="$(find src/Ticketing bench/Bench.cs library.sh -name '*.cs' -o -name '*.csproj' -o -name '*.sh' | xargs ls -t | head -n 1)"
if [[ -f "$out/Bench.exe" && -f "$out/Ticketing.dll" && "$out/Bench.exe" -nt "$newest" && "$out/Ticketing.dll" -nt "$newest" ]]; then
  exit 0
fi
log="$(mktemp /tmp/csharp-bench-build.XXXXXX)"
trap 'rm -f "$log"' EXIT
if ! library_build "$out/Ticketing.dll" "$out/Ticketing.xml" "$out/library-sources.txt" -optimize+ -define:MONO >"$log" 2>&1; then
  cat "$log" >&2
  echo "bench-build.sh: mcs failed building the library" >&2
  exit 1
fi
if ! mcs -langversion:7.2 -optimize+ -target:exe -out:"$out/Bench.exe" -r:"$out/Ticketing.dll" \
    -r:System.dll -r:System.Core.dll bench/Bench.cs >"$log" 2>&1; then
  cat "$log" >&2
  echo "bench-build.sh: mcs failed building Bench.cs" >&2
  exit 1
fi
