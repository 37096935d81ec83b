#!/usr/bin/env bash
# Runs the C# client's benchmark program built by bench-build.sh OUTDIR, under Mono:
#   bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [--api async]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:?usage: bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S}"
shift
exec mono "$out/Bench.exe" "$@"
