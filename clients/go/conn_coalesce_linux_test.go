//go:build linux

package ticketing

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// writeSyscalls is this process's count of write system calls (/proc/self/io, syscw: Linux,
// hence the build tag; every kernel our machines run accounts it).
func writeSyscalls(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Fatalf("reading the write-call count: %v", err)
	}
	for _, l := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(l, []byte("syscw: ")); ok {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no syscw line in /proc/self/io: %q", b)
	return 0
}

// TestWritesStayBatchedUnderManyCallers: 2,048 goroutines on one client, on one CPU (as in a
// container limited to one core), each looping TryAcquire + Release against the real server.
// The writer used to wait for other callers only when the reader's last batch held more than one
// answer; once the answers came one per read, each request went out in its own write, the
// server answered each in its own write too, and the connection stayed that way: 0.65 writes
// per pair and a fifth of the pairs per second (0.01 writes per pair with the fix).
func TestWritesStayBatchedUnderManyCallers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	c := dialT(t)
	ctx := context.Background()
	const callers = 2048
	prefix := fmt.Sprintf("%s-batch-", key(t))
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		pairs int64
	)
	w0 := writeSyscalls(t)
	deadline := time.Now().Add(time.Second)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := prefix + strconv.Itoa(i)
			n := int64(0)
			for time.Now().Before(deadline) {
				lk, err := c.TryAcquire(ctx, k, time.Minute)
				if err != nil || lk == nil {
					t.Errorf("TryAcquire: %v, %v", lk, err)
					return
				}
				if err := lk.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
				n++
			}
			mu.Lock()
			pairs += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	writes := writeSyscalls(t) - w0
	perPair := float64(writes) / float64(max(pairs, 1))
	t.Logf("%d pairs, %d write calls: %.3f per pair", pairs, writes, perPair)
	if pairs < callers {
		t.Fatalf("only %d pairs in 1 s", pairs)
	}
	if perPair > 0.2 {
		t.Fatalf("%.3f write calls per acquire+release pair (%d for %d): the requests go out one by one", perPair, writes, pairs)
	}
}
