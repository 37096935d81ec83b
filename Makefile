# Ticketing — the two commands a new user needs:
#   make run    build and start a single node on 127.0.0.1:7070 (no configuration needed)
#   make test   set up everything on a fresh machine and run every test
SHELL := /bin/bash
GO ?= go
BIN := bin/ticketing
# Every official client: clients/<name>/test.sh sets it up, builds it and runs its own tests.
CLIENTS := go python js rust c java ruby csharp

.PHONY: all build run setup test test-server test-fuzz test-cluster test-clients test-conformance test-bench test-adminpage test-conformance-cluster chaos package \
	$(addprefix test-,$(CLIENTS)) vet fuzz bench bench-quick bench-clients bench-prev clean

all: build

# The release build (toolchain/go-build.sh, also used by deploy/Dockerfile and the bench harness):
# a static binary (no cgo: Go's own DNS resolver, no libc mapped: it starts anywhere and maps about
# 1.5 MB less), inlining only where the server spends its time (cmd/ticketing/gcflags.txt, about
# 430 KiB less resident), and the functions a node runs placed together at the front of the binary
# by Go's linker with one addition (cmd/ticketing/textorder.txt, toolchain/README.md: about 3 MB
# less resident).
build:
	toolchain/go-build.sh -o $(BIN) ./cmd/ticketing

run: build
	./$(BIN) server

# System packages the server's own tests use: nftables and iproute2 (a dead peer in a network
# namespace), util-linux (unshare --time for clock offsets), systemd (systemd-analyze verify of
# the generated unit). Installed only when missing. Then the root module's whole module graph:
# `go build` and `go test` fetch only what their packages import, and internal/deploy replays the
# Dockerfile's `go mod download` layer offline (GOPROXY=off), which needs every module go.sum names
# (on a fresh machine it failed with "module lookup disabled by GOPROXY=off").
SETUP_PKGS := nftables iproute2 util-linux systemd
setup:
	@missing=""; for p in $(SETUP_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends --no-upgrade -o DPkg::Lock::Timeout=600 $$missing >/dev/null; \
	fi
	$(GO) mod download

vet:
	@bad=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$bad" ]; then echo "gofmt needed: $$bad"; exit 1; fi
	$(GO) vet ./...
	$(GO) -C wire vet ./...

test: setup vet test-server test-fuzz test-cluster test-clients test-conformance test-conformance-cluster test-bench test-adminpage

# The server, the lock table, the wire format (its own module, shared with the Go client), the
# stores, the settings, the deploy generator, the CLI's commands (internal/cli, against real
# servers) and the binary itself (cmd/ticketing: its version, log writer, linked packages, the
# release build's text order; toolchain/genorder: the order's generator), with
# the race detector; the packages' versions and licenses (tests/packaging). The Go
# client is tested by clients/go/test.sh, among the clients.
test-server: setup build
	$(GO) -C wire test -race -count=1 ./...
	TICKETING_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 15m ./internal/... ./cmd/... ./toolchain/... ./tests/packaging
	$(GO) test -count=1 -run '^TestSockIO$$' ./internal/server # the raw socket calls: built without -race only

# Real cluster processes on 127.0.0.x: crashes, clock offsets, stalled disks (budget: 8 minutes).
# With the race detector on the tests' own goroutines (the servers are separate processes): it
# costs little here, since the time is spent waiting on the cluster (105 s against 100 s).
test-cluster: setup build
	TICKETING_BIN=$(CURDIR)/$(BIN) $(GO) test -race -count=1 -timeout 15m ./tests/cluster

# Each fuzz target runs briefly from its committed corpus (internal/*/testdata/fuzz). The budget
# is a count of executions, not a duration: a duration races Go's fuzz coordinator at the deadline
# and fails spuriously with "context deadline exceeded" (golang/go#75804, fixed in Go 1.27).
FUZZN ?= 200000x
FUZZN_SERVER ?= 1000x
FUZZTIMEOUT ?= 120s
test-fuzz:
	$(GO) -C wire test -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $(FUZZN) -timeout $(FUZZTIMEOUT) .
	$(GO) -C wire test -run '^$$' -fuzz '^FuzzDecodeResponse$$' -fuzztime $(FUZZN) -timeout $(FUZZTIMEOUT) .
	$(GO) -C wire test -run '^$$' -fuzz '^FuzzHandshake$$' -fuzztime $(FUZZN) -timeout $(FUZZTIMEOUT) .
	$(GO) test -run '^$$' -fuzz '^FuzzApply$$' -fuzztime $(FUZZN) -timeout $(FUZZTIMEOUT) ./internal/locktable
	$(GO) test -run '^$$' -fuzz '^FuzzServerHandshake$$' -fuzztime $(FUZZN_SERVER) -timeout $(FUZZTIMEOUT) ./internal/server
	$(GO) test -run '^$$' -fuzz '^FuzzServer$$' -fuzztime $(FUZZN_SERVER) -timeout $(FUZZTIMEOUT) ./internal/adminhttp

# Every client's publishable artifacts into dist/<client>/: each clients/<name>/package.sh runs
# its registry's own checks (cargo publish --dry-run, gem build --strict, npm pack, python -m
# build + twine check, Maven's sources and javadoc jars...) and fails on any warning. It needs
# the client's toolchain, which its test.sh installs. The Go client and the wire codec are Go
# modules: they are published by their tags, with no artifact.
PACKAGED := python js rust java csharp ruby c
package: $(addprefix package-,$(PACKAGED))
package-%:
	bash clients/$*/package.sh

test-clients: $(addprefix test-,$(CLIENTS))

$(addprefix test-,$(CLIENTS)): test-%: build
	TICKETING_BIN=$(CURDIR)/$(BIN) bash clients/$*/test.sh

# Every client's driver against every scenario of tests/conformance/SCENARIOS.md, plus the
# cross-language FIFO scenario (the clients' test.sh built the drivers).
# Every driver is named, so one that does not start fails the run (a plain `go test ./...`
# skips the drivers whose clients are not built, saying so).
comma := ,
empty :=
space := $(empty) $(empty)
test-conformance: build test-clients
	TICKETING_BIN=$(CURDIR)/$(BIN) TICKETING_CONFORMANCE_REPORT=$(CURDIR)/bin/conformance.txt \
	  TICKETING_CONFORMANCE_DRIVERS=$(subst $(space),$(comma),$(CLIENTS) cli) \
	  $(GO) test -count=1 -timeout 10m ./tests/conformance; rc=$$?; cat bin/conformance.txt 2>/dev/null; exit $$rc

# The conformance scenarios against a fresh 3-node cluster per scenario (127.0.0.41-43; stopping or
# killing the server is a leader failover there: tests/conformance/SCENARIOS.md, "On a cluster"),
# for every client's driver (about 160 s on 2 cores; frozen_leader runs only here).
test-conformance-cluster: build test-clients
	TICKETING_BIN=$(CURDIR)/$(BIN) TICKETING_CONFORMANCE_TARGET=cluster TICKETING_CONFORMANCE_DRIVERS=$(subst $(space),$(comma),$(CLIENTS)) \
	  TICKETING_CONFORMANCE_REPORT=$(CURDIR)/bin/conformance-cluster.txt \
	  $(GO) test -count=1 -timeout 10m -run '^TestConformance$$' ./tests/conformance; rc=$$?; cat bin/conformance-cluster.txt 2>/dev/null; exit $$rc

# The benchmark harness's own tests (its module: bench/go.mod).
test-bench:
	$(MAKE) -C bench test

# Chaos soak: the chaos tests of tests/cluster with the nemesis running CHAOS_DURATION each
# (make test-cluster runs them bounded). CHAOS_SEED=n replays a run's fault schedule.
CHAOS_DURATION ?= 10m
CHAOS_SEED ?= 0
CHAOS_TIMEOUT ?= 3h
chaos: build
	TICKETING_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -v -timeout $(CHAOS_TIMEOUT) -run '^TestChaos' ./tests/cluster -args -chaos.duration=$(CHAOS_DURATION) -chaos.seed=$(CHAOS_SEED)

# The admin page in Debian's headless Chromium, driven by playwright-core (npm, pinned); installs
# both when missing.
test-adminpage: build
	TICKETING_BIN=$(CURDIR)/$(BIN) bash tests/adminpage/test.sh

fuzz:
	$(MAKE) test-fuzz FUZZN=20000000x FUZZN_SERVER=50000x FUZZTIMEOUT=30m

bench bench-quick bench-clients bench-prev: ; $(MAKE) -C bench $@

clean:
	rm -rf bin
