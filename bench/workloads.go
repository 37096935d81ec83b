package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

type bench struct {
	o         *options
	tmp       string
	meta      *Meta
	redisSHA  string
	pprofAddr string
	idleRSS   map[string]int64 // RSS of each system right after its first start
	records   []*Record
	// (a): every run of every point, by system and connections, for the medians
	aRuns map[string]map[int][]*pointResult

	mu       sync.Mutex
	servers  map[string]*server
	clusters []cluster
	progs    []*clientProg // the clients workload's programs, in the registry's order
	seq      int
}

func (b *bench) server(sys string) *server {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.servers[sys]
}

// start starts sys in a new temp dir of its own and waits until it serves.
func (b *bench) start(sys string) error {
	o := b.o
	b.mu.Lock()
	b.seq++
	dir := filepath.Join(b.tmp, fmt.Sprintf("%s-%d", sys, b.seq))
	b.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var srv *server
	var err error
	switch sys {
	case "ticketing":
		env := append([]string(nil), o.tkEnv...)
		if o.pprofOut != "" {
			port, perr := freePort()
			if perr != nil {
				return perr
			}
			b.pprofAddr = fmt.Sprintf("127.0.0.1:%d", port)
			env = append(env, "TICKETING_PPROF_ADDR="+b.pprofAddr)
		}
		srv, err = startTicketing(o.tkBin, dir, env)
	case "redis":
		srv, err = startRedis(dir)
	case "etcd":
		srv, err = startEtcd(dir)
	case "null":
		srv, err = startNull(o.nullBin, dir)
	case "prev":
		srv, err = startTicketing(o.prevBin, dir, nil)
	}
	if err != nil {
		return fmt.Errorf("starting %s: %w", sys, err)
	}
	b.mu.Lock()
	b.servers[sys] = srv
	b.mu.Unlock()
	if sys == "redis" {
		if b.redisSHA, err = loadReleaseScript(srv.addr); err != nil {
			return fmt.Errorf("redis SCRIPT LOAD: %w", err)
		}
	}
	if _, ok := b.idleRSS[sys]; !ok {
		b.idleRSS[sys], _ = procStatusKB(srv.pid())
	}
	return nil
}

// fresh replaces sys with a new process before a point (unless -fresh=false).
func (b *bench) fresh(sys string) error {
	if !b.o.fresh {
		return nil
	}
	b.mu.Lock()
	old := b.servers[sys]
	delete(b.servers, sys)
	b.mu.Unlock()
	if old != nil {
		old.stop()
		os.RemoveAll(old.dir)
	}
	return b.start(sys)
}

// stopAll stops every running server and cluster member by its PID.
func (b *bench) stopAll() {
	b.mu.Lock()
	var all []*server
	for name, srv := range b.servers {
		all = append(all, srv)
		delete(b.servers, name)
	}
	cls := b.clusters
	b.clusters = nil
	b.mu.Unlock()
	for _, srv := range all {
		srv.stop()
	}
	for _, cl := range cls {
		cl.stop()
	}
}

func (b *bench) addrOf(system string) string { return b.server(system).addr }

// pipelineWorkers opens conns connections to system, each with depth slots, the slots of all
// connections sharing the key space without overlap.
func (b *bench) pipelineWorkers(system string, conns, depth int, keys [][]byte, setnx bool) ([]worker, error) {
	return pipelineWorkersAt(system, b.addrOf(system), conns, depth, keys, b.redisSHA, setnx)
}

// pipelineWorkersAt is pipelineWorkers for a server of kind system at addr (etcd: endpoints,
// comma-separated).
func pipelineWorkersAt(system, addr string, conns, depth int, keys [][]byte, redisSHA string, setnx bool) ([]worker, error) {
	S := conns * depth
	var ws []worker
	fail := func(err error) ([]worker, error) {
		for _, w := range ws {
			w.close()
		}
		return nil, fmt.Errorf("%s: connecting: %w", system, err)
	}
	for c := 0; c < conns; c++ {
		lists := make([][][]byte, depth)
		for d := 0; d < depth; d++ {
			lists[d] = slotKeys(keys, c*depth+d, S)
		}
		var w worker
		var err error
		switch system {
		case "ticketing", "null":
			w, err = newTkPipe(addr, lists)
		case "prev":
			w, err = newPrevPipe(addr, lists)
		case "redis":
			w, err = newRedisPipe(addr, c, lists, redisSHA, setnx, keys)
		case "etcd":
			w, err = newEtcdPipe(addr, lists)
		}
		if err != nil {
			return fail(err)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

func makeKeys(prefix string, n int) [][]byte {
	ks := make([][]byte, n)
	for i := range ks {
		ks[i] = keyName(prefix, i)
	}
	return ks
}

// --- (a) -------------------------------------------------------------------------------------

func (b *bench) workloadA() error {
	o := b.o
	keys := makeKeys("key", o.keys)
	b.aRuns = map[string]map[int][]*pointResult{}
	maxConns := 0
	for _, c := range o.conns {
		maxConns = max(maxConns, c)
	}
	for rep := 0; rep < o.repeat; rep++ {
		for _, conns := range o.conns {
			for _, sys := range o.systems {
				if err := b.fresh(sys); err != nil {
					return err
				}
				ws, err := b.pipelineWorkers(sys, conns, o.depth, keys, false)
				if err != nil {
					return err
				}
				var prof chan error
				if sys == "ticketing" && b.pprofAddr != "" && conns == maxConns && rep == 0 {
					prof = b.fetchServerProfile()
				}
				// Ticketing's admin listener is on (its default) and /metrics is scraped once a
				// second during every point, as an operator's Prometheus would (issue 28).
				var scr *scraper
				if sys == "ticketing" {
					scr = startScraper(b.server(sys).adminAddr())
				}
				res, err := runPoint(b.server(sys).target(), ws, o.warmup, o.duration, o.drain, false)
				scraped := ""
				if scr != nil {
					scraped = "  /metrics: " + scr.stop()
				}
				if prof != nil {
					if perr := <-prof; perr != nil {
						logf("server CPU profile: %v", perr)
					}
				}
				if err != nil {
					return fmt.Errorf("(a) %s, %d connections: %w", sys, conns, err)
				}
				if conns == 1 {
					// The round-trip bound (floor.go), on the same server process.
					if rtt, ok, err := pingRTT(sys, b.addrOf(sys)); err != nil {
						return fmt.Errorf("(a) %s: %w", sys, err)
					} else if ok {
						res.pingRTT = rtt
					}
				}
				logf("(a) run %d/%d  %-9s conns=%-3d depth=%d  %12.0f ops/s  p99 %8.0f us  rss max %6d KiB  errors %d  cpu server %.2f harness %.2f  ping %.1f us%s",
					rep+1, o.repeat, sys, conns, o.depth, res.opsPerSec(), us(res.hist.ValueAtQuantile(99)), res.rssMaxKB, res.errs, res.cpuServer, res.cpuHarn, us(int64(res.pingRTT)), scraped)
				if b.aRuns[sys] == nil {
					b.aRuns[sys] = map[int][]*pointResult{}
				}
				b.aRuns[sys][conns] = append(b.aRuns[sys][conns], res)
			}
		}
	}
	for _, sys := range o.systems {
		for _, conns := range o.conns {
			runs := b.aRuns[sys][conns]
			sorted := append([]*pointResult(nil), runs...)
			sort.Slice(sorted, func(i, j int) bool { return sorted[i].opsPerSec() < sorted[j].opsPerSec() })
			med := sorted[len(sorted)/2]
			r := b.pointRecord(sys, "a_pipelined", conns, o.depth, o.keys, med)
			r.OpsPerSec = median(runs)
			var rss int64
			for _, x := range runs {
				r.Runs = append(r.Runs, round1(x.opsPerSec()))
				rss = max(rss, x.rssMaxKB)
			}
			r.ServerRSSMaxKB = rss
			for _, x := range runs {
				if x.rssMaxKB == rss {
					r.RSSAnonKB, r.RSSFileKB = x.anonKB, x.fileKB
				}
			}
			r.OpsCounting = "one acquire+release pair = 2 ops"
			r.RunsMetric = "ops_per_sec"
			if conns == 1 {
				var pings []float64
				for _, x := range runs {
					if x.pingRTT > 0 {
						pings = append(pings, us(int64(x.pingRTT)))
					}
				}
				if len(pings) > 0 {
					r.PingP50us = round1(medianF(pings))
				}
			}
			if sys == "etcd" {
				r.Note = fmt.Sprintf("concurrency.Mutex cannot pipeline: %d clients x %d goroutines, one blocking Lock/Unlock each", conns, o.depth)
			}
			if sys == "null" {
				r.Note = "I/O limit: answers every frame, no lock table"
			}
			b.records = append(b.records, r)
		}
	}
	return nil
}

func median(runs []*pointResult) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = r.opsPerSec()
	}
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return round1(v[n/2])
	}
	return round1((v[n/2-1] + v[n/2]) / 2)
}

func us(ns int64) float64 { return float64(ns) / 1000 }

func round1(x float64) float64 {
	return float64(int64(x*10+0.5)) / 10
}

func (b *bench) pointRecord(sys, workload string, conns, pipeline, keys int, res *pointResult) *Record {
	h := res.hist
	return &Record{
		System: sys, Workload: workload, Connections: conns, Pipeline: pipeline, Keys: keys,
		OpsPerSec: round1(res.opsPerSec()),
		P50us:     round1(us(h.ValueAtQuantile(50))), P99us: round1(us(h.ValueAtQuantile(99))),
		P999us: round1(us(h.ValueAtQuantile(99.9))), MaxUs: round1(us(h.Max())),
		ServerRSSMaxKB: res.rssMaxKB, RSSAnonKB: res.anonKB, RSSFileKB: res.fileKB, Errors: res.errs, Ops: res.ops, WindowS: round2(res.window),
		ServerCPU: round2(res.cpuServer), HarnessCPU: round2(res.cpuHarn),
	}
}

func round2(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }

// fetchServerProfile takes the Ticketing server's CPU profile over the measured window of the
// point that starts now.
func (b *bench) fetchServerProfile() chan error {
	ch := make(chan error, 1)
	go func() {
		time.Sleep(b.o.warmup)
		secs := max(1, int(b.o.duration.Seconds()))
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", b.pprofAddr, secs)
		cl := &http.Client{Timeout: time.Duration(secs+15) * time.Second}
		resp, err := cl.Get(url)
		if err != nil {
			ch <- err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			ch <- fmt.Errorf("%s: %s", url, resp.Status)
			return
		}
		if err := saveBody(resp.Body, b.o.pprofOut); err != nil {
			ch <- err
			return
		}
		logf("server CPU profile written to %s", b.o.pprofOut)
		// The heap in use at the end of the window, connections still open.
		hresp, err := cl.Get(fmt.Sprintf("http://%s/debug/pprof/heap", b.pprofAddr))
		if err != nil {
			ch <- err
			return
		}
		defer hresp.Body.Close()
		if err := saveBody(hresp.Body, b.o.pprofOut+".heap"); err != nil {
			ch <- err
			return
		}
		logf("server heap profile written to %s", b.o.pprofOut+".heap")
		ch <- nil
	}()
	return ch
}

func saveBody(r io.Reader, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// --- fairness: redis-benchmark beside the harness -----------------------------------------------

func (b *bench) workloadFair() error {
	o := b.o
	keys := makeKeys("key", o.keys)
	harness := map[int][]*pointResult{}
	rbench := map[int][]float64{}
	var args []string
	// Harness and redis-benchmark alternate, o.repeat times each, so that drifting background
	// load hits both alike; the medians are compared.
	for rep := 0; rep < o.repeat; rep++ {
		for _, conns := range o.fairConns {
			if err := b.fresh("redis"); err != nil {
				return err
			}
			addr := b.addrOf("redis")
			if err := redisFlush(addr); err != nil {
				return err
			}
			ws, err := b.pipelineWorkers("redis", conns, o.depth, keys, true)
			if err != nil {
				return err
			}
			res, err := runPoint(b.server("redis").target(), ws, o.warmup, o.duration, o.drain, false)
			if err != nil {
				return fmt.Errorf("fairness point, %d connections: %w", conns, err)
			}
			harness[conns] = append(harness[conns], res)
			if err := b.fresh("redis"); err != nil {
				return err
			}
			addr = b.addrOf("redis")
			if err := redisFlush(addr); err != nil {
				return err
			}
			host, port, _ := strings.Cut(addr, ":")
			// As many requests as the harness did in warmup+duration, so both run about as long.
			n := max(100000, int(res.opsPerSec()*(o.warmup+o.duration).Seconds()))
			args = []string{"-h", host, "-p", port, "-c", strconv.Itoa(conns), "-P", strconv.Itoa(o.depth),
				"-n", strconv.Itoa(n), "-r", strconv.Itoa(o.keys), "--csv",
				"SET", "key:__rand_int__", "0123456789abcdef", "NX", "PX", strconv.Itoa(leaseMs)}
			rb, err := runRedisBenchmark(args, 10*(o.warmup+o.duration)+30*time.Second)
			if err != nil {
				logf("redis-benchmark: %v", err)
			}
			rbench[conns] = append(rbench[conns], rb)
			logf("fair run %d/%d redis     conns=%-3d depth=%d  harness %10.0f ops/s   redis-benchmark %10.0f ops/s",
				rep+1, o.repeat, conns, o.depth, res.opsPerSec(), rb)
		}
	}
	for _, conns := range o.fairConns {
		runs := harness[conns]
		sorted := append([]*pointResult(nil), runs...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].opsPerSec() < sorted[j].opsPerSec() })
		r := b.pointRecord("redis", "fair_setnx", conns, o.depth, o.keys, sorted[len(sorted)/2])
		r.OpsPerSec = median(runs)
		for _, x := range runs {
			r.Runs = append(r.Runs, round1(x.opsPerSec()))
		}
		r.OpsCounting = "one SET NX PX = 1 op (redis-benchmark's command)"
		r.RunsMetric = "ops_per_sec"
		rbs := append([]float64(nil), rbench[conns]...)
		r.RedisBenchmarkRuns = rbs
		r.RedisBenchmarkOpsPerSec = medianF(rbs)
		if r.RedisBenchmarkOpsPerSec > 0 {
			r.HarnessVsRedisBenchmark = round2(r.OpsPerSec / r.RedisBenchmarkOpsPerSec)
		}
		r.Note = "redis-benchmark " + strings.Join(args, " ")
		b.records = append(b.records, r)
	}
	return nil
}

func medianF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return round1(s[n/2])
	}
	return round1((s[n/2-1] + s[n/2]) / 2)
}

// runRedisBenchmark runs redis-benchmark with args (bounded by timeout) and returns its ops/s.
func runRedisBenchmark(args []string, timeout time.Duration) (float64, error) {
	cmd := exec.Command("redis-benchmark", args...)
	cmd.Stderr = os.Stderr
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.Output(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Kill() // by its PID
		<-done
		return 0, fmt.Errorf("redis-benchmark did not finish within %v", timeout)
	}
	if err != nil {
		return 0, err
	}
	return parseRedisBenchmarkCSV(string(out)), nil
}

// parseRedisBenchmarkCSV reads the rps column of redis-benchmark --csv output.
func parseRedisBenchmarkCSV(out string) float64 {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 2 || strings.Contains(f[0], "test") {
			continue
		}
		v, err := strconv.ParseFloat(strings.Trim(f[1], `"`), 64)
		if err == nil {
			return v
		}
	}
	return 0
}

// --- (b) -------------------------------------------------------------------------------------

func (b *bench) workloadB() error {
	o := b.o
	keys := makeKeys("key", o.keys)
	runs := map[string][]*pointResult{}
	for rep := 0; rep < o.repeat; rep++ {
		for _, sys := range o.systems {
			if err := b.fresh(sys); err != nil {
				return err
			}
			ws, err := b.pipelineWorkers(sys, 1, 1, keys, false)
			if err != nil {
				return err
			}
			res, err := runPoint(b.server(sys).target(), ws, o.warmup, o.duration, o.drain, true)
			if err != nil {
				return fmt.Errorf("(b) %s: %w", sys, err)
			}
			h := res.hist
			logf("(b) run %d/%d  %-9s one at a time  %9.0f ops/s  p50 %6.1f us  p99 %6.1f us  p999 %7.1f us",
				rep+1, o.repeat, sys, res.opsPerSec(), us(h.ValueAtQuantile(50)), us(h.ValueAtQuantile(99)), us(h.ValueAtQuantile(99.9)))
			runs[sys] = append(runs[sys], res)
		}
	}
	for _, sys := range o.systems {
		p99 := func(p *pointResult) float64 { return us(p.hist.ValueAtQuantile(99)) }
		med, all := medianRun(runs[sys], p99)
		r := b.pointRecord(sys, "b_latency", 1, 1, o.keys, med)
		r.AcqP50us = round1(us(med.acqHist.ValueAtQuantile(50)))
		r.AcqP99us = round1(us(med.acqHist.ValueAtQuantile(99)))
		r.AcqP999us = round1(us(med.acqHist.ValueAtQuantile(99.9)))
		r.Runs = all
		r.RunsMetric = "p99_us"
		r.OpsCounting = "acquire and release each 1 op; latency per request"
		b.records = append(b.records, r)
	}
	return nil
}

// medianRun returns the run with the median key (the lower middle one for an even count) and
// every run's key, in run order.
func medianRun(runs []*pointResult, key func(*pointResult) float64) (*pointResult, []float64) {
	var all []float64
	for _, r := range runs {
		all = append(all, round1(key(r)))
	}
	sorted := append([]*pointResult(nil), runs...)
	sort.SliceStable(sorted, func(i, j int) bool { return key(sorted[i]) < key(sorted[j]) })
	return sorted[(len(sorted)-1)/2], all
}

// --- (c) -------------------------------------------------------------------------------------

func (b *bench) workloadC() error {
	o := b.o
	runs := map[string][]*pointResult{}
	for rep := 0; rep < o.repeat; rep++ {
		for _, sys := range o.systems {
			if sys == "null" {
				continue // no lock, nothing to contend for
			}
			if err := b.fresh(sys); err != nil {
				return err
			}
			if sys == "redis" {
				if err := redisFlush(b.addrOf(sys)); err != nil {
					return err
				}
			}
			var ws []worker
			for i := 0; i < o.workers; i++ {
				var w worker
				var err error
				switch sys {
				case "ticketing":
					w, err = newTkContended(b.addrOf(sys))
				case "redis":
					w, err = newRedisContended(b.addrOf(sys), b.redisSHA, i)
				case "etcd":
					w, err = newEtcdContended(b.addrOf(sys))
				}
				if err != nil {
					for _, w := range ws {
						w.close()
					}
					return fmt.Errorf("(c) %s: %w", sys, err)
				}
				ws = append(ws, w)
			}
			res, err := runPoint(b.server(sys).target(), ws, o.warmup, o.duration, o.drain, false)
			if err != nil {
				return fmt.Errorf("(c) %s: %w", sys, err)
			}
			mn, mx := minMax(res.perWorker)
			logf("(c) run %d/%d  %-9s %d workers  %9.0f acquisitions/s  %9.0f hand-offs/s  wait p99 %8.0f us  max %8.0f us  per worker min %d max %d",
				rep+1, o.repeat, sys, o.workers, res.opsPerSec(), handoffs(res), us(res.hist.ValueAtQuantile(99)), us(res.hist.Max()), mn, mx)
			runs[sys] = append(runs[sys], res)
		}
	}
	for _, sys := range o.systems {
		if len(runs[sys]) == 0 {
			continue
		}
		res, all := medianRun(runs[sys], handoffs)
		r := b.pointRecord(sys, "c_contended", o.workers, 1, 1, res)
		r.Runs = all
		r.RunsMetric = "handoffs_per_sec"
		r.Workers = o.workers
		r.OpsCounting = "ops_per_sec = acquisitions/s; handoffs_per_sec = acquisitions by a different worker than the previous holder; latencies are waits (first attempt to grant)"
		r.HandoffsPerSec = round1(handoffs(res))
		r.WaitP99us, r.WaitMaxUs = r.P99us, r.MaxUs
		r.AcqMin, r.AcqMax = minMax(res.perWorker)
		if r.AcqMax > 0 {
			r.AcqMinMax = round2(float64(r.AcqMin) / float64(r.AcqMax))
		}
		switch sys {
		case "ticketing":
			r.Note = "ACQUIRE waits in the server's FIFO queue (wait without limit); release at once"
		case "redis":
			r.Note = "SET NX PX; when taken sleep random 1-10 ms and retry; compare-and-delete release"
		case "etcd":
			r.Note = "concurrency.Mutex, one client and session per worker"
		}
		b.records = append(b.records, r)
	}
	return nil
}

func handoffs(p *pointResult) float64 {
	if p.window <= 0 {
		return 0
	}
	return float64(p.aux) / p.window
}

func minMax(v []int64) (lo, hi int64) {
	if len(v) == 0 {
		return 0, 0
	}
	lo, hi = v[0], v[0]
	for _, n := range v {
		lo, hi = min(lo, n), max(hi, n)
	}
	return lo, hi
}

// --- (d) -------------------------------------------------------------------------------------

func (b *bench) workloadD() error {
	o := b.o
	for _, sys := range o.systems {
		if sys == "null" {
			continue
		}
		if err := b.fresh(sys); err != nil {
			return err
		}
		srv := b.server(sys)
		before, _ := procStatusKB(srv.pid())
		resetPeakRSS(srv.pid())
		var h *heldResult
		var err error
		switch sys {
		case "ticketing":
			h, err = holdTicketing(srv.addr, o.held, o.heldTime)
		case "redis":
			h, err = holdRedis(srv.addr, o.held, o.heldTime)
		case "etcd":
			h, err = holdEtcd(srv.addr, o.held, o.heldTime)
		}
		if err != nil && h == nil {
			return fmt.Errorf("(d) %s: %w", sys, err)
		}
		if err != nil {
			logf("(d) %s: %v (after %d locks)", sys, err, h.held)
		}
		time.Sleep(time.Second) // idle: let the server settle
		rss, hwm := procStatusKB(srv.pid())
		h.closeAll()
		r := &Record{System: sys, Workload: "d_held_idle", Connections: heldConns, Pipeline: heldWindow, Keys: o.held,
			ServerRSSMaxKB: max(hwm, rss), ServerRSSKB: rss, RSSBeforeKB: before, HeldLocks: h.held,
			HeldSeconds: round2(h.seconds), IdleRSSKB: b.idleRSS[sys]}
		if h.seconds > 0 {
			r.OpsPerSec = round1(float64(h.held) / h.seconds)
		}
		if h.held > 0 {
			r.BytesPerLock = round1(float64(rss-before) * 1024 / float64(h.held))
		}
		r.OpsCounting = "acquisitions per second while taking the idle locks"
		if h.held < int64(o.held) {
			r.Note = fmt.Sprintf("only %d of %d locks taken within %v", h.held, o.held, o.heldTime)
		}
		logf("(d)       %-9s %d idle locks held in %.1fs: RSS %d KiB (before %d, peak %d; %.0f bytes/lock)",
			sys, h.held, h.seconds, rss, before, r.ServerRSSMaxKB, r.BytesPerLock)
		b.records = append(b.records, r)
	}
	return nil
}

// --- (e) -------------------------------------------------------------------------------------

// workloadE opens o.idleConns client connections that each do the least a client does
// (Ticketing: the handshake, a session each; Redis: PING) and stay idle; then reads the
// server's RSS. A lock service's clients are mostly idle: this is what each one costs.
func (b *bench) workloadE() error {
	o := b.o
	for _, sys := range o.systems {
		if sys != "ticketing" && sys != "redis" {
			continue
		}
		if err := b.fresh(sys); err != nil {
			return err
		}
		srv := b.server(sys)
		before, _ := procStatusKB(srv.pid())
		conns, err := openIdle(sys, srv.addr, o.idleConns)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return fmt.Errorf("(e) %s: %w (after %d connections)", sys, err, len(conns))
		}
		time.Sleep(time.Second) // idle: let the server settle
		rss, _ := procStatusKB(srv.pid())
		for _, c := range conns {
			c.Close()
		}
		r := &Record{System: sys, Workload: "e_idle_conns", Connections: len(conns), ServerRSSKB: rss, RSSBeforeKB: before}
		r.BytesPerConn = round1(float64(rss-before) * 1024 / float64(len(conns)))
		logf("(e)       %-9s %d idle connections: RSS %d KiB (before %d; %.0f bytes/connection)", sys, len(conns), rss, before, r.BytesPerConn)
		b.records = append(b.records, r)
	}
	return nil
}

// openIdle opens n connections to sys at addr, each past its first exchange, with no buffer kept
// on this side (n may be many thousands).
func openIdle(sys, addr string, n int) ([]net.Conn, error) {
	conns := make([]net.Conn, 0, n)
	pong := make([]byte, len("+PONG\r\n"))
	for len(conns) < n {
		var nc net.Conn
		var err error
		switch sys {
		case "ticketing":
			nc, _, err = dialTicketing(addr)
		case "redis":
			if nc, err = net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
				nc.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err = nc.Write([]byte("PING\r\n")); err == nil {
					_, err = io.ReadFull(nc, pong)
				}
				if err == nil && string(pong) != "+PONG\r\n" {
					err = fmt.Errorf("PING answered %q", pong)
				}
				nc.SetDeadline(time.Time{})
				if err != nil {
					nc.Close()
				}
			}
		}
		if err != nil {
			return conns, err
		}
		conns = append(conns, nc)
	}
	return conns, nil
}
