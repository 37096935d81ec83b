package locktable

import "math"

// timerKind says what a pending deadline is for.
type timerKind uint8

const (
	tLease   timerKind = iota + 1 // idx is an entry: its holder's lease ends
	tDelay                        // idx is an entry: its lock-delay ends
	tWait                         // idx is a waiter: its wait timeout passes
	tSession                      // idx is a session slot: its grace after a detach ends
)

// timer is one pending deadline. Timers are ordered by (at, seq); seq is taken from Table.seq
// whenever a timer is set (or reset by Extend), so ties are resolved in the order the deadlines
// were set.
//
// Pending timers live in a few sorted FIFO lanes and a binary heap (see timers). Most deadlines
// are set in order: a lease of the usual length set now ends after every lease of that length
// set before, so a lane takes it with an append and gives it back with a step of its head, with
// no sifting. A deadline earlier than the tail of every lane goes to the heap.
//
// Cancelling is lazy: the owner (entry or waiter) records the seq of its one live timer in tseq,
// and an item whose seq differs from its owner's tseq is stale. Stale items are dropped when
// they reach the front of their lane or the top of the heap, or all at once when they outnumber
// the live ones. So a release costs no timer work at all, and no back-pointers are maintained.
//
// Where a timer is kept is not part of the table's state: the earliest live timer by (at, seq)
// is the same whatever the layout, so the outputs are too.
type timer struct {
	at   int64
	seq  uint64
	idx  int32
	kind timerKind
}

// numLanes is the number of sorted lanes: one per deadline length in common use (a lease length,
// a wait timeout, a session grace) keeps every one of them out of the heap.
const numLanes = 4

// timers holds the pending deadlines: sorted lanes (each non-decreasing by (at, seq) from its
// head) and a heap for the rest. top and popTop find the earliest across all of them.
type timers struct {
	heap  []timer
	lanes [numLanes]lane
	used  int   // lanes[:used] have ever held a timer (a lane is used only when those before it are)
	stale int   // stale items, lanes and heap together
	floor int64 // no live timer is earlier (exact after top; lowered by every insert)
	src   int8  // where the timer last returned by top is: a lane, or -1 for the heap
}

// laneChunk is the number of timers per chunk of a lane (a power of two).
const (
	laneBits  = 8
	laneChunk = 1 << laneBits
	laneMask  = laneChunk - 1
)

// lane is a sorted FIFO: n items in (at, seq) order from offset head of chunks[0]. The items live
// in fixed-size chunks, so a push never copies or reallocates what is queued: a growing slice
// leaves each of its old arrays to the collector (a lane of 100,000 leases allocated about four
// times its final size on the way, still resident when the last lock was taken). Chunks the
// lane no longer needs are kept for its next pushes, as a slice keeps its capacity: a lane that
// grows back to a length it had allocates nothing.
type lane struct {
	chunks []*[laneChunk]timer
	free   []*[laneChunk]timer
	head   int
	n      int
}

func (l *lane) len() int { return l.n }

// at returns item i (0 <= i < n), the front being 0.
func (l *lane) at(i int) *timer {
	i += l.head
	return &l.chunks[i>>laneBits][i&laneMask]
}

func (l *lane) front() *timer { return &l.chunks[0][l.head] }

func (l *lane) back() *timer { return l.at(l.n - 1) }

// push appends it at the back.
func (l *lane) push(it timer) {
	i := l.head + l.n
	if i>>laneBits == len(l.chunks) {
		var c *[laneChunk]timer
		if k := len(l.free) - 1; k >= 0 {
			c, l.free[k] = l.free[k], nil
			l.free = l.free[:k]
		} else {
			c = new([laneChunk]timer)
		}
		l.chunks = append(l.chunks, c)
	}
	l.chunks[i>>laneBits][i&laneMask] = it
	l.n++
}

// popFront removes the front item.
func (l *lane) popFront() {
	l.head++
	l.n--
	switch {
	case l.head == laneChunk:
		first := l.chunks[0]
		last := copy(l.chunks, l.chunks[1:])
		l.chunks[last] = nil
		l.chunks = l.chunks[:last]
		l.head = 0
		l.free = append(l.free, first)
	case l.n == 0:
		l.head = 0 // the one chunk is filled again from its start
	}
}

// truncate keeps the first m items; the chunks past them go to the free list.
func (l *lane) truncate(m int) {
	l.n = m
	if m == 0 {
		l.head = 0
	}
	keep := max((l.head+m+laneMask)>>laneBits, min(1, len(l.chunks)))
	for i := keep; i < len(l.chunks); i++ {
		l.free = append(l.free, l.chunks[i])
		l.chunks[i] = nil
	}
	l.chunks = l.chunks[:keep]
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
	t.insertTimer(timer{at: at, seq: t.seq, idx: idx, kind: kind})
	return t.seq
}

// insertTimer puts it at the tail of the first lane it does not precede, else in the heap.
func (t *Table) insertTimer(it timer) {
	tm := &t.tm
	tm.floor = min(tm.floor, it.at)
	for k := range tm.lanes {
		l := &tm.lanes[k]
		if l.n > 0 && timerLess(&it, l.back()) {
			continue
		}
		tm.used = max(tm.used, k+1)
		l.push(it)
		return
	}
	tm.heap = append(tm.heap, it)
	t.siftUp(len(tm.heap) - 1)
}

// pending is the number of timer items held, stale ones included.
func (tm *timers) pending() int {
	n := len(tm.heap)
	for k := range tm.used {
		n += tm.lanes[k].len()
	}
	return n
}

// cancelTimer makes the timer whose seq is *tseq stale and clears *tseq.
func (t *Table) cancelTimer(tseq *uint64) {
	if *tseq == 0 {
		return
	}
	*tseq = 0
	t.tm.stale++
	t.dropStaleFronts()
	if t.tm.stale > 64 && t.tm.stale > t.tm.pending()/2 {
		t.compact()
	}
}

// dropStaleFronts drops the stale items at the front of every lane. Locks are mostly released
// in about the order they were granted, so this keeps the lanes short at a step per release,
// without waiting for a compaction (which checks every item, the live ones too).
func (t *Table) dropStaleFronts() {
	tm := &t.tm
	for k := range tm.used {
		l := &tm.lanes[k]
		for l.n > 0 && !t.live(l.front()) {
			l.popFront()
			tm.stale--
		}
	}
}

// compact drops every stale timer and re-establishes the heap order in O(n).
func (t *Table) compact() {
	tm := &t.tm
	for k := range tm.used {
		l := &tm.lanes[k]
		kept := 0
		for i := range l.n {
			if it := l.at(i); t.live(it) {
				*l.at(kept) = *it
				kept++
			}
		}
		l.truncate(kept)
	}
	h := tm.heap[:0]
	for i := range tm.heap {
		if t.live(&tm.heap[i]) {
			h = append(h, tm.heap[i])
		}
	}
	clear(tm.heap[len(h):])
	tm.heap = h
	tm.stale = 0
	for i := len(h)/2 - 1; i >= 0; i-- {
		t.siftDown(i)
	}
}

// top drops stale timers ahead of the earliest live one and returns it (nil if none); popTop
// removes it.
func (t *Table) top() *timer {
	tm := &t.tm
	var best *timer
	tm.src = -1
	if tm.stale > 0 {
		t.dropStaleFronts()
	}
	for k := range tm.used {
		l := &tm.lanes[k]
		if l.n == 0 {
			continue
		}
		if f := l.front(); best == nil || timerLess(f, best) {
			best, tm.src = f, int8(k)
		}
	}
	for len(tm.heap) > 0 {
		if t.live(&tm.heap[0]) {
			if best == nil || timerLess(&tm.heap[0], best) {
				best, tm.src = &tm.heap[0], -1
			}
			break
		}
		if tm.stale > 64 && tm.stale > tm.pending()/4 {
			// Leases released soon after their grant leave stale items in deadline order, so
			// the top is stale again and again: one O(n) rebuild is cheaper than a pop each.
			t.compact()
			return t.top()
		}
		t.popHeap()
		tm.stale--
	}
	tm.floor = math.MaxInt64
	if best != nil {
		tm.floor = best.at
	}
	return best
}

// popTop removes the timer the last call of top returned.
func (t *Table) popTop() {
	tm := &t.tm
	if tm.src < 0 {
		t.popHeap()
		return
	}
	tm.lanes[tm.src].popFront()
}

// popHeap removes the top of the heap.
func (t *Table) popHeap() {
	h := t.tm.heap
	last := len(h) - 1
	h[0] = h[last]
	t.tm.heap = h[:last]
	if last > 0 {
		t.siftDown(0)
	}
}

func (t *Table) siftUp(i int) {
	h := t.tm.heap
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
	h := t.tm.heap
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
