package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
)

// The report's sections for the cluster, failover, clients and metrics workloads, their
// targets, and the comparison with an earlier run (-baseline).

func (b *bench) markdownMore() string {
	o := b.o
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	if o.workloads["metrics"] {
		w("### Metrics off and on: (a) at %d connections, depth %d%s\n\n", o.metricsConns, o.depth, b.loadNote("metrics"))
		if r := b.find("ticketing", "a_metrics", 0); r != nil && r.Skipped != "" {
			w("Not measured: %s. The workload runs as soon as the server has a setting for it (or with `-metrics-env K=V`).\n\n", r.Skipped)
		} else {
			w("| metrics | ops/s | runs | p99 µs | server RSS max KiB (anon + file) | server CPU | setting | note |\n|---|---:|---|---:|---:|---:|---|---|\n")
			for _, m := range []string{"off", "on"} {
				for _, r := range b.records {
					if r.Workload == "a_metrics" && r.Metrics == m {
						w("| %s | %.0f | %s | %.1f | %d (%d + %d) | %.2f | `%s` | %s |\n", m, r.OpsPerSec, kopsList(r.Runs), r.P99us, r.ServerRSSMaxKB, r.RSSAnonKB, r.RSSFileKB, r.ServerCPU, r.Setting, r.Note)
					}
				}
			}
			w("\n")
		}
	}
	if o.workloads["clients"] {
		w("%s", b.clientsMarkdown())
	}
	if o.workloads["cluster"] {
		w("### Cluster: %d-member Ticketing beside %d-member etcd%s\n\n", o.clusterNodes, o.clusterNodes, b.loadNote("cluster"))
		w("Throughput: %d connections x depth %d, acquire+release pairs on %d keys (a pair = 2 ops).\n\n", o.clusterConns, o.depth, o.keys)
		w("| system | ops/s | runs | p50 µs | p99 µs | leader RSS max KiB | CPU, all members | harness CPU | errors |\n|---|---:|---|---:|---:|---:|---:|---:|---:|\n")
		for _, sys := range b.clusterSystems() {
			if r := b.find(sys, "cluster_pipelined", 0); r != nil && r.Skipped != "" {
				w("| %s | — | %s | | | | | | |\n", sys, r.Skipped)
			} else if r != nil {
				w("| %s | %.0f | %s | %.1f | %.1f | %d | %.2f | %.2f | %d |\n", sys, r.OpsPerSec, kopsList(r.Runs), r.P50us, r.P99us, r.ServerRSSMaxKB, r.ServerCPU, r.HarnessCPU, r.Errors)
			}
		}
		w("\nOne request at a time on one connection (acquire and release each timed; the acquire columns count acquires alone):\n\n")
		w("| system | acquire p50 µs | acquire p99 µs | acquire p999 µs | p50 µs | p99 µs | ops/s | acquire p50 of each run µs |\n|---|---:|---:|---:|---:|---:|---:|---|\n")
		for _, sys := range b.clusterSystems() {
			if r := b.find(sys, "cluster_latency", 0); r != nil && r.Skipped == "" {
				w("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f | %s |\n", sys, r.AcqP50us, r.AcqP99us, r.AcqP999us, r.P50us, r.P99us, r.OpsPerSec, floatList(r.Runs))
			}
		}
		w("\n")
		for _, sys := range b.clusterSystems() {
			if r := b.find(sys, "cluster_pipelined", 0); r != nil {
				w("- %s: %s.\n", sys, r.Note)
			}
		}
		w("\n")
	}
	if o.workloads["failover"] {
		w("### Failover: SIGKILL of the leader -> the looping client's next successful acquire%s\n\n", b.loadNote("failover"))
		w("| system | trials | median ms | min ms | max ms | each trial ms | no success within 30 s |\n|---|---:|---:|---:|---:|---|---:|\n")
		for _, sys := range b.clusterSystems() {
			if r := b.find(sys, "cluster_failover", 0); r != nil {
				w("| %s | %d | %.0f | %.0f | %.0f | %s | %d |\n", sys, len(r.FailoverMs), r.FailoverMedianMs, r.FailoverMinMs, r.FailoverMaxMs, floatList(r.FailoverMs), r.FailoverFailed)
			}
		}
		w("\n")
		for _, sys := range b.clusterSystems() {
			if r := b.find(sys, "cluster_failover", 0); r != nil {
				w("- %s: %s.\n", sys, r.Note)
			}
		}
		w("\n")
	}
	if o.workloads["faults"] {
		w("### Failover by fault kind, official clients with default options%s\n\n", b.loadNote("faults"))
		w("From the fault on the leader to the looping client's first successful acquire after it (bench/faults.go): kill = SIGKILL; stop = SIGSTOP held %v, then SIGCONT; cut = every packet from or to the leader's address dropped for %v.\n\n", faultFreeze, faultFreeze)
		w("| fault | client | trials | median ms | min ms | max ms | each trial ms | no success within %v |\n|---|---|---:|---:|---:|---:|---|---:|\n", faultBound)
		for _, r := range b.records {
			if r.Workload != "failover_fault" {
				continue
			}
			if r.Skipped != "" {
				w("| %s | %s | skipped: %s | | | | | |\n", r.Fault, r.Client, r.Skipped)
				continue
			}
			w("| %s | %s | %d | %.0f | %.0f | %.0f | %s | %d |\n", r.Fault, r.Client, len(r.FailoverMs), r.FailoverMedianMs, r.FailoverMinMs, r.FailoverMaxMs, floatList(r.FailoverMs), r.FailoverFailed)
		}
		w("\n")
		for _, r := range b.records {
			if r.Workload == "failover_fault" && r.Note != "" {
				w("- %s/%s: %s.\n", r.Fault, r.Client, r.Note)
			}
		}
		w("\n")
	}
	return s.String()
}

// targetsMore are the target rows of the cluster, failover, clients and metrics workloads.
func (b *bench) targetsMore() string {
	o := b.o
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	if o.workloads["cluster"] {
		t, e := b.find("ticketing", "cluster_pipelined", 0), b.find("etcd", "cluster_pipelined", 0)
		if t != nil && e != nil {
			w("| cluster: Ticketing >= 10x etcd lock throughput (aim 20x) | %s (%.0f vs %.0f ops/s) | %s |\n", ratio(t.OpsPerSec, e.OpsPerSec), t.OpsPerSec, e.OpsPerSec, yesNo(t.OpsPerSec >= 10*e.OpsPerSec))
		}
		if t := b.find("ticketing", "cluster_latency", 0); t != nil {
			w("| cluster: acquire p50 <= 2 ms (one at a time) | %.2f ms | %s |\n", t.AcqP50us/1000, yesNo(t.AcqP50us > 0 && t.AcqP50us <= 2000))
			if e := b.find("etcd", "cluster_latency", 0); e != nil {
				w("| cluster: acquire p50 vs etcd (no target) | %.2f ms vs %.2f ms | |\n", t.AcqP50us/1000, e.AcqP50us/1000)
			}
		}
	}
	if o.workloads["failover"] {
		if t := b.find("ticketing", "cluster_failover", 0); t != nil {
			ok := t.FailoverFailed == 0 && len(t.FailoverMs) >= 7 && t.FailoverMedianMs <= 1500
			w("| failover: median of >= 7 trials <= 1.5 s | %.2f s (%d trials, %.2f-%.2f s) | %s |\n", t.FailoverMedianMs/1000, len(t.FailoverMs), t.FailoverMinMs/1000, t.FailoverMaxMs/1000, yesNo(ok))
			if e := b.find("etcd", "cluster_failover", 0); e != nil {
				w("| failover: vs etcd in this run (no target) | %.2f s vs %.2f s (etcd %.2f-%.2f s) | |\n", t.FailoverMedianMs/1000, e.FailoverMedianMs/1000, e.FailoverMinMs/1000, e.FailoverMaxMs/1000)
			}
		}
	}
	if o.workloads["faults"] {
		for _, r := range b.records {
			if r.Workload == "failover_fault" && r.Skipped == "" {
				ok := r.FailoverFailed == 0 && len(r.FailoverMs) >= 7 && r.FailoverMedianMs <= 1500
				w("| failover, %s of the leader, %s client: median of >= 7 trials <= 1.5 s | %.2f s (%d trials, %.2f-%.2f s) | %s |\n", r.Fault, r.Client, r.FailoverMedianMs/1000, len(r.FailoverMs), r.FailoverMinMs/1000, r.FailoverMaxMs/1000, yesNo(ok))
			}
		}
	}
	if o.workloads["clients"] {
		w("%s", b.clientTargets())
	}
	if o.workloads["metrics"] {
		var off, on *Record
		for _, r := range b.records {
			if r.Workload == "a_metrics" && r.Metrics == "off" {
				off = r
			}
			if r.Workload == "a_metrics" && r.Metrics == "on" {
				on = r
			}
		}
		if off != nil && on != nil && off.OpsPerSec > 0 {
			noise := 0.03
			for _, x := range off.Runs {
				noise = math.Max(noise, math.Abs(x/off.OpsPerSec-1))
			}
			rt := on.OpsPerSec / off.OpsPerSec
			w("| metrics: on within noise of off | %.2fx (noise: the off runs spread %.0f%% around their median) | %s |\n", rt, 100*noise, yesNo(rt >= 1-noise))
		} else {
			w("| metrics: on within noise of off | not measured (the server has no metrics setting) | |\n")
		}
	}
	return s.String()
}

// --- the earlier run ------------------------------------------------------------------------------

type runFile struct {
	Meta    *Meta     `json:"meta"`
	Records []*Record `json:"records"`
}

func findIn(rs []*Record, sys, workload string, conns int) *Record {
	for _, r := range rs {
		if r.System == sys && r.Workload == workload && (conns == 0 || r.Connections == conns) {
			return r
		}
	}
	return nil
}

// compareBaseline puts each Ticketing figure of this run beside the same figure of the earlier
// run in -baseline: as a ratio of the absolute figures, and as a ratio of "Ticketing / the
// reference system in the same run" (null server, Redis), which the machine's drift cancels out.
// Performance ratios are oriented so that >= 1 is as good or better (for latencies and memory:
// previous / now).
func (b *bench) compareBaseline() string {
	o := b.o
	if o.baseline == "" || !has(o.systems, "ticketing") {
		return ""
	}
	raw, err := os.ReadFile(o.baseline)
	if err != nil {
		return fmt.Sprintf("### Against the previous run\n\nNo baseline (%v).\n\n", err)
	}
	var prev runFile
	if err := json.Unmarshal(raw, &prev); err != nil || prev.Meta == nil {
		return fmt.Sprintf("### Against the previous run\n\nBaseline %s unreadable: %v.\n\n", o.baseline, err)
	}
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	w("### Against the previous run (baseline: %s, commit %s, %s, %s)\n\n", o.baseline, prev.Meta.Commit, prev.Meta.Started, prev.Meta.CPUModel)
	sameCPU := prev.Meta.CPUModel == b.meta.CPUModel
	if !sameCPU {
		w("**The baseline ran on another CPU** (%s; this run: %s): no column below is a verdict. Even the normalized ratios do not carry across machines (Ticketing spends more of its time computing than the null server, which is nearly all system calls, so the ratio of the two moves with the CPU); measure the baseline again on this machine (`baseline/remeasure.sh`) and compare with a run made beside it.\n\n", prev.Meta.CPUModel, b.meta.CPUModel)
	}
	w("| figure | previous | now | now vs previous | reference | Ticketing / reference, previous | same, now | normalized | verdict (>= 0.9x) |\n|---|---:|---:|---:|---|---:|---:|---:|---|\n")
	type fig struct {
		name             string
		workload         string
		conns            int
		get              func(*Record) float64
		lowerIsBetter    bool
		refs             []string
		unit             string
		refGet           func(*Record) float64 // default get
		refLowerIsBetter bool
	}
	ops := func(r *Record) float64 { return r.OpsPerSec }
	figs := []fig{}
	for _, c := range o.conns {
		figs = append(figs, fig{name: fmt.Sprintf("(a) %d conns, ops/s", c), workload: "a_pipelined", conns: c, get: ops, refs: []string{"null", "redis"}, unit: "%.0f"})
	}
	if len(o.conns) > 0 {
		maxC := 0
		for _, c := range o.conns {
			maxC = max(maxC, c)
		}
		figs = append(figs, fig{name: fmt.Sprintf("(a) %d conns, peak RSS KiB", maxC), workload: "a_pipelined", conns: maxC,
			get: func(r *Record) float64 { return float64(r.ServerRSSMaxKB) }, lowerIsBetter: true, refs: []string{"null"}, unit: "%.0f"})
		figs = append(figs, fig{name: fmt.Sprintf("(a) %d conns, peak anonymous RSS KiB (heap)", maxC), workload: "a_pipelined", conns: maxC,
			get: func(r *Record) float64 { return float64(r.RSSAnonKB) }, lowerIsBetter: true, unit: "%.0f"})
	}
	figs = append(figs,
		fig{name: "(b) p50 µs", workload: "b_latency", get: func(r *Record) float64 { return r.P50us }, lowerIsBetter: true, refs: []string{"null", "redis"}, unit: "%.1f"},
		fig{name: "(b) p99 µs", workload: "b_latency", get: func(r *Record) float64 { return r.P99us }, lowerIsBetter: true, refs: []string{"null", "redis"}, unit: "%.1f"},
		fig{name: "(c) hand-offs/s", workload: "c_contended", get: func(r *Record) float64 { return r.HandoffsPerSec }, refs: []string{"redis"}, unit: "%.0f"},
		fig{name: "(c) min/max acquisitions per worker", workload: "c_contended", get: func(r *Record) float64 { return r.AcqMinMax }, unit: "%.2f"},
		fig{name: "(d) bytes per idle lock", workload: "d_held_idle", get: func(r *Record) float64 { return r.BytesPerLock }, lowerIsBetter: true, refs: []string{"redis"}, unit: "%.0f"},
		fig{name: "(d) RSS with the idle locks KiB", workload: "d_held_idle", get: func(r *Record) float64 { return float64(r.ServerRSSKB) }, lowerIsBetter: true, refs: []string{"redis"}, unit: "%.0f"},
	)
	perf := func(now, before float64, lower bool) float64 {
		if now <= 0 || before <= 0 {
			return 0
		}
		if lower {
			return before / now
		}
		return now / before
	}
	for _, f := range figs {
		tn, tp := b.find("ticketing", f.workload, f.conns), findIn(prev.Records, "ticketing", f.workload, f.conns)
		if tn == nil || tp == nil || f.get(tn) <= 0 || f.get(tp) <= 0 {
			continue
		}
		if tn.Pipeline != tp.Pipeline || tn.Keys != tp.Keys || tn.HeldLocks != tp.HeldLocks || tn.Workers != tp.Workers {
			w("| %s | | | | | | | | not comparable: other parameters (depth, keys, locks held or workers) |\n", f.name)
			continue
		}
		now, before := f.get(tn), f.get(tp)
		raw := perf(now, before, f.lowerIsBetter)
		printed := false
		for _, ref := range f.refs {
			rn, rp := b.find(ref, f.workload, f.conns), findIn(prev.Records, ref, f.workload, f.conns)
			if rn == nil || rp == nil || f.get(rn) <= 0 || f.get(rp) <= 0 {
				continue
			}
			// Ticketing relative to ref, oriented so that higher is better for Ticketing.
			relPrev := perf(before, f.get(rp), f.lowerIsBetter)
			relNow := perf(now, f.get(rn), f.lowerIsBetter)
			norm := relNow / relPrev
			w("| %s | "+f.unit+" | "+f.unit+" | %.2fx | %s | %.2fx | %.2fx | %.2fx | %s |\n", f.name, before, now, raw, ref, relPrev, relNow, norm, verdict(norm, sameCPU))
			printed = true
		}
		if !printed {
			w("| %s | "+f.unit+" | "+f.unit+" | %.2fx | — | | | | %s |\n", f.name, before, now, raw, verdict(raw, sameCPU))
		}
	}
	w("\n\"now vs previous\" and \"normalized\" are performance ratios: >= 1.00x is as good or better (for latencies and memory, previous / now). \"Ticketing / reference\" is Ticketing's advantage over the reference system within one run (ops/s: Ticketing / reference; latencies and memory: reference / Ticketing); \"normalized\" divides this run's advantage by the previous run's, so drift of the machine between the runs cancels out.\n\n")
	return s.String()
}

func verdict(x float64, sameCPU bool) string {
	if !sameCPU {
		return "none (other CPU)"
	}
	if x >= 0.9 {
		return "ok"
	}
	return "BELOW 0.9x"
}
