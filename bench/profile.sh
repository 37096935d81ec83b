#!/usr/bin/env bash
# CPU profile of the Ticketing server during workload (a) at 64 connections.
#
# The server has no pprof endpoint, so this builds a profiling copy OUTSIDE the repository: it
# copies the source tree (TICKETING_SRC, default the repo root) to a temp dir, adds one file that
# serves net/http/pprof on $TICKETING_PPROF_ADDR, builds it, runs the harness against it, and
# prints `go tool pprof -top`. The repository itself is never modified.
#
#   bench/profile.sh [extra harness flags]      e.g. bench/profile.sh -duration 10s
# Writes results/profile-top.txt (flat) and results/profile-top-cum.txt (cumulative); the raw
# profile stays in results/tmp/ticketing-cpu.pprof (a heap profile beside it, .heap).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="${TICKETING_SRC:-$(cd "$here/.." && pwd)}"
out="$here/results"
mkdir -p "$out/tmp"
work="$(mktemp -d /tmp/ticketing-profile-XXXXXX)"
trap 'rm -rf "$work"' EXIT
tar -C "$src" --exclude=./.git --exclude=./bench --exclude=node_modules --exclude=.venv -cf - . | tar -C "$work" -xf -
cat > "$work/cmd/ticketing/zz_bench_pprof.go" <<'GO'
package main

import (
	"net/http"
	_ "net/http/pprof"
	"os"
)

// Profiling build only (bench/profile.sh): serve pprof on TICKETING_PPROF_ADDR.
func init() {
	if a := os.Getenv("TICKETING_PPROF_ADDR"); a != "" {
		go http.ListenAndServe(a, nil)
	}
}
GO
(cd "$work" && toolchain/go-build.sh -o "$out/tmp/ticketing-pprof" ./cmd/ticketing)
cd "$here"
go build -o "$out/tmp/bench" .
"$out/tmp/bench" -systems ticketing -workloads a -conns 64 -duration 10s \
  -ticketing-bin "$out/tmp/ticketing-pprof" -server-cpuprofile "$out/tmp/ticketing-cpu.pprof" \
  -out "$out/tmp/profile-run" "$@" >/dev/null
go tool pprof -top -nodecount=35 "$out/tmp/ticketing-pprof" "$out/tmp/ticketing-cpu.pprof" | tee "$out/profile-top.txt"
echo
go tool pprof -top -cum -nodecount=25 "$out/tmp/ticketing-pprof" "$out/tmp/ticketing-cpu.pprof" | tee "$out/profile-top-cum.txt"
