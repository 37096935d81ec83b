#!/usr/bin/env bash
# Builds the C# client with Mono's C# compiler (mcs, C# 7.2) into build/: the library
# (Ticketing.dll with its XML documentation), the conformance driver, the NUnit tests and the
# exit-check program they run.
# Needs Debian's mono-devel and libnunit-cil-dev (test.sh installs them). Exits non-zero on any
# compiler error or warning.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
mkdir -p build
nunit="/usr/lib/cli/nunit.framework-2.6.3/nunit.framework.dll"
mcs_args=(-langversion:7.2 -warnaserror+ -nowarn:1591 -debug+)

# The library: MONO selects Mono's TLS provider for ECDSA trust anchors (see Dialer.cs). Missing
# XML documentation is an error for the library (CS1591). RuntimeInformation tells Linux (the
# deadline clock reads CLOCK_BOOTTIME there, SuspendClock.cs).
mcs -langversion:7.2 -warnaserror+ -debug+ -target:library -define:MONO \
  -doc:build/Ticketing.xml -out:build/Ticketing.dll \
  -r:System.dll -r:System.Core.dll -r:Mono.Security.dll -r:Facades/System.Runtime.InteropServices.RuntimeInformation.dll \
  src/Ticketing/*.cs src/Ticketing/Protocol/*.cs

mcs "${mcs_args[@]}" -target:exe -out:build/Ticketing.ConformanceDriver.exe \
  -r:build/Ticketing.dll -r:System.dll -r:System.Core.dll \
  src/Ticketing.ConformanceDriver/*.cs

# A program the tests run as a process of its own (RealServerTests.ExitsCleanlyAfterConcurrentUse).
mcs "${mcs_args[@]}" -target:exe -out:build/Ticketing.ExitCheck.exe \
  -r:build/Ticketing.dll -r:System.dll -r:System.Core.dll \
  tests/ExitCheck/*.cs

mcs "${mcs_args[@]}" -target:library -out:build/Ticketing.Tests.dll \
  -r:build/Ticketing.dll -r:"$nunit" -r:System.dll -r:System.Core.dll \
  tests/*.cs src/Ticketing.ConformanceDriver/Json.cs
