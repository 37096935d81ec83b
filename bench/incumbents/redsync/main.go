// Command redsync-bench is the Go incumbent of the clients workload (bench/clients.go): the
// redsync lock library (github.com/go-redsync/redsync/v4) on one go-redis client with the pool
// go-redis makes by default, as redsync's README shows it, against the Redis server at --addr.
//
//	redsync-bench --addr host:port --callers N --seconds S
//
// N goroutines share the one client; each holds the library's own Mutex for its key
// (bench-<caller>, expiry 10 s, one try: the key is never contended), and loops TryLock, Unlock.
// After 1 s of warm-up it counts pairs for S seconds and prints one line:
// {"pairs_per_sec": R, "errors": E}; more than 1% errors exits 1.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredislib "github.com/redis/go-redis/v9"
)

// counter is one caller's counts, padded to a cache line of its own.
type counter struct {
	pairs, errs atomic.Int64
	_           [48]byte
}

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "Redis server address")
	callers := flag.Int("callers", 1, "concurrent callers (goroutines sharing the client)")
	seconds := flag.Float64("seconds", 5, "measured time, after 1 s of warm-up")
	flag.Parse()
	if *callers < 1 || *callers > 100000 || *seconds <= 0 || *seconds > 3600 {
		fmt.Fprintln(os.Stderr, "redsync-bench: --callers 1..100000 and --seconds 0..3600")
		os.Exit(2)
	}
	client := goredislib.NewClient(&goredislib.Options{Addr: *addr})
	rs := redsync.New(goredis.NewPool(client))
	ctx := context.Background()

	counts := make([]counter, *callers)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := 0; i < *callers; i++ {
		wg.Add(1)
		go func(c *counter, key string) {
			defer wg.Done()
			m := rs.NewMutex(key, redsync.WithExpiry(10*time.Second), redsync.WithTries(1))
			for !stop.Load() {
				if err := m.TryLockContext(ctx); err != nil {
					c.errs.Add(1)
					continue
				}
				if ok, err := m.UnlockContext(ctx); err != nil || !ok {
					c.errs.Add(1)
					continue
				}
				c.pairs.Add(1)
			}
		}(&counts[i], fmt.Sprintf("bench-%d", i))
	}
	os.Exit(measure(counts, *seconds, &stop, &wg))
}

// measure waits out the warm-up and the counted window, stops the callers and prints the line.
func measure(counts []counter, seconds float64, stop *atomic.Bool, wg *sync.WaitGroup) int {
	sum := func() (p, e int64) {
		for i := range counts {
			p += counts[i].pairs.Load()
			e += counts[i].errs.Load()
		}
		return p, e
	}
	time.Sleep(time.Second)
	p0, e0 := sum()
	t0 := time.Now()
	time.Sleep(time.Duration(seconds * float64(time.Second)))
	p1, e1 := sum()
	took := time.Since(t0).Seconds()
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		fmt.Fprintln(os.Stderr, "calls still in flight 10 s after the end")
	}
	pairs, errs := p1-p0, e1-e0
	fmt.Printf("{\"pairs_per_sec\": %.1f, \"errors\": %d}\n", float64(pairs)/took, errs)
	if errs*100 > pairs+errs {
		return 1
	}
	return 0
}
