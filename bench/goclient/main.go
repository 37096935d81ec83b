// Command goclient measures the Go client (clients/go, its public API only) under the clients
// workload's program contract (bench/clients.go, BENCHMARKS.md "Clients"): one Client (one
// session on one connection, as Dial makes by default), N goroutines sharing it.
//
//	goclient --addr host:port --callers N --seconds S      (bench-run.sh runs it so)
//
// Each goroutine takes its own key (bench-<caller>, try once, lease 30 s: the key is never
// contended), releases it, and starts again. After 1 s of warm-up it counts pairs for S seconds
// and prints one line, {"pairs_per_sec": R, "errors": E}; more than 1% errors exits 1.
//
// With --loop it is the failover workloads' looping client instead (see loopFailover).
//
// Send it only to a server on loopback that you started for it; the run is bounded by S.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
)

// counter is one caller's counts, padded to a cache line of its own (no shared counter that
// the callers would contend for).
type counter struct {
	pairs, errs atomic.Int64
	_           [48]byte
}

func main() {
	addr := flag.String("addr", "127.0.0.1:7070", "server address")
	callers := flag.Int("callers", 1, "concurrent callers (goroutines sharing the one Client)")
	flag.IntVar(callers, "in-flight", 1, "the same as --callers (its earlier name)")
	seconds := flag.Float64("seconds", 5, "measured time, after 1 s of warm-up")
	loop := flag.String("loop", "", "failover mode: comma-separated endpoints of a cluster; see loopFailover")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the counted window here (go tool pprof)")
	flag.Parse()
	if *loop != "" {
		os.Exit(loopFailover(strings.Split(*loop, ","), *seconds))
	}
	if *callers < 1 || *callers > 100000 || *seconds <= 0 || *seconds > 3600 {
		fmt.Fprintln(os.Stderr, "goclient: --callers 1..100000 and --seconds 0..3600")
		os.Exit(2)
	}
	ctx := context.Background()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := ticketing.Dial(dctx, ticketing.WithEndpoints(*addr))
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "goclient:", err)
		os.Exit(1)
	}
	counts := make([]counter, *callers)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := 0; i < *callers; i++ {
		wg.Add(1)
		go func(n *counter, key string) {
			defer wg.Done()
			for !stop.Load() {
				lk, err := c.TryAcquire(ctx, key, 30*time.Second)
				if err != nil || lk == nil {
					n.errs.Add(1)
					continue
				}
				if err := lk.Release(ctx); err != nil {
					n.errs.Add(1)
					continue
				}
				n.pairs.Add(1)
			}
		}(&counts[i], fmt.Sprintf("bench-%d", i))
	}
	sum := func() (p, e int64) {
		for i := range counts {
			p += counts[i].pairs.Load()
			e += counts[i].errs.Load()
		}
		return p, e
	}
	time.Sleep(time.Second) // warm-up, not counted
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "goclient:", err)
			os.Exit(2)
		}
		pprof.StartCPUProfile(f)
		defer f.Close()
	}
	p0, e0 := sum()
	t0 := time.Now()
	time.Sleep(time.Duration(*seconds * float64(time.Second)))
	p1, e1 := sum()
	pprof.StopCPUProfile()
	took := time.Since(t0).Seconds()
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		fmt.Fprintln(os.Stderr, "goclient: calls still in flight 10 s after the end")
	}
	pairs, errs := p1-p0, e1-e0
	fmt.Printf("{\"pairs_per_sec\": %.1f, \"errors\": %d}\n", float64(pairs)/took, errs)
	c.Close()
	if errs*100 > pairs+errs {
		os.Exit(1)
	}
}

// loopFailover is the failover workload's looping client (bench/faults.go): one client with
// default options on every endpoint acquires a new key (lease 10 s, waiting up to 10 s) and
// releases it, again and again, for at most seconds or until stdin closes. It prints a line
// per outcome, "ok START_NS END_NS" after each acquire (when the call started and returned) and "err UNIX_NS MESSAGE" after each failure, so
// the harness reads when the client was served again after a fault.
func loopFailover(eps []string, seconds float64) int {
	ctx := context.Background()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, err := ticketing.Dial(dctx, ticketing.WithEndpoints(eps...))
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "goclient:", err)
		return 1
	}
	defer c.Close()
	var stop atomic.Bool
	go func() { // the harness closes stdin to stop the loop
		var b [1]byte
		os.Stdin.Read(b[:])
		stop.Store(true)
	}()
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for n := 0; !stop.Load() && time.Now().Before(end); n++ {
		start := time.Now().UnixNano()
		lk, err := c.Acquire(ctx, fmt.Sprintf("fo-go-%d-%d", os.Getpid(), n), 10*time.Second, ticketing.WithWaitTimeout(10*time.Second))
		if err != nil {
			fmt.Printf("err %d %s\n", time.Now().UnixNano(), strings.ReplaceAll(err.Error(), "\n", " "))
			time.Sleep(20 * time.Millisecond)
			continue
		}
		fmt.Printf("ok %d %d\n", start, time.Now().UnixNano())
		if err := lk.Release(ctx); err != nil {
			fmt.Printf("err %d release: %s\n", time.Now().UnixNano(), strings.ReplaceAll(err.Error(), "\n", " "))
		}
	}
	return 0
}
