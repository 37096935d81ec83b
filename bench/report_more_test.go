package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompareBaseline: the verdicts are the normalized ratios (Ticketing's advantage over the
// reference in this run / the same in the baseline) when both runs share a CPU, and none at all
// when they do not.
func TestCompareBaseline(t *testing.T) {
	rec := func(sys string, ops float64) *Record {
		return &Record{System: sys, Workload: "a_pipelined", Connections: 16, Pipeline: 32, Keys: 10000, OpsPerSec: ops}
	}
	prev := runFile{Meta: &Meta{CPUModel: "cpu A", Commit: "old"}, Records: []*Record{rec("ticketing", 800), rec("null", 1000)}}
	raw, err := json.Marshal(prev)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "previous.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(cpu string, tk, null float64) string {
		b := &bench{o: &options{baseline: path, systems: []string{"ticketing", "null"}, conns: []int{16}},
			meta: &Meta{CPUModel: cpu}, records: []*Record{rec("ticketing", tk), rec("null", null)}}
		return b.compareBaseline()
	}
	row := func(report string) string {
		for _, l := range strings.Split(report, "\n") {
			if strings.HasPrefix(l, "| (a) 16 conns, ops/s |") {
				return l
			}
		}
		t.Fatalf("no (a) row in:\n%s", report)
		return ""
	}
	// 0.73x the null server now against 0.80x then: 0.91x normalized, although the absolute
	// figure halved with the machine.
	if r := row(run("cpu A", 365, 500)); !strings.Contains(r, "| 0.91x | ok |") {
		t.Errorf("same CPU, 0.91x normalized: %s", r)
	}
	if r := row(run("cpu A", 340, 500)); !strings.Contains(r, "| 0.85x | BELOW 0.9x |") {
		t.Errorf("same CPU, 0.85x normalized: %s", r)
	}
	rep := run("cpu B", 360, 500)
	if r := row(rep); !strings.HasSuffix(r, "| none (other CPU) |") {
		t.Errorf("other CPU must give no verdict: %s", r)
	}
	if !strings.Contains(rep, "baseline/remeasure.sh") {
		t.Errorf("other CPU: the report does not say how to measure the baseline again:\n%s", rep)
	}
}

// TestPerPairFigures: a client's runs are compared with the raw driver's run of the same round
// (a round the raw driver missed counts for the client's own CPU per pair only), and each figure
// is the median over rounds.
func TestPerPairFigures(t *testing.T) {
	raw := []*clientRun{
		{round: 0, pairsPerSec: 1000, clientCPU: 1.0}, // 1,000 µs per pair
		{round: 1, pairsPerSec: 500, clientCPU: 1.0},  // 2,000 µs: the machine slowed down
		{round: 2, pairsPerSec: 1000, clientCPU: 1.0},
	}
	c := []*clientRun{
		{round: 0, pairsPerSec: 800, clientCPU: 1.2},  // 1,500 µs: 0.8x pairs, 1.5x CPU
		{round: 1, pairsPerSec: 400, clientCPU: 1.2},  // 3,000 µs: 0.8x, 1.5x
		{round: 3, pairsPerSec: 1000, clientCPU: 0.5}, // no raw run that round: 500 µs, no ratio
	}
	cpu, pairs, cpuRatio := perPairFigures(c, raw)
	if cpu != 1500 || pairs != 0.8 || cpuRatio != 1.5 {
		t.Fatalf("got %v µs per pair, %vx pairs, %vx CPU per pair; want 1500, 0.8, 1.5", cpu, pairs, cpuRatio)
	}
	if _, p, r := perPairFigures(c, nil); p != 0 || r != 0 {
		t.Fatalf("without a raw driver: %v, %v; want no ratios", p, r)
	}
}

// TestRoundRatios: run k of one system over run k of the other, and their median; nothing when
// the runs cannot be paired.
func TestRoundRatios(t *testing.T) {
	for _, c := range []struct {
		a, c []float64
		want string
	}{
		{[]float64{2.3e6, 3.2e6, 2.2e6}, []float64{2.5e6, 3.4e6, 2.9e6}, "median 0.92x (rounds 0.92, 0.94, 0.76)"},
		{[]float64{1, 3}, []float64{2, 2}, "median 1.00x (rounds 0.50, 1.50)"},
		{[]float64{1, 2}, []float64{1}, ""},
		{nil, nil, ""},
		{[]float64{1, 0}, []float64{1, 1}, ""},
	} {
		if got := roundRatios(c.a, c.c); got != c.want {
			t.Errorf("roundRatios(%v, %v) = %q, want %q", c.a, c.c, got, c.want)
		}
	}
}
