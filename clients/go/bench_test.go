package ticketing

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
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
