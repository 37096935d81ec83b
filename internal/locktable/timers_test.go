package locktable

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestTimersAnyOrder sets lease deadlines in every order (several lease lengths interleaved,
// some far out of order, so that the sorted lanes, the heap and both kinds of compaction all
// see use), releases at random, and checks against a plain list: NextDeadline is always the
// earliest live lease, and Advance expires exactly the due ones, in (deadline, set order).
func TestTimersAnyOrder(t *testing.T) {
	steps := 20000
	if raceOn {
		steps = 4000
	}
	for seed, nkeys := range []int{40, 400, 3000} {
		rng := rand.New(rand.NewPCG(uint64(seed)+1, 7))
		tb := New(Config{})
		type held struct {
			tok   uint64
			dl    int64
			order int
		}
		live := map[string]held{}
		now, order := int64(1000), 0
		for step := 0; step < steps; step++ {
			switch r := rng.IntN(10); {
			case r < 5:
				k := fmt.Sprintf("k%d", rng.IntN(nkeys))
				if _, ok := live[k]; ok {
					continue
				}
				lease := int64(1+rng.IntN(8)) * 100000
				if rng.IntN(4) == 0 {
					lease = int64(1 + rng.IntN(5000000))
				}
				res := tb.Acquire(now, 1, uint64(step+1), []byte(k), lease, 0)
				if res.Status != OK {
					t.Fatalf("acquire %s: %+v", k, res)
				}
				order++
				live[k] = held{res.Token, now + lease, order}
			case r < 8:
				for k, h := range live {
					if tb.Release(now, []byte(k), h.tok) != OK {
						t.Fatalf("release %s", k)
					}
					delete(live, k)
					break
				}
			default:
				now += int64(rng.IntN(3000))
				tb.Advance(now)
				prev := held{dl: -1}
				for _, ev := range tb.Events() {
					h, ok := live[string(ev.Key)]
					if !ok || ev.Kind != EvExpired || h.tok != ev.Token || h.dl > now {
						t.Fatalf("seed %d step %d: unexpected %+v", seed, step, ev)
					}
					if h.dl < prev.dl || (h.dl == prev.dl && h.order < prev.order) {
						t.Fatalf("seed %d step %d: expiries out of order", seed, step)
					}
					prev = h
					delete(live, string(ev.Key))
				}
				tb.ClearEvents()
				for k, h := range live {
					if h.dl <= now {
						t.Fatalf("seed %d step %d: %s due at %d not expired at %d", seed, step, k, h.dl, now)
					}
				}
			}
			want, wok := int64(0), false
			for _, h := range live {
				if !wok || h.dl < want {
					want, wok = h.dl, true
				}
			}
			if got, ok := tb.NextDeadline(); ok != wok || got != want {
				t.Fatalf("seed %d step %d: next deadline %d %v, want %d %v", seed, step, got, ok, want, wok)
			}
			if step%211 == 0 {
				if err := tb.check(); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
			}
		}
	}
}

// BenchmarkWindow2048 has the shape of the server's pipelined load: 2048 locks held at any time,
// each released a window of operations after its grant, every lease 30 s, and Advance +
// NextDeadline after every 32 operations, as the server applies and rearms once per batch.
// One op = one acquire + one release.
func BenchmarkWindow2048(b *testing.B) {
	const window = 2048
	tb := New(Config{})
	keys := makeKeys(10000)
	toks := make([]uint64, len(keys))
	now := int64(1)
	step := func(i int) {
		k := i % len(keys)
		if i >= window {
			j := (i - window) % len(keys)
			tb.Release(now, keys[j], toks[j])
		}
		toks[k] = tb.Acquire(now, 1, uint64(i+1), keys[k], 30e9, 0).Token
		if i%32 == 0 {
			now += 1000
			tb.Advance(now)
			tb.NextDeadline()
		}
	}
	for i := 0; i < 50000; i++ {
		step(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 50000; i < 50000+b.N; i++ {
		step(i)
	}
}
