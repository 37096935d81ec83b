package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Record is one (system, workload, parameters) result in results/latest.json.
type Record struct {
	System         string  `json:"system"`
	Workload       string  `json:"workload"`
	Connections    int     `json:"connections"`
	Pipeline       int     `json:"pipeline"`
	Keys           int     `json:"keys"`
	OpsPerSec      float64 `json:"ops_per_sec"`
	P50us          float64 `json:"p50_us"`
	P99us          float64 `json:"p99_us"`
	P999us         float64 `json:"p999_us"`
	ServerRSSMaxKB int64   `json:"server_rss_max_kb"`

	RSSAnonKB   int64     `json:"server_rss_anon_kb,omitempty"` // at the largest sampled RSS: anonymous memory
	RSSFileKB   int64     `json:"server_rss_file_kb,omitempty"` // and file-backed pages (the mapped binary)
	OpsCounting string    `json:"ops_counting,omitempty"`
	Runs        []float64 `json:"runs,omitempty"` // every run's RunsMetric; (a): ops_per_sec is their median, else the record is the median run
	RunsMetric  string    `json:"runs_metric,omitempty"`
	Ops         int64     `json:"ops,omitempty"`
	Errors      int64     `json:"errors"`
	WindowS     float64   `json:"window_s,omitempty"`
	MaxUs       float64   `json:"max_us,omitempty"`
	PingP50us   float64   `json:"ping_p50_us,omitempty"`       // (a) at one connection: median over runs of one PING's round trip (floor.go)
	ServerCPU   float64   `json:"server_cpu_cores,omitempty"`  // server CPU over the window, in cores
	HarnessCPU  float64   `json:"harness_cpu_cores,omitempty"` // load generator CPU, in cores

	Workers        int     `json:"workers,omitempty"` // (c)
	HandoffsPerSec float64 `json:"handoffs_per_sec,omitempty"`
	WaitP99us      float64 `json:"wait_p99_us,omitempty"`
	WaitMaxUs      float64 `json:"wait_max_us,omitempty"`
	AcqMin         int64   `json:"acquisitions_min,omitempty"`
	AcqMax         int64   `json:"acquisitions_max,omitempty"`
	AcqMinMax      float64 `json:"acquisitions_min_max_ratio,omitempty"`

	HeldLocks    int64   `json:"held_locks,omitempty"` // (d)
	HeldSeconds  float64 `json:"held_seconds,omitempty"`
	ServerRSSKB  int64   `json:"server_rss_kb,omitempty"`
	RSSBeforeKB  int64   `json:"server_rss_before_kb,omitempty"`
	IdleRSSKB    int64   `json:"server_rss_at_start_kb,omitempty"`
	BytesPerLock float64 `json:"rss_bytes_per_lock,omitempty"`
	BytesPerConn float64 `json:"rss_bytes_per_conn,omitempty"` // (e)

	RedisBenchmarkOpsPerSec float64   `json:"redis_benchmark_ops_per_sec,omitempty"` // fairness (median)
	RedisBenchmarkRuns      []float64 `json:"redis_benchmark_runs_ops_per_sec,omitempty"`
	HarnessVsRedisBenchmark float64   `json:"harness_vs_redis_benchmark,omitempty"`

	Nodes     int     `json:"nodes,omitempty"`          // cluster workloads: members
	AcqP50us  float64 `json:"acquire_p50_us,omitempty"` // one-at-a-time workloads: acquires alone
	AcqP99us  float64 `json:"acquire_p99_us,omitempty"`
	AcqP999us float64 `json:"acquire_p999_us,omitempty"`

	FailoverMs       []float64 `json:"failover_ms,omitempty"` // every trial; -1: no success within the bound
	FailoverMedianMs float64   `json:"failover_median_ms,omitempty"`
	FailoverMinMs    float64   `json:"failover_min_ms,omitempty"`
	FailoverMaxMs    float64   `json:"failover_max_ms,omitempty"`
	FailoverFailed   int       `json:"failover_failed,omitempty"`

	Client      string  `json:"client,omitempty"` // per-client throughput; failover_fault: the client
	Fault       string  `json:"fault,omitempty"`  // failover_fault: kill or stop
	InFlight    int     `json:"in_flight,omitempty"`
	PairsPerSec float64 `json:"pairs_per_sec,omitempty"`
	ClientCPU   float64 `json:"client_cpu_cores,omitempty"`
	// Client CPU per pair (median over runs), and against the raw driver the median over rounds
	// of each round's ratio (see perPairFigures).
	CPUPerPairUS    float64 `json:"client_cpu_us_per_pair,omitempty"`
	VsRawPairs      float64 `json:"vs_raw_pairs_per_sec_per_round,omitempty"`
	VsRawCPUPerPair float64 `json:"vs_raw_client_cpu_per_pair_per_round,omitempty"`
	// The clients workload (client_callers): the registry row, its caller count, its server CPU
	// per pair, and the same per-round ratios against its incumbent (on Redis).
	Label                 string   `json:"label,omitempty"`
	Callers               int      `json:"callers,omitempty"`
	Incumbent             string   `json:"incumbent,omitempty"`
	Targets               []string `json:"targets,omitempty"`
	ServerCPUPerPairUS    float64  `json:"server_cpu_us_per_pair,omitempty"`
	VsIncumbentPairs      float64  `json:"vs_incumbent_pairs_per_sec_per_round,omitempty"`
	VsIncumbentCPUPerPair float64  `json:"vs_incumbent_client_cpu_per_pair_per_round,omitempty"`
	FailedRuns            int      `json:"failed_runs,omitempty"`
	Skipped               string   `json:"skipped,omitempty"` // why a figure is missing

	Metrics string `json:"metrics,omitempty"` // metrics workload: on or off
	Setting string `json:"setting,omitempty"` // the server environment of the point

	Note string `json:"note,omitempty"`
}

// Meta describes the run.
type Meta struct {
	Started      string   `json:"started"`
	Finished     string   `json:"finished"`
	Host         string   `json:"host"`
	CPUs         int      `json:"cpus"`
	CPUModel     string   `json:"cpu_model"`
	GoVersion    string   `json:"go_version"`
	Commit       string   `json:"ticketing_commit"`
	Versions     []string `json:"versions"`
	LoadAvgStart string   `json:"loadavg_start"`
	LoadAvgEnd   string   `json:"loadavg_end"`
	Command      string   `json:"command"`
	Duration     string   `json:"duration_per_point"`
	Warmup       string   `json:"warmup_per_point"`
	Repeat       int      `json:"repeat"`
	Note         string   `json:"note"`
	// LoadAvgAt: the load average when each workload started (others' work shows here).
	LoadAvgAt map[string]string `json:"loadavg_at_workload_start,omitempty"`
	Baseline  string            `json:"baseline,omitempty"` // the earlier run compared with
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return ""
}

func firstLine(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return ""
	}
	l, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return l
}

func collectMeta(o *options) *Meta {
	host, _ := os.Hostname()
	m := &Meta{
		Started: time.Now().UTC().Format(time.RFC3339), Host: host, CPUs: runtime.NumCPU(),
		GoVersion: runtime.Version(), LoadAvgStart: loadAvg(), Command: strings.Join(os.Args, " "),
		Duration: o.duration.String(), Warmup: o.warmup.String(), Repeat: o.repeat,
		Note: "the load generator runs on the same machine and shares its CPUs with the server under test",
	}
	if o.serverCPUs != "" {
		m.Note = "the load generator runs on the same machine; the servers under test ran on CPUs " + o.serverCPUs + " only (taskset), the load generator on the CPUs it was started on"
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		cpus := 0
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") && m.CPUModel == "" {
				_, v, _ := strings.Cut(l, ":")
				m.CPUModel = strings.TrimSpace(v)
			}
			if strings.HasPrefix(l, "processor") {
				cpus++
			}
		}
		if cpus > 0 {
			// The machine's: runtime.NumCPU counts only those the harness may run on (taskset).
			m.CPUs = cpus
		}
	}
	m.Commit = firstLine("git", "-C", o.repo, "rev-parse", "--short", "HEAD")
	if st := firstLine("git", "-C", o.repo, "status", "--porcelain", "--untracked-files=no"); st != "" && m.Commit != "" {
		m.Commit += "+dirty"
	}
	if has(o.systems, "redis") {
		m.Versions = append(m.Versions, firstLine("redis-server", "--version"))
	}
	if has(o.systems, "etcd") {
		m.Versions = append(m.Versions, firstLine("etcd", "--version"))
	}
	return m
}

func (b *bench) find(sys, workload string, conns int) *Record {
	for _, r := range b.records {
		if r.System == sys && r.Workload == workload && (conns == 0 || r.Connections == conns) {
			return r
		}
	}
	return nil
}

func ratio(a, c float64) string {
	if a <= 0 || c <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", a/c)
}

// roundRatios is "median M (r1, r2, ...)" of a's runs over c's, round by round (the runs of a
// point are interleaved across systems, so run k of each is the same round), or "" unless both
// have the same number of runs. A 2-vCPU machine's throughput moves by a third or more between
// rounds, for every system alike; a ratio of medians can then pair a fast round with a slow one.
func roundRatios(a, c []float64) string {
	if len(a) == 0 || len(a) != len(c) {
		return ""
	}
	rs := make([]float64, 0, len(a))
	for k := range a {
		if a[k] <= 0 || c[k] <= 0 {
			return ""
		}
		rs = append(rs, a[k]/c[k])
	}
	each := make([]string, len(rs))
	for k, x := range rs {
		each[k] = fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("median %.2fx (rounds %s)", medianExact(rs), strings.Join(each, ", "))
}

func yesNo(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func kops(x float64) string {
	switch {
	case x >= 1e6:
		return fmt.Sprintf("%.2fM", x/1e6)
	case x >= 1e3:
		return fmt.Sprintf("%.1fk", x/1e3)
	}
	return fmt.Sprintf("%.0f", x)
}

func floatList(v []float64) string {
	var out []string
	for _, x := range v {
		out = append(out, fmt.Sprintf("%.0f", x))
	}
	return strings.Join(out, " ")
}

func kopsList(v []float64) string {
	var out []string
	for _, x := range v {
		out = append(out, kops(x))
	}
	return strings.Join(out, " ")
}

// markdown renders the run as Markdown tables (printed, and written to latest.md).
func (b *bench) markdown() string {
	o := b.o
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	w("Run %s .. %s on %s (%d CPUs, %s), load average %s at start, %s at end; %s per point after %s warm-up",
		b.meta.Started, b.meta.Finished, b.meta.Host, b.meta.CPUs, b.meta.CPUModel, b.meta.LoadAvgStart, b.meta.LoadAvgEnd, b.meta.Duration, b.meta.Warmup)
	if o.repeat > 1 {
		w(", every point run %d times interleaved across systems (medians reported)", o.repeat)
	}
	if o.fresh {
		w(", each point on a freshly started server process")
	}
	if o.serverCPUs != "" {
		w(". The servers under test ran on CPUs %s only (taskset); the load generator on the CPUs it was started on.\n\n", o.serverCPUs)
	} else {
		w(". The load generator shares the CPUs with the server under test.\n\n")
	}
	if o.keepAwake {
		w("Every CPU was kept awake (-keep-awake: one busy loop per CPU at nice 19) for the whole run.\n\n")
	}

	if o.workloads["a"] {
		w("### (a) Uncontended, pipelined: acquire+release pairs on %d keys, depth %d (a pair = 2 ops)%s\n\n", o.keys, o.depth, b.loadNote("a"))
		w("| system | conns | ops/s | runs | p50 µs | p99 µs | p999 µs | server RSS max KiB (anon + file) | server CPU | harness CPU | errors |\n")
		w("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, conns := range o.conns {
			for _, sys := range o.systems {
				if r := b.find(sys, "a_pipelined", conns); r != nil {
					w("| %s | %d | %.0f | %s | %.1f | %.1f | %.1f | %d (%d + %d) | %.2f | %.2f | %d |\n", sys, conns, r.OpsPerSec,
						kopsList(r.Runs), r.P50us, r.P99us, r.P999us, r.ServerRSSMaxKB, r.RSSAnonKB, r.RSSFileKB, r.ServerCPU, r.HarnessCPU, r.Errors)
				}
			}
		}
		w("\netcd's Mutex cannot pipeline: its \"depth\" is that many goroutines per client, each blocking on Lock/Unlock. Latencies under pipelining include the queueing of the whole window.\n\n")
	}
	if o.workloads["fair"] {
		w("### Harness fairness: the same Redis command as redis-benchmark (`SET key:__rand_int__ tok NX PX %d`, -P %d, -r %d)%s\n\n", leaseMs, o.depth, o.keys, b.loadNote("fair"))
		w("| conns | harness ops/s | runs | redis-benchmark ops/s | runs | harness / redis-benchmark |\n|---:|---:|---|---:|---|---:|\n")
		for _, conns := range o.fairConns {
			if r := b.find("redis", "fair_setnx", conns); r != nil {
				w("| %d | %.0f | %s | %.0f | %s | %.2f |\n", conns, r.OpsPerSec, kopsList(r.Runs), r.RedisBenchmarkOpsPerSec, kopsList(r.RedisBenchmarkRuns), r.HarnessVsRedisBenchmark)
			}
		}
		w("\n")
	}
	if o.workloads["b"] {
		w("### (b) Uncontended, one request at a time (1 connection; acquire and release each timed)%s\n\n", b.loadNote("b"))
		w("| system | ops/s | p50 µs | p99 µs | p999 µs | max µs | acquire p50 / p99 µs | p99 of each run µs |\n|---|---:|---:|---:|---:|---:|---:|---|\n")
		for _, sys := range o.systems {
			if r := b.find(sys, "b_latency", 0); r != nil {
				w("| %s | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f / %.1f | %s |\n", sys, r.OpsPerSec, r.P50us, r.P99us, r.P999us, r.MaxUs, r.AcqP50us, r.AcqP99us, floatList(r.Runs))
			}
		}
		if o.repeat > 1 {
			w("\nEach row is the run with the median p99 of %d.\n", o.repeat)
		}
		w("\n")
	}
	if o.workloads["c"] {
		w("### (c) Contended: %d workers on one key, release at once after each grant%s\n\n", o.workers, b.loadNote("c"))
		w("| system | acquisitions/s | hand-offs/s | hand-offs/s of each run | wait p50 µs | wait p99 µs | wait max µs | acquisitions per worker min / max | min/max | errors |\n|---|---:|---:|---|---:|---:|---:|---|---:|---:|\n")
		for _, sys := range o.systems {
			if r := b.find(sys, "c_contended", 0); r != nil {
				w("| %s | %.0f | %.0f | %s | %.1f | %.1f | %.1f | %d / %d | %.2f | %d |\n", sys, r.OpsPerSec, r.HandoffsPerSec, kopsList(r.Runs), r.P50us, r.WaitP99us, r.WaitMaxUs, r.AcqMin, r.AcqMax, r.AcqMinMax, r.Errors)
			}
		}
		w("\n")
		if o.repeat > 1 {
			w("Each row is the run with the median hand-offs/s of %d. ", o.repeat)
		}
		w("A hand-off is a grant to a different worker than the previous holder. A Redis worker that releases and at once wins `SET NX` again counts as an acquisition, not a hand-off. Waits run from the first attempt to the grant.\n\n")
	}
	if o.workloads["d"] {
		w("### (d) Memory: %d idle locks held (lease %d s)%s\n\n", o.held, idleLeaseMs/1000, b.loadNote("d"))
		w("| system | locks held | taken in s | RSS at start KiB | RSS before KiB | RSS held KiB | peak KiB | bytes/lock |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, sys := range o.systems {
			if r := b.find(sys, "d_held_idle", 0); r != nil {
				w("| %s | %d | %.1f | %d | %d | %d | %d | %.0f |\n", sys, r.HeldLocks, r.HeldSeconds, r.IdleRSSKB, r.RSSBeforeKB, r.ServerRSSKB, r.ServerRSSMaxKB, r.BytesPerLock)
			}
		}
		w("\nPeak RSS during (a) is the `server RSS max` column of (a).\n\n")
	}
	if o.workloads["e"] {
		w("### (e) Memory: %d idle client connections%s\n\n", o.idleConns, b.loadNote("e"))
		w("| system | connections | RSS before KiB | RSS with them KiB | bytes/connection |\n|---|---:|---:|---:|---:|\n")
		for _, sys := range o.systems {
			if r := b.find(sys, "e_idle_conns", 0); r != nil {
				w("| %s | %d | %d | %d | %.0f |\n", sys, r.Connections, r.RSSBeforeKB, r.ServerRSSKB, r.BytesPerConn)
			}
		}
		w("\nTicketing: each connection completed its handshake (a session each); Redis: each sent `PING`.\n\n")
	}
	w("%s", b.markdownMore())
	w("%s", b.targets())
	w("%s", b.compareBaseline())
	return s.String()
}

// loadNote is " (load average a b c at its start)" for workload wl.
func (b *bench) loadNote(wl string) string {
	if la := b.meta.LoadAvgAt[wl]; la != "" {
		return " — load average " + la + " at its start"
	}
	return ""
}

// targets compares Ticketing with the others, as issue 3 asks.
func (b *bench) targets() string {
	o := b.o
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	if !has(o.systems, "ticketing") {
		return ""
	}
	w("### Ratios and targets (from this run)\n\n| target | figure | result |\n|---|---|---|\n")
	if o.workloads["a"] {
		for _, conns := range o.conns {
			t := b.find("ticketing", "a_pipelined", conns)
			if t == nil {
				continue
			}
			if r := b.find("redis", "a_pipelined", conns); r != nil {
				w("| (a) %d conns: Ticketing >= 2.0x Redis | %s | %s |\n", conns, ratio(t.OpsPerSec, r.OpsPerSec), yesNo(t.OpsPerSec >= 2*r.OpsPerSec))
			}
			if r := b.find("null", "a_pipelined", conns); r != nil {
				w("| (a) %d conns: Ticketing >= 0.8x null server | %s | %s |\n", conns, ratio(t.OpsPerSec, r.OpsPerSec), yesNo(t.OpsPerSec >= 0.8*r.OpsPerSec))
			}
			if r := b.find("etcd", "a_pipelined", conns); r != nil {
				w("| (a) %d conns: Ticketing vs etcd (no target) | %s | |\n", conns, ratio(t.OpsPerSec, r.OpsPerSec))
			}
			if r := b.find("prev", "a_pipelined", conns); r != nil {
				w("| (a) %d conns: Ticketing >= 0.95x the server before sessions (prev: %s) | %s | %s |\n", conns, o.prevLabel, ratio(t.OpsPerSec, r.OpsPerSec), yesNo(t.OpsPerSec >= 0.95*r.OpsPerSec))
			}
			for _, sys := range []string{"prev", "null"} {
				if r := b.find(sys, "a_pipelined", conns); r != nil {
					if s := roundRatios(t.Runs, r.Runs); s != "" {
						w("| (a) %d conns: Ticketing against %s round by round (no target: the machine's drift between rounds cancels) | %s | |\n", conns, sys, s)
					}
				}
			}
			w("| (a) %d conns: 1,000,000 ops/s headline | %.0f ops/s (%.0f%% of it) | %s |\n", conns, t.OpsPerSec, t.OpsPerSec/1e4, yesNo(t.OpsPerSec >= 1e6))
			if conns == 1 {
				for _, sys := range o.systems {
					if r := b.find(sys, "a_pipelined", 1); r != nil && r.PingP50us > 0 {
						w("| (a) 1 conn: %s against its round-trip bound (depth / one PING's round trip, %.1f µs: %.0f ops/s) (no target) | %.0f µs per window of %d, %.2fx the bound | |\n",
							sys, r.PingP50us, float64(o.depth)/r.PingP50us*1e6, float64(o.depth)/r.OpsPerSec*1e6, o.depth, r.OpsPerSec*r.PingP50us/1e6/float64(o.depth))
					}
				}
			}
		}
		maxC := o.conns[len(o.conns)-1]
		for _, c := range o.conns {
			maxC = max(maxC, c)
		}
		if t := b.find("ticketing", "a_pipelined", maxC); t != nil {
			w("| (a) %d conns: peak RSS < 10 MB | %d KiB (%.1f MB) | %s |\n", maxC, t.ServerRSSMaxKB, float64(t.ServerRSSMaxKB)*1024/1e6, yesNo(float64(t.ServerRSSMaxKB)*1024 < 10e6))
			w("| (a) %d conns: of that, anonymous (heap, stacks) + file-backed (the mapped binary) (no target) | %d + %d KiB | |\n", maxC, t.RSSAnonKB, t.RSSFileKB)
		}
	}
	if o.workloads["b"] {
		t, r := b.find("ticketing", "b_latency", 0), b.find("redis", "b_latency", 0)
		if t != nil && r != nil {
			w("| (b) Ticketing p99 <= Redis p99 | %.1f µs vs %.1f µs (%s) | %s |\n", t.P99us, r.P99us, ratio(t.P99us, r.P99us), yesNo(t.P99us <= r.P99us))
		}
		if e := b.find("etcd", "b_latency", 0); t != nil && e != nil {
			w("| (b) Ticketing vs etcd p99 (no target) | %.1f µs vs %.1f µs (%s) | |\n", t.P99us, e.P99us, ratio(t.P99us, e.P99us))
		}
	}
	if o.workloads["c"] {
		t, r := b.find("ticketing", "c_contended", 0), b.find("redis", "c_contended", 0)
		if t != nil && r != nil {
			w("| (c) hand-offs/s >= 10x Redis retry locking | %s | %s |\n", ratio(t.HandoffsPerSec, r.HandoffsPerSec), yesNo(t.HandoffsPerSec >= 10*r.HandoffsPerSec))
		}
		if e := b.find("etcd", "c_contended", 0); t != nil && e != nil {
			w("| (c) hand-offs/s vs etcd Mutex (no target) | %s | |\n", ratio(t.HandoffsPerSec, e.HandoffsPerSec))
		}
		if t != nil {
			w("| (c) min/max acquisitions per worker >= 0.9 | %.2f | %s |\n", t.AcqMinMax, yesNo(t.AcqMinMax >= 0.9))
		}
	}
	if o.workloads["d"] {
		t := b.find("ticketing", "d_held_idle", 0)
		for _, other := range []string{"redis", "etcd"} {
			if r := b.find(other, "d_held_idle", 0); t != nil && r != nil {
				w("| (d) RSS with idle locks vs %s (no target) | %d KiB vs %d KiB (%d vs %d locks) | |\n", other, t.ServerRSSKB, r.ServerRSSKB, t.HeldLocks, r.HeldLocks)
			}
		}
	}
	w("%s", b.targetsMore())
	w("\n")
	return s.String()
}

func (b *bench) report() error {
	o := b.o
	b.meta.Baseline = o.baseline
	md := b.markdown()
	fmt.Print(md)
	if err := os.WriteFile(filepath.Join(o.out, "latest.md"), []byte(md), 0o644); err != nil {
		return err
	}
	doc := struct {
		Meta    *Meta     `json:"meta"`
		Records []*Record `json:"records"`
	}{b.meta, b.records}
	js, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "latest.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if o.workloads["a"] {
		svg := b.chart()
		if err := os.WriteFile(filepath.Join(o.out, "throughput.svg"), []byte(svg), 0o644); err != nil {
			return err
		}
	}
	if o.workloads["a"] {
		logf("wrote %s, %s and %s", filepath.Join(o.out, "latest.json"), filepath.Join(o.out, "latest.md"), filepath.Join(o.out, "throughput.svg"))
	} else {
		logf("wrote %s and %s", filepath.Join(o.out, "latest.json"), filepath.Join(o.out, "latest.md"))
	}
	return nil
}
