#!/usr/bin/env bash
# The server's release build, used by `make build`, deploy/Dockerfile and the bench harness:
#   toolchain/go-build.sh [go build flags] -o OUT ./cmd/ticketing
# A static binary (CGO_ENABLED=0), the compiler flags of cmd/ticketing/gcflags.txt (inlining
# where the server spends its time), and the functions of cmd/ticketing/textorder.txt placed at
# the front of the binary by the ordering linker (toolchain/README.md). TICKETING_LINK_ORDER=off
# builds with Go's standard linker instead (the same program; about 3 MB more of it resident).
# TICKETING_LINK_TEXT_ORDER names another order file (toolchain/gen-order.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$root"
mapfile -t gcflags < <(grep -v '^#' cmd/ticketing/gcflags.txt | grep -v '^[[:space:]]*$')
export CGO_ENABLED=0
if [[ "${TICKETING_LINK_ORDER:-on}" == off ]]; then
  exec go build "${gcflags[@]}" "$@"
fi
TICKETING_LINKER="$("$here/linker.sh")"
export TICKETING_LINKER TICKETING_LINK_TEXT_ORDER="${TICKETING_LINK_TEXT_ORDER:-$root/cmd/ticketing/textorder.txt}"
exec go build -toolexec "$here/toolexec.sh" "${gcflags[@]}" "$@"
