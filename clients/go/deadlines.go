package ticketing

import "time"

// Deadlines without a runtime timer each: the request timeouts of the calls in flight and the
// lost-signal times of the locks held are each kept in a min-heap under Client.mu, watched by one
// timer per heap. A call or a lock then costs a heap insert and removal under a mutex its path
// holds anyway, rather than a timer's allocation, arming and stopping in the runtime (an
// acquire+release pair used to arm three timers).

// deadlineHeap is a min-heap of elements by deadline (ns on the client's monotonic clock). Each
// element keeps its position in an int32 of its own (1 + its index; 0: not in the heap), which the
// heap updates as it moves the element. Removal is lazy: the entry is marked dead and left in
// place, to be dropped when it reaches the top or when dead entries outnumber live ones twice
// (then the heap is rebuilt from the live ones). With deadlines that mostly grow (the same
// timeout or lease, again and again), an insert is then one comparison and a removal a store,
// where an eager removal would sift an entry down the whole heap.
type deadlineHeap[T any] struct {
	items []heapItem[T]
	dead  int // entries marked dead
}

type heapItem[T any] struct {
	at  int64
	pos *int32 // nil: dead
	x   T
}

// first is the live element with the earliest deadline, and that deadline; ok is false when
// there is none.
func (h *deadlineHeap[T]) first() (x T, at int64, ok bool) {
	for len(h.items) > 0 && h.items[0].pos == nil {
		h.popDead()
	}
	if len(h.items) == 0 {
		return x, 0, false
	}
	return h.items[0].x, h.items[0].at, true
}

// set puts x (its position in *pos) in the heap with deadline at, instead of its earlier
// deadline if it is in the heap already.
func (h *deadlineHeap[T]) set(x T, pos *int32, at int64) {
	h.remove(pos)
	h.items = append(h.items, heapItem[T]{at: at, pos: pos, x: x})
	*pos = int32(len(h.items))
	h.up(len(h.items) - 1)
}

// remove takes the element whose position is *pos out of the heap; nothing if it is not in it.
func (h *deadlineHeap[T]) remove(pos *int32) {
	if *pos == 0 {
		return
	}
	it := &h.items[*pos-1]
	*pos = 0
	*it = heapItem[T]{at: it.at} // dead; keeps its place in the order
	h.dead++
	if h.dead > 64 && h.dead > 2*(len(h.items)-h.dead) {
		h.compact()
	}
}

// popDead drops the top entry, which is dead.
func (h *deadlineHeap[T]) popDead() {
	last := len(h.items) - 1
	h.swap(0, last)
	h.items[last] = heapItem[T]{}
	h.items = h.items[:last]
	h.dead--
	h.down(0)
}

// compact rebuilds the heap from its live entries.
func (h *deadlineHeap[T]) compact() {
	live := h.items[:0]
	for _, it := range h.items {
		if it.pos != nil {
			live = append(live, it)
		}
	}
	clear(h.items[len(live):])
	h.items, h.dead = live, 0
	if cap(h.items) > 1024 && len(h.items) < cap(h.items)/4 {
		h.items = append([]heapItem[T](nil), h.items...) // do not keep a burst's array forever
	}
	for i := range h.items {
		*h.items[i].pos = int32(i + 1)
	}
	for i := len(h.items)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *deadlineHeap[T]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	if p := h.items[i].pos; p != nil {
		*p = int32(i + 1)
	}
	if p := h.items[j].pos; p != nil {
		*p = int32(j + 1)
	}
}

func (h *deadlineHeap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h.items[i].at >= h.items[p].at {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *deadlineHeap[T]) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.items[r].at < h.items[l].at {
			m = r
		}
		if h.items[m].at >= h.items[i].at {
			return
		}
		h.swap(i, m)
		i = m
	}
}

// mono is t on the client's monotonic clock, in ns: the request timeouts' unit.
func (c *Client) mono(t time.Time) int64 { return int64(t.Sub(c.epoch)) }

// monoNow is the monotonic clock now (Client.mono).
func (c *Client) monoNow() int64 { return int64(time.Since(c.epoch)) }

// alarm is the timer that watches a deadlineHeap, whose deadlines are readings of clock. It is
// moved earlier when an earlier deadline is added, but not later when the earliest one is
// removed: it then fires early, and its handler sets it again for the heap's first deadline.
// Guarded by Client.mu.
type alarm struct {
	clock func() int64
	t     *time.Timer
	set   bool
	armed int64 // when t fires (on clock), if set
}

func newAlarm(clock func() int64, f func()) alarm {
	t := time.AfterFunc(time.Hour, f)
	t.Stop()
	return alarm{clock: clock, t: t}
}

// want makes the alarm fire no later than at.
func (a *alarm) want(at int64) {
	if !a.set || at < a.armed {
		a.set, a.armed = true, at
		a.t.Reset(time.Duration(at - a.clock()))
	}
}

// fired is called first by the handler: the alarm is no longer set.
func (a *alarm) fired() { a.set = false }

func (a *alarm) stop() {
	a.t.Stop()
	a.set = false
}
