# Ticketing — the two commands a new user needs:
#   make run    build and start a single node on 127.0.0.1:7070 (no configuration needed)
#   make test   set up everything on a fresh machine and run every test
SHELL := /bin/bash
GO ?= go
BIN := bin/ticketing

.PHONY: all build run test test-go test-fuzz test-python test-js test-crosslang test-bench vet fuzz bench bench-quick clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/ticketing

run: build
	./$(BIN) server

vet:
	@bad=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$bad" ]; then echo "gofmt needed: $$bad"; exit 1; fi
	$(GO) vet ./...

test: vet test-go test-fuzz test-python test-js test-crosslang test-bench

test-go:
	$(GO) test -race -count=1 ./...

# Each fuzz target runs briefly from its committed corpus (internal/*/testdata/fuzz). The budget
# is a count of executions, not a duration: a duration races Go's fuzz coordinator at the deadline
# and fails spuriously with "context deadline exceeded" (golang/go#75804, fixed in Go 1.27).
FUZZN ?= 200000x
FUZZN_SERVER ?= 1000x
FUZZTIMEOUT ?= 120s
test-fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $(FUZZN) -timeout $(FUZZTIMEOUT) ./internal/wire
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeResponse$$' -fuzztime $(FUZZN) -timeout $(FUZZTIMEOUT) ./internal/wire
	$(GO) test -run '^$$' -fuzz '^FuzzHandshake$$' -fuzztime $(FUZZN) -timeout $(FUZZTIMEOUT) ./internal/wire
	$(GO) test -run '^$$' -fuzz '^FuzzServerHandshake$$' -fuzztime $(FUZZN_SERVER) -timeout $(FUZZTIMEOUT) ./internal/server

test-python: build
	TICKETING_BIN=$(CURDIR)/$(BIN) bash clients/python/test.sh

test-js: build
	TICKETING_BIN=$(CURDIR)/$(BIN) bash clients/js/test.sh

# Go, Python and Node waiters on one key (needs the Python venv and the JS build made above).
test-crosslang: test-python test-js
	$(GO) test -tags crosslang -count=1 ./tests/crosslang

# The benchmark harness's own tests (its module: bench/go.mod).
test-bench:
	$(MAKE) -C bench test

fuzz:
	$(MAKE) test-fuzz FUZZN=20000000x FUZZN_SERVER=50000x FUZZTIMEOUT=30m

bench bench-quick: ; $(MAKE) -C bench $@

clean:
	rm -rf bin
