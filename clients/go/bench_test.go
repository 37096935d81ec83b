package ticketing

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// Benchmarks against the shared server on loopback; RunParallel shows the pipelining (many
// goroutines, one connection, coalesced writes).

func BenchmarkPing(b *testing.B) {
	c, err := Dial(context.Background(), WithEndpoints(sharedAddr))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := c.Ping(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkAcquireRelease(b *testing.B) {
	c, err := Dial(context.Background(), WithEndpoints(sharedAddr))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprintf("bench/%d/%d", time.Now().UnixNano(), n.Add(1))
		for pb.Next() {
			lk, err := c.Acquire(ctx, key, time.Minute)
			if err != nil {
				b.Error(err)
				return
			}
			if err := lk.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestPingAllocs pins the allocations of a round trip on the steady-state path.
func TestPingAllocs(t *testing.T) {
	c := dialT(t)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(200, func() {
		if err := c.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})
	budget := 0.0
	if raceEnabled {
		budget = 2
	}
	if allocs > budget {
		t.Errorf("Ping allocates %v times per call, want <= %v (calls, timers and the write buffer are reused)", allocs, budget)
	}
}

// TestPairAllocs pins the allocations of an acquire+release pair on the steady-state path: the
// Lock, and nothing else (no timer, channel or key copy per lock or call), in 128 bytes.
func TestPairAllocs(t *testing.T) {
	c := dialT(t)
	ctx := context.Background()
	k := key(t)
	allocs := testing.AllocsPerRun(200, func() {
		lk, err := c.TryAcquire(ctx, k, time.Minute)
		if err != nil || lk == nil {
			t.Fatal(lk, err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	budget := 1.0
	if raceEnabled {
		budget = 4
	}
	if allocs > budget {
		t.Errorf("an acquire+release pair allocates %v times, want <= %v (the Lock)", allocs, budget)
	}
	if size := unsafe.Sizeof(Lock{}); unsafe.Sizeof(uintptr(0)) == 8 && size > 128 {
		t.Errorf("a Lock takes %d bytes, want <= 128 (the size class it fits now)", size)
	}
}
