// Package conformance is the conformance runner: one Go test that starts the real server, starts
// every client's driver once (DRIVER.md: JSON lines over stdin/stdout) and runs every scenario of
// SCENARIOS.md against every driver, plus the cross-language scenario across all of them at once.
//
//	go test -count=1 -timeout 10m ./tests/conformance
//
// Environment:
//   - TICKETING_BIN: the ticketing binary (server and CLI); built from this checkout when unset.
//   - TICKETING_CONFORMANCE_DRIVERS=go,python,cli: run only these drivers (a named driver that is
//     missing fails the run). Unset: every executable clients/*/conformance-driver, plus cli.
//     "stub" (and "stub-2", "stub-3"...) is the runner's own reference driver (stub_test.go).
//   - TICKETING_CONFORMANCE_SCENARIOS=basic,fifo: run only these scenarios.
//   - TICKETING_CONFORMANCE_PARALLEL=N: drivers run at once (default 3).
//   - TICKETING_CONFORMANCE_TARGET: the server target kind: "single" (the default, one node) or
//     "cluster" (a fresh 3-node Raft cluster per scenario on 127.0.0.41-43; target_cluster_test.go).
//     On a cluster, stopping or killing the server means the leader (SCENARIOS.md, "On a cluster";
//     scenarios_cluster_test.go holds the cluster variants).
//   - TICKETING_CONFORMANCE_REPORT=FILE: also write the summary table to FILE.
//
// The pieces: driver_test.go (driver processes), raw_test.go (the raw protocol client R),
// target_test.go and target_cluster_test.go (the server side as a Target), scenario_test.go (the
// scenario context and checks), scenarios_*_test.go (SCENARIOS.md, one function per scenario),
// report_test.go (the summary), stub_test.go (the stub driver), and ./cli (the CLI's driver, a
// separate program).
package conformance
