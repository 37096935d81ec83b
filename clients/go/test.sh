#!/usr/bin/env bash
# The Go client's and the CLI's tests: builds the Go conformance driver (bin/, gitignored) and
# runs `go test -race` on the client (with its examples, the README and the install recipe) and
# on cmd/ticketing (the CLI, against real servers). TICKETING_BIN names the server binary to test
# against; by default the tests build it from this checkout. Run from anywhere.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
(cd clients/go && go build -o ../../bin/ticketing-go-conformance-driver ./internal/conformancedriver)
(cd clients/go && go vet ./... && go test -race -count=1 -timeout 10m ./...)
go test -race -count=1 -timeout 10m ./cmd/ticketing/...
