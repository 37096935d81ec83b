// Command bench is Ticketing's load generator. One run starts every system itself on loopback
// (the repo's Ticketing server, Debian's redis-server and etcd, and a null server that answers
// Ticketing-sized frames with no lock table behind it), drives them all with the same generator,
// prints a table, and writes results/latest.json, results/latest.md and results/throughput.svg.
//
//	go run . [flags]                 (make bench / make bench-quick in the repo root)
//
// The null server is its own binary (cmd/nullserver), built by the harness like the Ticketing server.
//
// Workloads:
//
//	a  uncontended, pipelined: acquire+release pairs on distinct keys (a pair counts as 2 ops)
//	b  uncontended, one request at a time on one connection: latency percentiles
//	c  contended: W workers on one key: hand-offs per second, waits, fairness
//	d  memory: peak RSS during (a) (in the (a) records) and RSS with N idle locks held
//	fair  redis-benchmark beside the harness's own Redis driver, same command, -c and -P
//	cluster   3-node Ticketing beside 3-node etcd: pipelined throughput and one-at-a-time
//	          latency (acquires timed alone)
//	failover  SIGKILL the leader of a 3-node cluster under a looping client: time to its next
//	          successful acquire, several trials (Ticketing and etcd)
//	faults    the same with the official Go and Python clients, by fault kind: SIGKILL and
//	          SIGSTOP of the leader (bench/faults.go)
//	clients   acquire+release pairs/s of each client library (one client object, N concurrent
//	          callers) and of each ecosystem's incumbent lock library on Redis, against the
//	          harness's raw driver: the programs of clients.registry (bench/clients.go)
//	metrics   (a) with the server's metrics off and on, when the server has a metrics setting
//
// With -baseline, the report also compares every Ticketing figure with that earlier run.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	systems   []string
	workloads map[string]bool
	conns     []int
	fairConns []int
	depth     int
	keys      int
	duration  time.Duration
	warmup    time.Duration
	repeat    int
	workers   int
	held      int
	heldTime  time.Duration
	idleConns int
	tkBin     string
	tkEnv     []string
	nullBin   string
	prevBin   string // system "prev": an earlier Ticketing build that speaks the protocol before v1 final
	prevLabel string // what the report calls it (its commit)
	repo      string
	out       string
	pprofOut  string
	cpuprof   string
	fresh     bool
	drain     time.Duration

	clusterNodes   int
	clusterConns   int
	raftTiming     string
	raftStore      string
	failoverTrials int
	etcdAttempt    time.Duration

	clients            []string
	callers            []int
	clientRegistry     string
	clientBuildTimeout time.Duration
	clientBuildDir     string
	clientKeepAwake    bool
	keepAwake          bool
	clientDuration     time.Duration
	serverCPUs         string

	metricsEnv    string
	metricsOffEnv string
	metricsConns  int

	baseline string
}

func main() {
	var o options
	var systems, workloads, conns, fairConns string
	flag.StringVar(&systems, "systems", "ticketing,redis,etcd,null", "systems to run, comma-separated")
	flag.StringVar(&workloads, "workloads", "a,fair,b,c,d,e,cluster,failover,faults,clients,metrics", "workloads to run: a, fair, b, c, d, e, cluster, failover, faults, clients, metrics")
	flag.StringVar(&conns, "conns", "16,64", "connections for workload (a), comma-separated")
	flag.StringVar(&fairConns, "fair-conns", "16,64", "connections for the redis-benchmark comparison")
	flag.IntVar(&o.depth, "depth", 32, "pipeline depth (requests in flight per connection) for (a)")
	flag.IntVar(&o.keys, "keys", 10000, "distinct keys for (a)")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "measured time per point")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured time before each point")
	flag.DurationVar(&o.drain, "drain", 10*time.Second, "bound on finishing in-flight work after a point")
	flag.IntVar(&o.repeat, "repeat", 1, "runs of each (a) point (interleaved across systems); the median is reported")
	flag.IntVar(&o.workers, "workers", 32, "workers on the one key in (c)")
	flag.IntVar(&o.held, "held", 100000, "idle locks held in (d)")
	flag.IntVar(&o.idleConns, "idle-conns", 5000, "idle client connections opened in (e)")
	flag.DurationVar(&o.heldTime, "held-timeout", 60*time.Second, "bound on taking the idle locks of (d), per system")
	flag.StringVar(&o.tkBin, "ticketing-bin", "", "Ticketing server binary (default: build ../cmd/ticketing into OUT/tmp)")
	flag.StringVar(&o.nullBin, "null-bin", "", "null server binary (default: build ./cmd/nullserver into OUT/tmp)")
	flag.StringVar(&o.prevBin, "prev-bin", "", "system prev: a Ticketing server built from a commit before protocol v1 final (e.g. 19e2f99), driven with that protocol (no sessions, no ACK); workload a only")
	flag.StringVar(&o.prevLabel, "prev-label", "an earlier build", "system prev: what the report calls it (its commit)")
	var tkEnv string
	flag.StringVar(&tkEnv, "ticketing-env", "", "extra environment for the Ticketing server, comma-separated K=V (e.g. GOGC=50,TICKETING_MAX_OUTPUT=65536)")
	flag.StringVar(&o.repo, "repo", "..", "the Ticketing repository root (to build the server)")
	flag.StringVar(&o.out, "out", "results", "output directory")
	flag.StringVar(&o.pprofOut, "server-cpuprofile", "", "if set, the Ticketing binary serves net/http/pprof at $TICKETING_PPROF_ADDR (a profiling build, see profile.sh): write its CPU profile during (a) at the most connections here")
	flag.BoolVar(&o.fresh, "fresh", true, "start each system anew before every point (no state or memory carried over); false: one process per system for the whole run")
	flag.StringVar(&o.cpuprof, "cpuprofile", "", "write the harness's own CPU profile here")
	flag.IntVar(&o.clusterNodes, "cluster-nodes", 3, "members of the clusters in the cluster and failover workloads")
	flag.IntVar(&o.clusterConns, "cluster-conns", 16, "connections for the cluster throughput point (depth: -depth)")
	flag.StringVar(&o.raftTiming, "raft-timing", "1", "TICKETING_RAFT_TIMING of the Ticketing cluster (1: heartbeat = election timeout = 500 ms)")
	flag.StringVar(&o.raftStore, "raft-store", "", "TICKETING_RAFT_STORE of the Ticketing cluster (wal or bolt; empty: the server's default)")
	flag.IntVar(&o.failoverTrials, "failover-trials", 7, "leader kills per system in the failover workload")
	flag.DurationVar(&o.etcdAttempt, "etcd-attempt-timeout", 250*time.Millisecond, "failover: bound on each etcd Lock/Unlock call of the looping client")
	var clients, callers string
	flag.StringVar(&clients, "clients", "all", "clients workload: rows of -client-registry to run, comma-separated (all: every row)")
	flag.StringVar(&callers, "callers", "1,16", "clients workload: concurrent callers on the one client object, comma-separated (go-raw: pairs in flight on its one connection)")
	flag.StringVar(&o.clientRegistry, "client-registry", "clients.registry", "clients workload: the registry of benchmark programs")
	flag.BoolVar(&o.keepAwake, "keep-awake", false, "every workload of the run: -client-keep-awake's busy loops from the first server start to the end (BENCHMARKS.md: a quiet 1-connection point otherwise measures the wake-up of halted vCPUs as much as the server)")
	flag.BoolVar(&o.clientKeepAwake, "client-keep-awake", false, "clients workload: run one busy loop per CPU at the lowest priority (nice 19) while it measures, so that no vCPU is idle between round trips (BENCHMARKS.md: on a VM a quiet 1-caller run otherwise measures the wake-up of halted vCPUs)")
	flag.StringVar(&o.clientBuildDir, "client-build-dir", filepath.Join("results", "tmp", "progs"), "clients workload: where each folder's bench-build.sh builds (OUTDIR: this dir/FOLDER), kept between runs so that later builds are quick")
	flag.DurationVar(&o.clientBuildTimeout, "client-build-timeout", 10*time.Minute, "clients workload: bound on each folder's bench-build.sh")
	flag.DurationVar(&o.clientDuration, "client-duration", 0, "clients workload: counted time per run, after each program's 1 s of warm-up (default: -duration)")
	flag.StringVar(&o.serverCPUs, "server-cpus", "", "start every server under test on these CPUs only (taskset -c LIST, e.g. 0); run the harness itself under taskset on the others, so that the load generator and the server each have their own cores (default: both share every CPU)")
	flag.StringVar(&o.metricsEnv, "metrics-env", "auto", "metrics workload: server environment that turns metrics on, comma-separated K=V; auto: find a metrics setting in `ticketing server -h`; empty: skip")
	flag.StringVar(&o.metricsOffEnv, "metrics-off-env", "", "metrics workload: environment for metrics off (with an explicit -metrics-env; default: none)")
	flag.IntVar(&o.metricsConns, "metrics-conns", 16, "metrics workload: connections of the (a) point")
	flag.StringVar(&o.baseline, "baseline", "baseline/previous.json", "an earlier run's latest.json to compare Ticketing's figures with (empty: none)")
	flag.Parse()
	o.clients = splitList(clients)
	o.callers = intList("-callers", callers)
	if o.clientDuration <= 0 {
		o.clientDuration = o.duration
	}
	o.systems = splitList(systems)
	if o.serverCPUs != "" {
		if _, err := exec.LookPath("taskset"); err != nil {
			fatalf("-server-cpus needs taskset (util-linux): %v", err)
		}
		spawnCPUs = o.serverCPUs
	}
	o.tkEnv = splitList(tkEnv)
	o.workloads = map[string]bool{}
	for _, w := range splitList(workloads) {
		o.workloads[w] = true
	}
	o.conns = intList("-conns", conns)
	o.fairConns = intList("-fair-conns", fairConns)
	if o.repeat < 1 || o.depth < 1 || o.keys < 1 || o.workers < 1 {
		fatalf("-repeat, -depth, -keys and -workers must be at least 1")
	}
	if o.clusterNodes < 1 || o.clusterConns < 1 || o.failoverTrials < 1 || o.metricsConns < 1 {
		fatalf("-cluster-nodes, -cluster-conns, -failover-trials and -metrics-conns must be at least 1")
	}
	for _, c := range append(append(o.conns, o.fairConns...), o.clusterConns, o.metricsConns) {
		if c*o.depth > o.keys {
			fatalf("-conns %d x -depth %d exceeds -keys %d: the run would be contended", c, o.depth, o.keys)
		}
	}
	if o.cpuprof != "" {
		f, err := os.Create(o.cpuprof)
		if err != nil {
			fatalf("%v", err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := run(&o); err != nil {
		pprof.StopCPUProfile()
		fatalf("%v", err)
	}
}

func intList(name, s string) []int {
	var out []int
	for _, c := range splitList(s) {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			fatalf("bad %s entry %q", name, c)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		fatalf("%s is empty", name)
	}
	return out
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench %s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func run(o *options) error {
	for _, s := range o.systems {
		switch s {
		case "ticketing", "redis", "etcd", "null":
		case "prev":
			if o.prevBin == "" {
				return errors.New("system prev needs -prev-bin (a server built from a commit before protocol v1 final)")
			}
			for w := range o.workloads {
				if o.workloads[w] && w != "a" {
					return fmt.Errorf("system prev runs in workload a only (not %s)", w)
				}
			}
			o.prevBin, _ = filepath.Abs(o.prevBin)
		default:
			return fmt.Errorf("unknown system %q (want ticketing, redis, etcd, null, prev)", s)
		}
	}
	need := map[string][]string{"redis": {"redis-server", "redis-benchmark"}, "etcd": {"etcd"}}
	if o.workloads["clients"] {
		reg, err := loadRegistry(o.clientRegistry)
		if err != nil {
			return err
		}
		if _, err := selectClients(reg, o.clients); err != nil {
			return err
		}
	}
	for _, s := range o.systems {
		for _, bin := range need[s] {
			if _, err := exec.LookPath(bin); err != nil {
				return fmt.Errorf("%s not found: run bench/setup.sh (apt-get install redis-server etcd-server)", bin)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(o.out, "tmp"), 0o755); err != nil {
		return err
	}
	if has(o.systems, "ticketing") && o.tkBin == "" {
		o.tkBin = filepath.Join(o.out, "tmp", "ticketing")
		abs, _ := filepath.Abs(o.tkBin)
		logf("building the Ticketing server: toolchain/go-build.sh -o %s ./cmd/ticketing (in %s; the release build of make build)", abs, o.repo)
		repo, _ := filepath.Abs(o.repo)
		cmd := exec.Command("bash", filepath.Join(repo, "toolchain", "go-build.sh"), "-o", abs, "./cmd/ticketing")
		cmd.Dir = o.repo
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building the Ticketing server: %w", err)
		}
		o.tkBin = abs
	}
	if o.tkBin != "" {
		o.tkBin, _ = filepath.Abs(o.tkBin)
	}
	if has(o.systems, "null") && o.nullBin == "" {
		o.nullBin, _ = filepath.Abs(filepath.Join(o.out, "tmp", "nullserver"))
		cmd := exec.Command("go", "build", "-o", o.nullBin, "./cmd/nullserver")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building the null server (run the harness in bench/): %w", err)
		}
	}
	tmp, err := os.MkdirTemp("", "ticketing-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	meta := collectMeta(o)
	meta.LoadAvgAt = map[string]string{}
	b := &bench{o: o, tmp: tmp, servers: map[string]*server{}, meta: meta, idleRSS: map[string]int64{}}
	// Stop every server we started, also on Ctrl-C.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sig
		logf("%v: stopping the servers", s)
		b.stopAll()
		os.RemoveAll(tmp)
		os.Exit(130)
	}()
	defer b.stopAll()

	if o.workloads["clients"] && has(o.systems, "ticketing") {
		if err := b.buildClients(); err != nil { // before any measurement: builds take the CPU
			return err
		}
	}
	if o.keepAwake {
		_, stop, err := keepAwake(runtime.NumCPU())
		if err != nil {
			return err
		}
		defer stop()
	}
	if o.workloads["a"] || o.workloads["fair"] || o.workloads["b"] || o.workloads["c"] || o.workloads["d"] || o.workloads["e"] {
		for _, s := range o.systems {
			if err := b.start(s); err != nil {
				return err
			}
			srv := b.server(s)
			logf("%s: pid %d on %s", s, srv.pid(), srv.addr)
		}
	}

	if o.workloads["a"] {
		b.meta.LoadAvgAt["a"] = loadAvg()
		if err := b.workloadA(); err != nil {
			return err
		}
	}
	if o.workloads["fair"] && has(o.systems, "redis") {
		b.meta.LoadAvgAt["fair"] = loadAvg()
		if err := b.workloadFair(); err != nil {
			return err
		}
	}
	if o.workloads["b"] {
		b.meta.LoadAvgAt["b"] = loadAvg()
		if err := b.workloadB(); err != nil {
			return err
		}
	}
	if o.workloads["c"] {
		b.meta.LoadAvgAt["c"] = loadAvg()
		if err := b.workloadC(); err != nil {
			return err
		}
	}
	if o.workloads["d"] {
		b.meta.LoadAvgAt["d"] = loadAvg()
		if err := b.workloadD(); err != nil {
			return err
		}
	}
	if o.workloads["e"] {
		b.meta.LoadAvgAt["e"] = loadAvg()
		if err := b.workloadE(); err != nil {
			return err
		}
	}
	b.stopAll() // the single-node systems; the rest start their own
	if o.workloads["metrics"] && has(o.systems, "ticketing") {
		b.meta.LoadAvgAt["metrics"] = loadAvg()
		if err := b.workloadMetrics(); err != nil {
			return err
		}
	}
	if o.workloads["clients"] && has(o.systems, "ticketing") {
		b.meta.LoadAvgAt["clients"] = loadAvg()
		if err := b.workloadClients(); err != nil {
			return err
		}
	}
	if o.workloads["cluster"] {
		b.meta.LoadAvgAt["cluster"] = loadAvg()
		if err := b.workloadCluster(); err != nil {
			return err
		}
	}
	if o.workloads["failover"] {
		b.meta.LoadAvgAt["failover"] = loadAvg()
		if err := b.workloadFailover(); err != nil {
			return err
		}
	}
	if o.workloads["faults"] && has(o.systems, "ticketing") {
		b.meta.LoadAvgAt["faults"] = loadAvg()
		if err := b.workloadFaults(); err != nil {
			return err
		}
	}
	b.stopAll()
	b.meta.LoadAvgEnd = loadAvg()
	b.meta.Finished = time.Now().UTC().Format(time.RFC3339)
	return b.report()
}
