package locktable

import "testing"

// BenchmarkSnapshot100kHeld: one Snapshot of a table holding 100,000 locks (a replica's
// fsm.Snapshot serialises this much for a log compaction).
func BenchmarkSnapshot100kHeld(b *testing.B) {
	tb := New(Config{})
	for _, k := range makeKeys(100000) {
		tb.Acquire(0, 1, 0, k, 1e15, 0)
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(tb.Snapshot()) == 0 {
			b.Fatal("empty snapshot")
		}
	}
}
