#!/usr/bin/env bash
# The Go client's tests: builds the Go conformance driver (bin/, gitignored) and runs `go test
# -race` on the client (with its examples, the README and the install recipe) and on
# cmd/ticketing's own (the log writer). The CLI's commands live in internal/cli and are tested
# with the rest of internal/ by `make test-server`. TICKETING_BIN names the server binary to test
# against; by default the tests build it from this checkout. Run from anywhere.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
(cd clients/go && go build -o ../../bin/ticketing-go-conformance-driver ./internal/conformancedriver)
(cd clients/go && go vet ./... && go test -race -count=1 -timeout 10m ./...)
# Once more without the race detector: on Linux a plain TCP connection then reads and writes its
# socket with raw system calls (sockio_linux.go), the path programs run; under -race it uses
# net.Conn, whose system calls tell the detector what the socket orders.
(cd clients/go && go test -count=1 -timeout 10m .)
go test -race -count=1 -timeout 10m ./cmd/ticketing/...
