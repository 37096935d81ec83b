// Command goclient measures the Go client (clients/go, its public API only): pipelined
// acquire+release pairs per second on one client, which is one session on one connection —
// the same loop as the Rust and C clients' benchmark programs, so that the harness can run all
// of them against the same server in the same run.
//
//	goclient [-addr host:port] [-in-flight N] [-seconds S]
//
// N goroutines share the client; each takes its own key (try once, lease 30 s), releases it,
// and starts again. Prints one line of JSON:
//
//	{"client":"go","pairs":N,"seconds":S,"pairs_per_sec":R,"in_flight":C,"errors":E}
//
// Send it only to a server on loopback that you started for it; the run is bounded by S.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7070", "server address")
	inFlight := flag.Int("in-flight", 64, "acquire+release pairs in flight (goroutines sharing the client)")
	seconds := flag.Float64("seconds", 5, "measured time")
	loop := flag.String("loop", "", "failover mode: comma-separated endpoints of a cluster; see loopFailover")
	flag.Parse()
	if *loop != "" {
		os.Exit(loopFailover(strings.Split(*loop, ","), *seconds))
	}
	if *inFlight < 1 || *inFlight > 100000 || *seconds <= 0 || *seconds > 3600 {
		fmt.Fprintln(os.Stderr, "goclient: -in-flight 1..100000 and -seconds 0..3600")
		os.Exit(2)
	}
	ctx := context.Background()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := ticketing.Dial(dctx, ticketing.WithEndpoints(*addr))
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "goclientbench:", err)
		os.Exit(1)
	}
	var pairs, errs atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < *inFlight; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("bench-go-%d-%d", os.Getpid(), w)
			for !stop.Load() {
				lk, err := c.TryAcquire(ctx, key, 30*time.Second)
				if err != nil || lk == nil {
					errs.Add(1)
					continue
				}
				if err := lk.Release(ctx); err != nil {
					errs.Add(1)
					continue
				}
				pairs.Add(1)
			}
		}()
	}
	time.Sleep(time.Duration(*seconds * float64(time.Second)))
	n, took := pairs.Load(), time.Since(start).Seconds()
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		fmt.Fprintln(os.Stderr, "goclient: calls still in flight 10 s after the end")
	}
	fmt.Printf("{\"client\":\"go\",\"pairs\":%d,\"seconds\":%.3f,\"pairs_per_sec\":%.0f,\"in_flight\":%d,\"errors\":%d}\n",
		n, took, float64(n)/took, *inFlight, errs.Load())
	c.Close()
	if errs.Load() > 0 {
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
