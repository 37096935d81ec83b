package ticketing

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestDeadlineHeap checks the lazy heap against a plain list under random sets, moves and
// removals, with deadlines that mostly grow (as the client's do) and some that do not.
func TestDeadlineHeap(t *testing.T) {
	type elem struct {
		id  int
		pos int32
		at  int64
		in  bool
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var h deadlineHeap[*elem]
	elems := make([]*elem, 300)
	for i := range elems {
		elems[i] = &elem{id: i}
	}
	clock := int64(0)
	check := func(step int) {
		t.Helper()
		var want []int64
		for _, e := range elems {
			if e.in {
				want = append(want, e.at)
				if e.pos == 0 || h.items[e.pos-1].x != e || h.items[e.pos-1].at != e.at {
					t.Fatalf("step %d: element %d at the wrong position %d", step, e.id, e.pos)
				}
			} else if e.pos != 0 {
				t.Fatalf("step %d: element %d removed but has position %d", step, e.id, e.pos)
			}
		}
		x, at, ok := h.first()
		if len(want) == 0 {
			if ok {
				t.Fatalf("step %d: first %d of an empty heap", step, x.id)
			}
			return
		}
		if !ok || at != slices.Min(want) || x.at != at {
			t.Fatalf("step %d: first %v %d, want deadline %d", step, ok, at, slices.Min(want))
		}
		if live := len(h.items) - h.dead; live != len(want) {
			t.Fatalf("step %d: %d live entries, want %d", step, live, len(want))
		}
		if h.dead > 64 && h.dead > 2*len(want) {
			t.Fatalf("step %d: %d dead entries for %d live ones", step, h.dead, len(want))
		}
	}
	for step := 0; step < 200000; step++ {
		clock += int64(rng.IntN(3))
		e := elems[rng.IntN(len(elems))]
		switch r := rng.IntN(10); {
		case r < 5: // (re)set: mostly later than everything so far
			at := clock + 1000
			if r == 0 {
				at = clock + int64(rng.IntN(2000))
			}
			h.set(e, &e.pos, at)
			e.at, e.in = at, true
		case r < 9:
			h.remove(&e.pos)
			e.in = false
		default: // expire what is due, as the alarms do
			for {
				x, at, ok := h.first()
				if !ok || at > clock {
					break
				}
				h.remove(&x.pos)
				x.in = false
			}
		}
		if step%97 == 0 {
			check(step)
		}
	}
	check(-1)
}
