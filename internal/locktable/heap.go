package locktable

// timerKind says what a pending deadline is for.
type timerKind uint8

const (
	tLease   timerKind = iota + 1 // idx is an entry: its holder's lease ends
	tDelay                        // idx is an entry: its lock-delay ends
	tWait                         // idx is a waiter: its wait timeout passes
	tSession                      // idx is a session slot: its grace after a detach ends
)

// timer is one deadline in the heap. Timers are ordered by (at, seq); seq is taken from
// Table.seq whenever a timer is set (or reset by Extend), so ties are resolved in the order the
// deadlines were set.
//
// Cancelling is lazy: the owner (entry or waiter) records the seq of its one live timer in tseq,
// and a heap item whose seq differs from its owner's tseq is stale. Stale items are dropped when
// they reach the top, or all at once when they outnumber the live ones. So a release costs no
// heap operation at all, and no back-pointers are maintained while sifting.
type timer struct {
	at   int64
	seq  uint64
	idx  int32
	kind timerKind
}

func timerLess(a, b *timer) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// live reports whether it is its owner's current timer.
func (t *Table) live(it *timer) bool {
	switch it.kind {
	case tWait:
		return t.waiters.at(it.idx).tseq == it.seq
	case tSession:
		return t.sess.slots[it.idx].tseq == it.seq
	}
	return t.entries.at(it.idx).tseq == it.seq
}

// pushTimer adds a deadline and returns its seq, which the caller stores in the owner's tseq.
func (t *Table) pushTimer(at int64, kind timerKind, idx int32) uint64 {
	t.seq++
	t.heap = append(t.heap, timer{at: at, seq: t.seq, idx: idx, kind: kind})
	t.siftUp(len(t.heap) - 1)
	return t.seq
}

// cancelTimer makes the timer whose seq is *tseq stale and clears *tseq.
func (t *Table) cancelTimer(tseq *uint64) {
	if *tseq == 0 {
		return
	}
	*tseq = 0
	t.stale++
	if t.stale > 64 && t.stale > len(t.heap)/2 {
		t.compact()
	}
}

// compact drops every stale timer and re-establishes the heap order in O(n).
func (t *Table) compact() {
	h := t.heap[:0]
	for i := range t.heap {
		if t.live(&t.heap[i]) {
			h = append(h, t.heap[i])
		}
	}
	clear(t.heap[len(h):])
	t.heap = h
	t.stale = 0
	for i := len(h)/2 - 1; i >= 0; i-- {
		t.siftDown(i)
	}
}

// top drops stale timers from the top of the heap and returns the earliest live one (nil if none).
func (t *Table) top() *timer {
	for len(t.heap) > 0 {
		if t.live(&t.heap[0]) {
			return &t.heap[0]
		}
		if t.stale > 64 && t.stale > len(t.heap)/4 {
			// Leases released soon after their grant leave stale items in deadline order, so
			// the top is stale again and again: one O(n) rebuild is cheaper than a pop each.
			t.compact()
			continue
		}
		t.popTimer()
		t.stale--
	}
	return nil
}

// popTimer removes the top of the heap.
func (t *Table) popTimer() {
	last := len(t.heap) - 1
	t.heap[0] = t.heap[last]
	t.heap = t.heap[:last]
	if last > 0 {
		t.siftDown(0)
	}
}

func (t *Table) siftUp(i int) {
	h := t.heap
	it := h[i]
	for i > 0 {
		p := (i - 1) / 2
		if !timerLess(&it, &h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = it
}

func (t *Table) siftDown(i int) {
	h := t.heap
	n := len(h)
	it := h[i]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && timerLess(&h[r], &h[c]) {
			c = r
		}
		if !timerLess(&h[c], &it) {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = it
}
