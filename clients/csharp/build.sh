#!/usr/bin/env bash
# Builds the C# client with Mono's C# compiler (mcs, C# 7.2) into build/: the library
# (Ticketing.dll with its XML documentation, compiled as library.sh says: the sources and
# assembly attributes of src/Ticketing/Ticketing.csproj), the conformance driver, the NUnit tests
# and the exit-check program they run.
# Needs Debian's mono-devel and libnunit-cil-dev (test.sh installs them). Exits non-zero on any
# compiler error or warning.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
# shellcheck source=library.sh
. ./library.sh
mkdir -p build
nunit="/usr/lib/cli/nunit.framework-2.6.3/nunit.framework.dll"
mcs_args=(-langversion:7.2 -warnaserror+ -nowarn:1591 -debug+)

# The library, with Mono's TLS provider (MONO); build/library-sources.txt lists its sources.
library_build build/Ticketing.dll build/Ticketing.xml build/library-sources.txt -debug+ -define:MONO

mcs "${mcs_args[@]}" -target:exe -out:build/Ticketing.ConformanceDriver.exe \
  -r:build/Ticketing.dll -r:System.dll -r:System.Core.dll \
  src/Ticketing.ConformanceDriver/*.cs

# A program the tests run as a process of its own (RealServerTests.ExitsCleanlyAfterConcurrentUse).
mcs "${mcs_args[@]}" -target:exe -out:build/Ticketing.ExitCheck.exe \
  -r:build/Ticketing.dll -r:System.dll -r:System.Core.dll \
  tests/ExitCheck/*.cs

# The tests, with the package check (PackageTests runs it).
mcs "${mcs_args[@]}" -target:library -out:build/Ticketing.Tests.dll \
  -r:build/Ticketing.dll -r:"$nunit" -r:System.dll -r:System.Core.dll -r:System.Xml.dll -r:System.Xml.Linq.dll \
  tests/*.cs src/Ticketing.ConformanceDriver/Json.cs tools/PackageCheck.cs
