package main

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// epoch is the harness's monotonic time base.
var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// newHist records nanoseconds from 1 µs to 60 s with 3 significant figures.
func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1000, 60_000_000_000, 3) }

// counter is an atomic count on its own cache line (workers publish, the runner reads).
type counter struct {
	atomic.Int64
	_ [56]byte
}

// runCtx is what the workers of one point share with the runner.
type runCtx struct {
	stop      atomic.Bool // workers stop starting new operations (and finish what they hold)
	measuring atomic.Bool // workers record latencies only inside the measured window
	counts    []counter   // per worker: operations completed (published by the worker)
	aux       []counter   // per worker: a second count ((c): hand-offs, grants from another worker)
	errs      []counter   // per worker: failed operations
	hists     []*hdrhistogram.Histogram
	acqHists  []*hdrhistogram.Histogram // per worker, when the point asks for it: acquires only
	deadline  time.Time                 // no I/O of this point runs past it

	// (c): the worker that holds (or last held) the lock. Written only by the holder, while it
	// holds the lock, so the sequence of holders is the real order of grants.
	lastHolder atomic.Int64
}

// worker drives one connection (or one client) of a point.
type worker interface {
	run(rc *runCtx, i int) error
	close()
}

// pointResult is what one run of one point measured.
type pointResult struct {
	ops       int64   // operations completed inside the window
	errs      int64   // failed operations (whole run)
	window    float64 // seconds
	perWorker []int64 // operations of each worker inside the window
	aux       int64   // sum of the aux counts inside the window
	hist      *hdrhistogram.Histogram
	acqHist   *hdrhistogram.Histogram // acquires only (nil unless asked for)
	rssMaxKB  int64
	anonKB    int64 // RssAnon and RssFile at the largest sampled RSS
	fileKB    int64
	cpuServer float64       // cores used by the server over the window
	cpuHarn   float64       // cores used by the harness over the window
	pingRTT   time.Duration // (a) at one connection: one PING's round trip right after (floor.go); 0: none
}

func (p *pointResult) opsPerSec() float64 {
	if p.window <= 0 {
		return 0
	}
	return float64(p.ops) / p.window
}

// target is the system a point measures: the process whose RSS is sampled and the processes
// whose CPU is counted.
type target struct {
	name  string
	pids  []int // pids[0]: RSS sampled (a cluster's leader); CPU summed over all of them
	alive func() bool
}

func (s *server) target() target { return target{name: s.name, pids: []int{s.pid()}, alive: s.alive} }

// runPoint runs workers for warmup+dur, measuring only the last dur, with the server's RSS
// sampled throughout. The workers are then asked to stop (releasing what they hold) and given
// drain to do so; every I/O is bounded by the point's deadline. With acq, the drivers also
// record the latency of acquires alone.
func runPoint(srv target, workers []worker, warmup, dur, drain time.Duration, acq bool) (*pointResult, error) {
	n := len(workers)
	rc := &runCtx{
		counts:   make([]counter, n),
		aux:      make([]counter, n),
		errs:     make([]counter, n),
		hists:    make([]*hdrhistogram.Histogram, n),
		deadline: time.Now().Add(warmup + dur + drain),
	}
	rc.lastHolder.Store(-1)
	for i := range rc.hists {
		rc.hists[i] = newHist()
	}
	if acq {
		rc.acqHists = make([]*hdrhistogram.Histogram, n)
		for i := range rc.acqHists {
			rc.acqHists[i] = newHist()
		}
	}
	mon := startMonitor(srv.pids)
	errCh := make(chan error, n)
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.run(rc, i); err != nil {
				errCh <- fmt.Errorf("worker %d: %w", i, err)
			}
		}()
	}
	snapshot := func() []int64 {
		s := make([]int64, 2*n)
		for i := range rc.counts {
			s[i] = rc.counts[i].Load()
			s[n+i] = rc.aux[i].Load()
		}
		return s
	}
	time.Sleep(warmup)
	rc.measuring.Store(true)
	s0 := snapshot()
	mon.windowStart()
	t0 := time.Now()
	time.Sleep(dur)
	s1 := snapshot()
	window := time.Since(t0).Seconds()
	mon.windowEnd()
	rc.measuring.Store(false)
	rc.stop.Store(true)

	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	var err error
	select {
	case <-finished:
	case <-time.After(time.Until(rc.deadline) + 5*time.Second):
		err = fmt.Errorf("workers did not finish within the drain time")
	}
	for _, w := range workers {
		w.close()
	}
	<-finished // closing the connections ends any blocked I/O
	res := &pointResult{window: window, perWorker: make([]int64, n), hist: newHist()}
	if acq {
		res.acqHist = newHist()
		for _, h := range rc.acqHists {
			res.acqHist.Merge(h)
		}
	}
	res.rssMaxKB = mon.stop()
	res.anonKB, res.fileKB = mon.anonAt, mon.fileAt
	res.cpuServer, res.cpuHarn = mon.cpuSrv, mon.cpuSelf
	for i := 0; i < n; i++ {
		res.perWorker[i] = s1[i] - s0[i]
		res.ops += res.perWorker[i]
		res.aux += s1[n+i] - s0[n+i]
		res.errs += rc.errs[i].Load()
		res.hist.Merge(rc.hists[i])
	}
	close(errCh)
	for e := range errCh {
		if err == nil {
			err = e
		}
	}
	if err == nil && srv.alive != nil && !srv.alive() {
		err = fmt.Errorf("%s exited during the run", srv.name)
	}
	return res, err
}
