#!/usr/bin/env bash
# Builds what can be built of the C# client's package here, into $REPO/dist/csharp/ (or the folder
# given as $1), checks it, and prints the artifact paths on stdout, one a line. Exits non-zero on
# any error or warning.
#
# The package for the registry is Ticketing.Client, made by `dotnet pack -c Release` from
# src/Ticketing (a .nupkg for netstandard2.0 and net8.0). Our machines have no .NET SDK and no
# NuGet feed (Debian's only `nuget` is 2.8, which predates SDK-style projects, license
# expressions and packed READMEs), so this script cannot make the .nupkg. It does instead:
#  1. builds the library with Mono, as the project's tests run it: dist/csharp/Ticketing.dll
#     (-define:MONO: Mono's TLS provider, -optimize+) with its XML documentation, the README and
#     the LICENSE; that is the artifact for Mono applications (mcs -r:Ticketing.dll);
#  2. compiles the same sources without MONO, as Ticketing.csproj does (its #if !MONO TLS path),
#     against Mono's framework, every warning an error; the output is thrown away;
#  3. runs tools/PackageCheck.cs, the check of what `dotnet pack` would put in the .nuspec: the
#     metadata and its values, the packed README and LICENSE, no deprecated property, and that the
#     .csproj compiles exactly the sources of steps 1 and 2. It prints that metadata on stderr.
# Needs Debian's mono-devel (test.sh installs it); runs offline.
# With a .NET SDK, the registry's package and its check are:
#   dotnet pack src/Ticketing -c Release -o ../../dist/csharp   (warnings: none expected)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/dist/csharp}"
cd "$here"
# shellcheck source=library.sh
. ./library.sh

if ! command -v mcs >/dev/null || ! command -v mono >/dev/null; then
  echo "package.sh: needs Mono's mcs and mono (apt-get install mono-devel; test.sh does)" >&2
  exit 1
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -f "$out"/Ticketing.dll "$out"/Ticketing.xml "$out"/README.md "$out"/LICENSE
tmp="$(mktemp -d /tmp/csharp-package.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
# A failed or warned build leaves no artifact behind.
fail() {
  rm -f "$out"/Ticketing.dll "$out"/Ticketing.xml "$out"/README.md "$out"/LICENSE
  echo "package.sh: $1" >&2
  exit 1
}

# 1. The Mono build of the library (mcs prints nothing when there is nothing to say).
library_build "$out/Ticketing.dll" "$out/Ticketing.xml" "$tmp/mono-sources.txt" -optimize+ -define:MONO >"$tmp/mcs.log" 2>&1 \
  || { cat "$tmp/mcs.log" >&2; fail "mcs failed (the Mono build)"; }
if [[ -s "$tmp/mcs.log" ]]; then cat "$tmp/mcs.log" >&2; fail "mcs printed something (the Mono build)"; fi
cp README.md LICENSE "$out/"

# 2. The .csproj's configuration: no MONO.
library_build "$tmp/Ticketing.dll" "$tmp/Ticketing.xml" "$tmp/sdk-sources.txt" >"$tmp/mcs.log" 2>&1 \
  || { cat "$tmp/mcs.log" >&2; fail "mcs failed (the sources without MONO, as Ticketing.csproj compiles them)"; }
if [[ -s "$tmp/mcs.log" ]]; then cat "$tmp/mcs.log" >&2; fail "mcs printed something (without MONO)"; fi

# 3. The .nuspec metadata check.
mcs -langversion:7.2 -warnaserror+ -nowarn:1591 -target:exe -out:"$tmp/PackageCheck.exe" \
  -r:System.dll -r:System.Core.dll -r:System.Xml.dll -r:System.Xml.Linq.dll tools/PackageCheck.cs >"$tmp/mcs.log" 2>&1 \
  || { cat "$tmp/mcs.log" >&2; fail "mcs failed (tools/PackageCheck.cs)"; }
if [[ -s "$tmp/mcs.log" ]]; then cat "$tmp/mcs.log" >&2; fail "mcs printed something (tools/PackageCheck.cs)"; fi
mono "$tmp/PackageCheck.exe" "$here" "$root" "$tmp/mono-sources.txt" >&2 || fail "the package check failed (the lines before)"
cmp -s "$tmp/mono-sources.txt" "$tmp/sdk-sources.txt" || fail "steps 1 and 2 compiled different sources"

echo "package.sh: warnings: none; no .nupkg (no .NET SDK here: dotnet pack src/Ticketing makes it)" >&2
printf '%s\n' "$out/Ticketing.dll" "$out/Ticketing.xml" "$out/README.md" "$out/LICENSE"
