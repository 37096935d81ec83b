package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Workload "clients": each client library's own throughput — pipelined acquire+release pairs
// per second on one connection, N pairs in flight, against a freshly started single node —
// with every client in the same run, interleaved, so that a library that is slower than the
// server shows as a lower figure than the harness's raw driver.
//
//	go-raw  the harness's own pipelined driver (one connection, N slots): the reference
//	go      bench/goclient: clients/go, N goroutines sharing one Client
//	rust    clients/rust's example bench: N tasks sharing one Client
//	c       clients/c's ticketing-bench: N slots on the non-blocking API, one poll() loop

type clientProg struct {
	name    string
	bin     string
	skipped string
	args    func(addr string, inFlight int, secs float64) []string
}

func (b *bench) clientProg(name string) *clientProg {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.progs == nil {
		b.progs = map[string]*clientProg{}
	}
	p := b.progs[name]
	if p == nil {
		p = &clientProg{name: name}
		b.progs[name] = p
	}
	return p
}

// runTool runs a build command (bounded), returning a short reason on failure.
func runTool(dir string, timeout time.Duration, env []string, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		last := lines[len(lines)-1]
		if len(lines) > 1 {
			last = lines[len(lines)-2] + " / " + last
		}
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, last)
	}
	return nil
}

// buildClients builds the client programs (or takes the prebuilt ones given by flag). A client
// that cannot be built is reported as skipped, with the reason, and the run goes on.
func (b *bench) buildClients() {
	o := b.o
	tmp, _ := filepath.Abs(filepath.Join(o.out, "tmp"))
	repo, _ := filepath.Abs(o.repo)
	for _, name := range o.clients {
		p := b.clientProg(name)
		switch name {
		case "go":
			p.args = func(addr string, n int, s float64) []string {
				return []string{"-addr", addr, "-in-flight", strconv.Itoa(n), "-seconds", fmt.Sprint(s)}
			}
			if p.bin = o.goClientBin; p.bin != "" {
				break
			}
			p.bin = filepath.Join(tmp, "goclientbench")
			logf("building the Go client's benchmark: go build (in bench/goclient, its own module)")
			if err := runTool("goclient", 5*time.Minute, nil, "go", "build", "-o", p.bin, "."); err != nil {
				p.skipped = "build failed: " + err.Error()
			}
		case "rust":
			// A current-thread runtime, as the C client's one poll loop and the raw driver's one
			// goroutine: on 2 cores a multi-threaded runtime wakes its second worker every batch
			// and the workers contend for the client's state (about 0.42x the raw driver here
			// against 0.52x; BENCHMARKS.md, Clients).
			p.args = func(addr string, n int, s float64) []string {
				return []string{addr, "--in-flight", strconv.Itoa(n), "--seconds", fmt.Sprint(s), "--current-thread"}
			}
			if p.bin = o.rustBench; p.bin != "" {
				break
			}
			dir := filepath.Join(repo, "clients", "rust")
			if _, err := os.Stat(filepath.Join(dir, "examples", "bench.rs")); err != nil {
				p.skipped = "clients/rust has no benchmark program (examples/bench.rs)"
				break
			}
			if _, err := exec.LookPath("cargo"); err != nil {
				p.skipped = "cargo not found (the Rust toolchain is not installed)"
				break
			}
			target := filepath.Join(tmp, "rust-target") // kept between runs: later builds are incremental
			p.bin = filepath.Join(target, "release", "examples", "bench")
			logf("building the Rust client's benchmark: cargo build --release --example bench (a first build takes a minute or two)")
			args := []string{"build", "--release", "--example", "bench", "--target-dir", target}
			err := runTool(dir, 10*time.Minute, nil, "cargo", append(args, "--offline")...)
			if err != nil {
				err = runTool(dir, 10*time.Minute, nil, "cargo", args...)
			}
			if err != nil {
				p.skipped = "build failed: " + err.Error()
			}
		case "c":
			p.args = func(addr string, n int, s float64) []string {
				return []string{"-a", addr, "-c", strconv.Itoa(n), "-d", fmt.Sprint(s)}
			}
			if p.bin = o.cBench; p.bin != "" {
				break
			}
			dir := filepath.Join(repo, "clients", "c")
			if _, err := os.Stat(filepath.Join(dir, "bench", "bench.c")); err != nil {
				p.skipped = "clients/c has no benchmark program (bench/bench.c)"
				break
			}
			if _, err := exec.LookPath("cmake"); err != nil {
				p.skipped = "cmake not found (the C client's build tools are not installed)"
				break
			}
			build := filepath.Join(tmp, "c-build")
			p.bin = filepath.Join(build, "ticketing-bench")
			logf("building the C client's benchmark: cmake --build ... --target ticketing-bench")
			err := runTool(repo, 5*time.Minute, nil, "cmake", "-S", dir, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
				"-DTICKETING_BUILD_TESTS=OFF", "-DTICKETING_BUILD_TOOLS=ON")
			if err == nil {
				err = runTool(repo, 5*time.Minute, nil, "cmake", "--build", build, "--target", "ticketing-bench", "-j", "2")
			}
			if err != nil {
				p.skipped = "build failed: " + err.Error()
			}
		}
		if p.skipped == "" && p.bin != "" {
			if _, err := os.Stat(p.bin); err != nil {
				p.skipped = "no program at " + p.bin
			}
		}
		if p.skipped != "" {
			logf("client %s: skipped: %s", name, p.skipped)
		}
	}
}

// clientRun is one run of one client program.
type clientRun struct {
	round       int // which repetition it belongs to (the clients run one after another per round)
	pairsPerSec float64
	clientCPU   float64 // cores
	serverCPU   float64
	rssMaxKB    int64
	errors      int64
}

// runClientProg runs p against srv for secs, bounded, and reads its JSON line.
func runClientProg(p *clientProg, srv *server, inFlight int, secs float64) (*clientRun, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs*float64(time.Second))+60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.bin, p.args(srv.addr, inFlight, secs)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	mon := startMonitor([]int{srv.pid()})
	mon.windowStart()
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		mon.stop()
		return nil, err
	}
	werr := cmd.Wait()
	wall := time.Since(t0).Seconds()
	mon.windowEnd()
	run := &clientRun{rssMaxKB: mon.stop(), serverCPU: mon.cpuSrv}
	if ps := cmd.ProcessState; ps != nil && wall > 0 {
		run.clientCPU = (ps.UserTime() + ps.SystemTime()).Seconds() / wall
	}
	sc := bufio.NewScanner(&out)
	found := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") || !strings.Contains(line, "pairs_per_sec") {
			continue
		}
		var v struct {
			PairsPerSec float64 `json:"pairs_per_sec"`
			Errors      int64   `json:"errors"`
		}
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			return nil, fmt.Errorf("%s: bad output line %q: %v", p.name, line, err)
		}
		run.pairsPerSec, run.errors, found = v.PairsPerSec, v.Errors, true
	}
	if !found {
		return nil, fmt.Errorf("%s: no result line (exit: %v; stderr: %s)", p.name, werr, strings.TrimSpace(errb.String()))
	}
	return run, nil
}

func (b *bench) workloadClients() error {
	o := b.o
	keys := makeKeys("key", o.keys)
	secs := o.clientDuration.Seconds()
	runs := map[string][]*clientRun{}
	for rep := 0; rep < o.repeat; rep++ {
		for _, name := range o.clients {
			p := b.clientProg(name)
			if name != "go-raw" && (p.skipped != "" || p.bin == "") {
				continue
			}
			if err := b.fresh("ticketing"); err != nil {
				return err
			}
			srv := b.server("ticketing")
			var run *clientRun
			if name == "go-raw" {
				if o.clientInFlight > o.keys {
					return fmt.Errorf("-client-in-flight %d exceeds -keys %d", o.clientInFlight, o.keys)
				}
				ws, err := pipelineWorkersAt("ticketing", srv.addr, 1, o.clientInFlight, keys, "", false)
				if err != nil {
					return err
				}
				res, err := runPoint(srv.target(), ws, 0, o.clientDuration, o.drain, false)
				if err != nil {
					return fmt.Errorf("clients: go-raw: %w", err)
				}
				run = &clientRun{pairsPerSec: res.opsPerSec() / 2, clientCPU: res.cpuHarn, serverCPU: res.cpuServer,
					rssMaxKB: res.rssMaxKB, errors: res.errs}
			} else {
				r, err := runClientProg(p, srv, o.clientInFlight, secs)
				if err != nil {
					logf("clients: %v", err)
					p.skipped = "run failed: " + err.Error()
					continue
				}
				run = r
			}
			run.round = rep
			logf("(clients) run %d/%d  %-7s 1 conn, %d in flight  %9.0f pairs/s (%9.0f ops/s)  client CPU %.2f  server CPU %.2f  errors %d",
				rep+1, o.repeat, name, o.clientInFlight, run.pairsPerSec, 2*run.pairsPerSec, run.clientCPU, run.serverCPU, run.errors)
			runs[name] = append(runs[name], run)
		}
	}
	b.stopAll()
	for _, name := range o.clients {
		p := b.clientProg(name)
		r := &Record{System: "ticketing", Workload: "client_pipelined", Client: name, Connections: 1,
			Pipeline: o.clientInFlight, InFlight: o.clientInFlight, Keys: o.keys}
		r.OpsCounting = "pairs_per_sec: acquire+release pairs per second; ops_per_sec = 2 x pairs"
		r.RunsMetric = "pairs_per_sec"
		switch name {
		case "go-raw":
			r.Note = "the harness's raw pipelined driver (one connection, one session); its CPU is the harness's"
		case "go":
			r.Note = "bench/goclient: clients/go, goroutines sharing one Client (TryAcquire + Lock.Release)"
		case "rust":
			r.Note = "clients/rust examples/bench.rs: tokio tasks sharing one Client on a current-thread runtime (try once + release)"
		case "c":
			r.Note = "clients/c bench/bench.c: slots on the non-blocking API in one poll() loop"
		}
		rs := runs[name]
		if len(rs) == 0 {
			r.Skipped = p.skipped
			if r.Skipped == "" {
				r.Skipped = "not run"
			}
			b.records = append(b.records, r)
			continue
		}
		sorted := append([]*clientRun(nil), rs...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].pairsPerSec < sorted[j].pairsPerSec })
		med := sorted[len(sorted)/2]
		var vals []float64
		for _, x := range rs {
			vals = append(vals, round1(x.pairsPerSec))
			r.Errors += x.errors
			r.ServerRSSMaxKB = max(r.ServerRSSMaxKB, x.rssMaxKB)
		}
		r.Runs = vals
		r.PairsPerSec = medianF(vals)
		r.OpsPerSec = round1(2 * r.PairsPerSec)
		r.ClientCPU, r.ServerCPU = round2(med.clientCPU), round2(med.serverCPU)
		r.CPUPerPairUS, r.VsRawPairs, r.VsRawCPUPerPair = perPairFigures(rs, runs["go-raw"])
		r.WindowS = round2(secs)
		if p.skipped != "" {
			r.Note += "; some runs failed: " + p.skipped
		}
		b.records = append(b.records, r)
	}
	return nil
}

// cpuPerPairUS is a run's client CPU per acquire+release pair, in microseconds (0: no pairs).
func cpuPerPairUS(r *clientRun) float64 {
	if r.pairsPerSec <= 0 {
		return 0
	}
	return r.clientCPU / r.pairsPerSec * 1e6
}

// perPairFigures returns the median client CPU per pair of rs (µs) and, against the raw driver's
// runs, the median over the rounds both ran of the round's ratios: pairs/s, and client CPU per
// pair. A ratio within a round cancels the machine's drift between rounds, which a ratio of
// medians does not (on a shared VM the raw driver's runs may spread 2x within one series).
func perPairFigures(rs, raw []*clientRun) (cpuPerPair, vsRawPairs, vsRawCPU float64) {
	var cpu, pairs, cpuRatio []float64
	rawByRound := map[int]*clientRun{}
	for _, x := range raw {
		rawByRound[x.round] = x
	}
	for _, x := range rs {
		c := cpuPerPairUS(x)
		cpu = append(cpu, c)
		if w := rawByRound[x.round]; w != nil && w.pairsPerSec > 0 && cpuPerPairUS(w) > 0 {
			pairs = append(pairs, x.pairsPerSec/w.pairsPerSec)
			cpuRatio = append(cpuRatio, c/cpuPerPairUS(w))
		}
	}
	if len(cpu) > 0 {
		cpuPerPair = float64(int64(medianExact(cpu)*1000+0.5)) / 1000
	}
	if len(pairs) > 0 {
		vsRawPairs, vsRawCPU = round2(medianExact(pairs)), round2(medianExact(cpuRatio))
	}
	return cpuPerPair, vsRawPairs, vsRawCPU
}

// medianExact is the median of v (not empty), unrounded (medianF rounds to 0.1, for ops/s).
func medianExact(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
