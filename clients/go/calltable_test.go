package ticketing

import (
	"math/rand/v2"
	"testing"
)

// TestCallTable checks the call table against a map under random puts and deletes: mostly of
// recent ids (as in flight), with some calls that stay long (a waiting ACQUIRE) and bursts.
func TestCallTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var tab callTable
	want := map[uint64]*call{}
	var live []uint64
	next := uint64(0)
	for step := 0; step < 300000; step++ {
		switch r := rng.IntN(100); {
		case r < 50 || len(live) == 0 || (r < 60 && len(live) < 2000):
			next++
			if rng.IntN(50) == 0 {
				next += uint64(rng.IntN(1 << 12)) // a gap (ids used by calls on no table)
			}
			cl := &call{}
			cl.req.ID = next
			tab.put(cl)
			want[next] = cl
			live = append(live, next)
		default:
			// Mostly one of the oldest; sometimes any.
			k := rng.IntN(min(len(live), 8))
			if rng.IntN(10) == 0 {
				k = rng.IntN(len(live))
			}
			id := live[k]
			live = append(live[:k], live[k+1:]...)
			if got := tab.del(id); got != want[id] {
				t.Fatalf("step %d: del(%d) = %p, want %p", step, id, got, want[id])
			}
			delete(want, id)
			if tab.del(id) != nil {
				t.Fatalf("step %d: %d deleted twice", step, id)
			}
		}
		if step%101 == 0 {
			if tab.len() != len(want) || len(tab.calls(nil)) != len(want) {
				t.Fatalf("step %d: %d calls (%d listed), want %d", step, tab.len(), len(tab.calls(nil)), len(want))
			}
			for id, cl := range want {
				if tab.get(id) != cl {
					t.Fatalf("step %d: get(%d) lost", step, id)
				}
			}
			if tab.get(next+1) != nil || tab.get(0) != nil {
				t.Fatalf("step %d: get of an absent id found a call", step)
			}
		}
	}
}
