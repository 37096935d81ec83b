package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Workload "clients": acquire+release pairs per second of every client library and of each
// ecosystem's incumbent lock library (on Redis), through one client object with N concurrent
// callers, every program in the same run, interleaved, each run against a freshly started server.
//
// The programs are listed in clients.registry. Each (but the raw driver) is a folder with two
// scripts, the program contract:
//
//	bench-build.sh OUTDIR   builds the program into OUTDIR (fetching its dependencies with the
//	                        ecosystem's ordinary client if missing; idempotent); non-zero exit
//	                        with a one-line reason on stderr when it cannot
//	bench-run.sh OUTDIR --addr HOST:PORT --callers N --seconds S [args]
//	                        execs the program: one client object, N callers, each acquiring its
//	                        own key (never contended) and releasing it, in a loop; 1 s of
//	                        warm-up, then S seconds counted; prints one JSON line at the end,
//	                        {"pairs_per_sec": R, "errors": E}, and exits 0 (1 with more than 1%
//	                        errors: a failed run)
//
// go-raw, the reference, is the harness's own pipelined driver: one connection with N pairs in
// flight. A folder that is missing, or whose build fails, is reported skipped with the reason and
// the run goes on.

// clientEntry is one row of clients.registry.
type clientEntry struct {
	Name      string
	Label     string
	Folder    string // "" for go-raw
	Against   string // ticketing or redis
	Args      []string
	Incumbent string
	Targets   []string // raw, incumbent
}

// parseRegistry reads the registry's Markdown table: lines starting with "|", the header (its
// first cell "name") and the separator skipped; '#' lines are comments.
func parseRegistry(text string) ([]*clientEntry, error) {
	var out []*clientEntry
	seen := map[string]bool{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		if cells[0] == "name" || strings.HasPrefix(cells[0], "---") {
			continue
		}
		if len(cells) != 7 {
			return nil, fmt.Errorf("registry line %d: %d columns, want 7 (name, label, folder, against, args, incumbent, targets)", i+1, len(cells))
		}
		e := &clientEntry{Name: cells[0], Label: cells[1], Folder: cells[2], Against: cells[3],
			Args: strings.Fields(cells[4]), Incumbent: cells[5], Targets: splitList(cells[6])}
		if e.Name == "" || seen[e.Name] {
			return nil, fmt.Errorf("registry line %d: empty or repeated name %q", i+1, e.Name)
		}
		seen[e.Name] = true
		if e.Folder == "-" {
			e.Folder = ""
		}
		if (e.Folder == "") != (e.Name == "go-raw") {
			return nil, fmt.Errorf("registry line %d: only go-raw (the harness's driver) has no folder", i+1)
		}
		if e.Label == "" {
			e.Label = e.Name
		}
		if e.Against != "ticketing" && e.Against != "redis" {
			return nil, fmt.Errorf("registry line %d: against %q, want ticketing or redis", i+1, e.Against)
		}
		for _, t := range e.Targets {
			if t != "raw" && t != "incumbent" {
				return nil, fmt.Errorf("registry line %d: target %q, want raw or incumbent", i+1, t)
			}
		}
		out = append(out, e)
	}
	for _, e := range out {
		if e.Incumbent != "" && !seen[e.Incumbent] {
			return nil, fmt.Errorf("registry: %s's incumbent %q is not a row", e.Name, e.Incumbent)
		}
		if has(e.Targets, "incumbent") && e.Incumbent == "" {
			return nil, fmt.Errorf("registry: %s has the incumbent target but no incumbent", e.Name)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("registry: no rows")
	}
	return out, nil
}

// selectClients picks the rows named in list ("all": every row, in the registry's order).
func selectClients(reg []*clientEntry, list []string) ([]*clientEntry, error) {
	if len(list) == 0 || (len(list) == 1 && list[0] == "all") {
		return reg, nil
	}
	byName := map[string]*clientEntry{}
	var names []string
	for _, e := range reg {
		byName[e.Name] = e
		names = append(names, e.Name)
	}
	var out []*clientEntry
	for _, n := range list {
		e := byName[n]
		if e == nil {
			return nil, fmt.Errorf("unknown client %q (clients.registry has: all, %s)", n, strings.Join(names, ", "))
		}
		out = append(out, e)
	}
	return out, nil
}

// clientProg is a registry row's program as built for this run.
type clientProg struct {
	e       *clientEntry
	dir     string // the folder, absolute
	outDir  string // OUTDIR given to both scripts
	skipped string // why it does not run (build failed, folder missing, ...)
	failed  []string
	dead    bool // a run timed out: no more runs
}

// folderOut is the OUTDIR of a folder: one per folder, kept between runs (builds are idempotent,
// so a later run's build is quick), shared by the rows of that folder.
func folderOut(base, folder string) string {
	return filepath.Join(base, strings.ReplaceAll(strings.Trim(folder, "/"), "/", "_"))
}

// buildClients builds every selected program once per folder, one build at a time, bounded. A
// program that cannot be built is reported as skipped, with the reason, and the run goes on.
func (b *bench) buildClients() error {
	o := b.o
	reg, err := loadRegistry(o.clientRegistry)
	if err != nil {
		return err
	}
	sel, err := selectClients(reg, o.clients)
	if err != nil {
		return err
	}
	progs, _ := filepath.Abs(o.clientBuildDir)
	repo, _ := filepath.Abs(o.repo)
	built := map[string]string{} // folder -> "" (built) or the reason it is not
	_, redisErr := exec.LookPath("redis-server")
	b.progs = nil
	for _, e := range sel {
		p := &clientProg{e: e}
		b.progs = append(b.progs, p)
		if e.Against == "redis" && redisErr != nil {
			p.skipped = "redis-server not found (run bench/setup.sh)"
		}
		if e.Folder == "" || p.skipped != "" {
			continue
		}
		p.dir = e.Folder
		if !filepath.IsAbs(p.dir) { // a registry row names a folder of the repository, or any absolute one
			p.dir = filepath.Join(repo, e.Folder)
		}
		p.outDir = folderOut(progs, e.Folder)
		why, done := built[e.Folder]
		if !done {
			why = buildFolder(p.dir, e.Folder, p.outDir, o.clientBuildTimeout)
			built[e.Folder] = why
		}
		p.skipped = why
	}
	for _, p := range b.progs {
		if p.skipped != "" {
			logf("client %s: skipped: %s", p.e.Name, p.skipped)
		}
	}
	return nil
}

func loadRegistry(path string) ([]*clientEntry, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("clients registry: %w", err)
	}
	return parseRegistry(string(raw))
}

// buildFolder runs folder's bench-build.sh OUTDIR, returning "" or why the folder's programs
// are skipped.
func buildFolder(dir, folder, outDir string, timeout time.Duration) string {
	for _, s := range []string{"bench-build.sh", "bench-run.sh"} {
		if _, err := os.Stat(filepath.Join(dir, s)); err != nil {
			return fmt.Sprintf("no %s in %s", s, folder)
		}
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err.Error()
	}
	logf("building %s: bench-build.sh (bounded at %v)", folder, timeout)
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(dir, "bench-build.sh"), outDir)
	cmd.Dir = dir
	ownGroup(cmd)
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &errb, &errb
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Sprintf("build did not finish within %v", timeout)
		}
		return "build failed: " + lastLine(errb.String(), err.Error())
	}
	logf("built %s in %.1f s", folder, time.Since(t0).Seconds())
	return ""
}

// ownGroup starts cmd in a process group of its own, and ends the whole group (a build's
// compilers, a program's helpers), by its id, when cmd's context ends.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
}

// lastLine is the last non-empty line of s, at most 300 bytes (or def).
func lastLine(s, def string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	if l == "" {
		return def
	}
	if len(l) > 300 {
		l = l[:300] + "..."
	}
	return l
}

// clientRun is one run of one program at one caller count.
type clientRun struct {
	round       int // which repetition it belongs to (every program runs once per round)
	pairsPerSec float64
	clientCPU   float64 // cores, over the counted window
	serverCPU   float64
	rssMaxKB    int64
	errors      int64
}

// cpuSample is the CPU time of the client and of the server at one moment.
type cpuSample struct {
	t           time.Time
	client, srv float64
}

// cpuAt interpolates the samples (in time order) at t.
func cpuAt(s []cpuSample, t time.Time) (client, srv float64) {
	if len(s) == 0 {
		return 0, 0
	}
	if !t.After(s[0].t) {
		return s[0].client, s[0].srv
	}
	for i := 1; i < len(s); i++ {
		if !t.After(s[i].t) {
			a, b := s[i-1], s[i]
			f := float64(t.Sub(a.t)) / float64(b.t.Sub(a.t))
			return a.client + f*(b.client-a.client), a.srv + f*(b.srv-a.srv)
		}
	}
	l := s[len(s)-1]
	return l.client, l.srv
}

// runClientProg runs p's bench-run.sh against srv with n callers for secs, bounded, and reads
// its JSON line. The CPU figures cover the counted window only: the last secs before the line
// appeared (from samples of /proc/PID/stat every 20 ms, interpolated), so a runtime's start-up
// and warm-up (a JVM's JIT) are not counted as the program's cost per pair.
func runClientProg(p *clientProg, srv *server, n int, secs float64) (*clientRun, error) {
	bound := time.Duration(secs*float64(time.Second)) + 60*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	args := append([]string{filepath.Join(p.dir, "bench-run.sh"), p.outDir, "--addr", srv.addr,
		"--callers", fmt.Sprint(n), "--seconds", fmt.Sprint(secs)}, p.e.Args...)
	cmd := exec.CommandContext(ctx, "bash", args...)
	cmd.Dir = p.dir
	ownGroup(cmd)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	mon := startMonitor([]int{srv.pid()})
	if err := cmd.Start(); err != nil {
		mon.stop()
		return nil, err
	}
	pid := cmd.Process.Pid
	var mu sync.Mutex
	var samples []cpuSample
	sample := func() {
		c := procCPUSeconds(pid)
		s := procCPUSeconds(srv.pid())
		mu.Lock()
		if c > 0 || len(samples) == 0 {
			samples = append(samples, cpuSample{time.Now(), c, s})
		}
		mu.Unlock()
	}
	stopSampling := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			sample()
			select {
			case <-stopSampling:
				return
			case <-t.C:
			}
		}
	}()
	var line string
	var lineAt time.Time
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "{") && strings.Contains(l, "pairs_per_sec") && line == "" {
			lineAt = time.Now()
			sample() // the process may still be alive: the window's end
			line = l
		}
	}
	werr := cmd.Wait()
	close(stopSampling)
	wg.Wait()
	run := &clientRun{rssMaxKB: mon.stop()}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%s: no result within %v (stopped)", p.e.Name, bound)
	}
	if line == "" {
		return nil, fmt.Errorf("%s: no result line (exit: %v; stderr: %s)", p.e.Name, werr, lastLine(errb.String(), ""))
	}
	var v struct {
		PairsPerSec *float64 `json:"pairs_per_sec"`
		Errors      int64    `json:"errors"`
	}
	if err := json.Unmarshal([]byte(line), &v); err != nil || v.PairsPerSec == nil {
		return nil, fmt.Errorf("%s: bad result line %q: %v", p.e.Name, line, err)
	}
	run.pairsPerSec, run.errors = *v.PairsPerSec, v.Errors
	if werr != nil {
		return run, fmt.Errorf("%s: failed run (%v): %d errors at %.0f pairs/s; stderr: %s", p.e.Name, werr, v.Errors, run.pairsPerSec, lastLine(errb.String(), ""))
	}
	if tooManyErrors(run.pairsPerSec*secs, v.Errors) { // the contract says exit 1; hold it to that
		return run, fmt.Errorf("%s: failed run: %d errors at %.0f pairs/s (more than 1%%)", p.e.Name, v.Errors, run.pairsPerSec)
	}
	mu.Lock()
	c1, s1 := cpuAt(samples, lineAt)
	c0, s0 := cpuAt(samples, lineAt.Add(-time.Duration(secs*float64(time.Second))))
	mu.Unlock()
	run.clientCPU, run.serverCPU = (c1-c0)/secs, (s1-s0)/secs
	if run.clientCPU <= 0 { // no samples (a very short run): the whole process's rusage
		if ps := cmd.ProcessState; ps != nil {
			run.clientCPU = (ps.UserTime() + ps.SystemTime()).Seconds() / (secs + 1)
		}
	}
	return run, nil
}

// tooManyErrors: more than 1% of the calls counted failed (the contract's failed run).
func tooManyErrors(pairs float64, errs int64) bool {
	return float64(errs)*100 > pairs+float64(errs)
}

// clientKey identifies a (program, callers) series.
type clientKey struct {
	name    string
	callers int
}

func (b *bench) workloadClients() error {
	o := b.o
	if o.clientKeepAwake && !o.keepAwake { // -keep-awake: already running for the whole run
		_, stop, err := keepAwake(runtime.NumCPU())
		if err != nil {
			return err
		}
		defer stop()
	}
	keys := makeKeys("key", o.keys)
	secs := o.clientDuration.Seconds()
	runs := map[clientKey][]*clientRun{}
	for _, n := range o.callers {
		if n > o.keys {
			return fmt.Errorf("-callers %d exceeds -keys %d", n, o.keys)
		}
	}
	for _, n := range o.callers {
		for rep := 0; rep < o.repeat; rep++ {
			for _, p := range b.progs {
				e := p.e
				if p.skipped != "" || p.dead {
					continue
				}
				for _, other := range []string{"ticketing", "redis"} { // one server at a time
					if other != e.Against {
						if s := b.server(other); s != nil {
							b.mu.Lock()
							delete(b.servers, other)
							b.mu.Unlock()
							s.stop()
							os.RemoveAll(s.dir)
						}
					}
				}
				if err := b.fresh(e.Against); err != nil {
					return err
				}
				if b.server(e.Against) == nil { // -fresh=false: started once, kept
					if err := b.start(e.Against); err != nil {
						return err
					}
				}
				srv := b.server(e.Against)
				var run *clientRun
				if e.Folder == "" { // go-raw
					ws, err := pipelineWorkersAt("ticketing", srv.addr, 1, n, keys, "", false)
					var res *pointResult
					if err == nil {
						res, err = runPoint(srv.target(), ws, time.Second, o.clientDuration, o.drain, false)
					}
					if err != nil {
						logf("clients: go-raw: %v", err)
						p.failed = append(p.failed, fmt.Sprintf("%d callers, round %d: go-raw: %v", n, rep+1, err))
						continue
					}
					run = &clientRun{pairsPerSec: res.opsPerSec() / 2, clientCPU: res.cpuHarn, serverCPU: res.cpuServer,
						rssMaxKB: res.rssMaxKB, errors: res.errs}
				} else {
					r, err := runClientProg(p, srv, n, secs)
					if err != nil {
						logf("clients: %v", err)
						p.failed = append(p.failed, fmt.Sprintf("%d callers, round %d: %v", n, rep+1, err))
						if strings.Contains(err.Error(), "no result within") {
							p.dead = true
						}
						continue
					}
					run = r
				}
				run.round = rep
				logf("(clients) %d callers, round %d/%d  %-16s %9.0f pairs/s  client CPU %.2f (%.2f µs/pair)  server CPU %.2f  errors %d",
					n, rep+1, o.repeat, e.Name, run.pairsPerSec, run.clientCPU, cpuPerPairUS(run), run.serverCPU, run.errors)
				k := clientKey{e.Name, n}
				runs[k] = append(runs[k], run)
			}
		}
	}
	b.stopAll()
	b.records = append(b.records, clientRecords(b.progs, o.callers, runs, secs)...)
	return nil
}

// clientRecords turns the runs into one record per (program, callers).
func clientRecords(progs []*clientProg, callers []int, runs map[clientKey][]*clientRun, secs float64) []*Record {
	var out []*Record
	for _, n := range callers {
		for _, p := range progs {
			e := p.e
			r := &Record{System: e.Against, Workload: "client_callers", Client: e.Name, Label: e.Label, Callers: n,
				Connections: 1, InFlight: n, Incumbent: e.Incumbent, Targets: e.Targets}
			r.OpsCounting = "pairs_per_sec: acquire+release pairs per second; ops_per_sec = 2 x pairs"
			r.RunsMetric = "pairs_per_sec"
			if e.Folder == "" {
				r.Note = "the harness's raw pipelined driver: one connection, N pairs in flight; its CPU is the harness's"
			} else {
				r.Note = e.Folder + "/bench-run.sh " + strings.Join(e.Args, " ")
			}
			rs := runs[clientKey{e.Name, n}]
			r.FailedRuns = len(failedAt(p.failed, n))
			if len(rs) == 0 {
				r.Skipped = p.skipped
				if r.Skipped == "" {
					if f := failedAt(p.failed, n); len(f) > 0 {
						r.Skipped = "every run failed: " + f[0]
					} else {
						r.Skipped = "not run"
					}
				}
				out = append(out, r)
				continue
			}
			sorted := append([]*clientRun(nil), rs...)
			sort.Slice(sorted, func(i, j int) bool { return sorted[i].pairsPerSec < sorted[j].pairsPerSec })
			med := sorted[len(sorted)/2]
			var vals, srvCPU []float64
			for _, x := range rs {
				vals = append(vals, round1(x.pairsPerSec))
				r.Errors += x.errors
				r.ServerRSSMaxKB = max(r.ServerRSSMaxKB, x.rssMaxKB)
				if x.pairsPerSec > 0 {
					srvCPU = append(srvCPU, x.serverCPU/x.pairsPerSec*1e6)
				}
			}
			r.Runs = vals
			r.PairsPerSec = medianF(vals)
			r.OpsPerSec = round1(2 * r.PairsPerSec)
			r.ClientCPU, r.ServerCPU = round2(med.clientCPU), round2(med.serverCPU)
			if len(srvCPU) > 0 {
				r.ServerCPUPerPairUS = round3(medianExact(srvCPU))
			}
			r.CPUPerPairUS, r.VsRawPairs, r.VsRawCPUPerPair = perPairFigures(rs, runs[clientKey{"go-raw", n}])
			if e.Incumbent != "" {
				_, r.VsIncumbentPairs, r.VsIncumbentCPUPerPair = perPairFigures(rs, runs[clientKey{e.Incumbent, n}])
			}
			r.WindowS = round2(secs)
			if f := failedAt(p.failed, n); len(f) > 0 {
				r.Note += "; failed runs: " + strings.Join(f, "; ")
			}
			out = append(out, r)
		}
	}
	return out
}

// failedAt are the failures of runs at n callers.
func failedAt(failed []string, n int) []string {
	var out []string
	for _, f := range failed {
		if strings.HasPrefix(f, fmt.Sprintf("%d callers,", n)) {
			out = append(out, f)
		}
	}
	return out
}

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// cpuPerPairUS is a run's client CPU per acquire+release pair, in microseconds (0: no pairs).
func cpuPerPairUS(r *clientRun) float64 {
	if r.pairsPerSec <= 0 {
		return 0
	}
	return r.clientCPU / r.pairsPerSec * 1e6
}

// perPairFigures returns the median client CPU per pair of rs (µs) and, against a reference's
// runs (the raw driver's, or the incumbent's), the median over the rounds both ran of the round's
// ratios: pairs/s, and client CPU per pair. A ratio within a round cancels the machine's drift
// between rounds, which a ratio of medians does not (on a shared VM the raw driver's runs may
// spread 2x within one series).
func perPairFigures(rs, ref []*clientRun) (cpuPerPair, vsPairs, vsCPU float64) {
	var cpu, pairs, cpuRatio []float64
	refByRound := map[int]*clientRun{}
	for _, x := range ref {
		refByRound[x.round] = x
	}
	for _, x := range rs {
		c := cpuPerPairUS(x)
		cpu = append(cpu, c)
		if w := refByRound[x.round]; w != nil && w.pairsPerSec > 0 && cpuPerPairUS(w) > 0 {
			pairs = append(pairs, x.pairsPerSec/w.pairsPerSec)
			cpuRatio = append(cpuRatio, c/cpuPerPairUS(w))
		}
	}
	if len(cpu) > 0 {
		cpuPerPair = round3(medianExact(cpu))
	}
	if len(pairs) > 0 {
		vsPairs, vsCPU = round2(medianExact(pairs)), round2(medianExact(cpuRatio))
	}
	return cpuPerPair, vsPairs, vsCPU
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

// keepAwake starts n busy loops at the lowest CPU priority (nice 19: the scheduler gives each
// about 1.5% of a CPU against a normal process) and returns what stops them. On a VM a CPU that
// goes idle between two round trips is halted, and its wake-up costs more than the round trip
// (BENCHMARKS.md, "Read the 1-caller column"); with these, every CPU stays awake and a 1-caller
// figure measures the client. Each loop is its own process group, killed by stop (and with the
// harness, by Pdeathsig).
func keepAwake(n int) (pids []int, stop func(), err error) {
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			c.Wait()
		}
	}
	for i := 0; i < n; i++ {
		c := exec.Command("nice", "-n", "19", "sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			stop()
			return nil, nil, fmt.Errorf("keep-awake loops: %w", err)
		}
		cmds = append(cmds, c)
		pids = append(pids, c.Process.Pid)
	}
	logf("%d busy loops at nice 19 keep the CPUs awake", n)
	return pids, stop, nil
}
