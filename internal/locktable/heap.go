package locktable

// timerKind says what a pending deadline is for.
type timerKind uint8

const (
	tLease timerKind = iota + 1 // idx is an entry: its holder's lease ends
	tDelay                      // idx is an entry: its lock-delay ends
	tWait                       // idx is a waiter: its wait timeout passes
)

// timer is one pending deadline. Timers are ordered by (at, seq); seq is
// taken from Table.seq whenever a timer is set (or reset by Extend), so ties
// are resolved in the order the deadlines were set.
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

// setBack records heap position pos in the entry or waiter that owns
// t.heap[pos] (pos may be nilIdx after a removal, with it the removed item).
func (t *Table) setBack(it *timer, pos int32) {
	if it.kind == tWait {
		t.waiters.at(it.idx).timer = pos
	} else {
		t.entries.at(it.idx).timer = pos
	}
}

// pushTimer adds a deadline; the owner's back-pointer is set by siftUp.
func (t *Table) pushTimer(at int64, kind timerKind, idx int32) {
	t.seq++
	t.heap = append(t.heap, timer{at: at, seq: t.seq, idx: idx, kind: kind})
	t.siftUp(len(t.heap) - 1)
}

// removeTimer deletes the timer at heap position pos and clears its owner's
// back-pointer.
func (t *Table) removeTimer(pos int32) {
	h := t.heap
	last := len(h) - 1
	t.setBack(&h[pos], nilIdx)
	if int(pos) != last {
		h[pos] = h[last]
		t.heap = h[:last]
		t.fixTimer(int(pos))
	} else {
		t.heap = h[:last]
	}
}

// resetTimer gives the timer at pos a new deadline and a new seq (as if it had
// been removed and pushed again).
func (t *Table) resetTimer(pos int32, at int64) {
	t.seq++
	t.heap[pos].at = at
	t.heap[pos].seq = t.seq
	t.fixTimer(int(pos))
}

func (t *Table) fixTimer(i int) {
	if i > 0 && timerLess(&t.heap[i], &t.heap[(i-1)/2]) {
		t.siftUp(i)
	} else {
		t.siftDown(i)
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
		t.setBack(&h[i], int32(i))
		i = p
	}
	h[i] = it
	t.setBack(&h[i], int32(i))
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
		t.setBack(&h[i], int32(i))
		i = c
	}
	h[i] = it
	t.setBack(&h[i], int32(i))
}
