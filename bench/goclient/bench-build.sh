#!/usr/bin/env bash
# Builds this folder's benchmark program into OUTDIR (the clients workload's program contract,
# bench/clients.go). Idempotent: go build's cache makes a second build quick. Dependencies come
# from the go command's ordinary module download (go.mod, go.sum).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bench-build.sh OUTDIR" >&2; exit 2; }
command -v go >/dev/null || { echo "go not found (the Go toolchain is not installed)" >&2; exit 1; }
mkdir -p "$1" && out=$(cd "$1" && pwd) || { echo "cannot create $1" >&2; exit 1; }
cd "$(dirname "$0")" || exit 1
if ! log=$(go build -o "$out/goclient" . 2>&1); then
  echo "go build failed: $(printf '%s\n' "$log" | tail -n 1)" >&2
  exit 1
fi
