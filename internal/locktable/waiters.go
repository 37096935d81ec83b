package locktable

import "math/bits"

// waiter is one queued acquire. Waiters live in Table.waiters and are recycled
// through a free list. A waiter is linked into four structures at once:
//   - its key's FIFO (qprev/qnext),
//   - the global FIFO of all waiters in the order they queued (gprev/gnext),
//     which gives Abort a deterministic order,
//   - its owner's list (oprev/onext), for DropOwner,
//   - the (owner, reqID) hash index (hnext), for Cancel and Duplicate.
type waiter struct {
	owner    Owner
	reqID    uint64
	lease    int64
	waitAt   int64 // wait deadline; meaningful only while tseq != 0
	since    int64 // when it queued
	entry    int32
	ownerRec int32
	tseq     uint64 // seq of the live wait timer; 0 if it waits without limit or tries once
	try      bool   // asked with wait 0: queued only while its key waits for storage

	qprev, qnext int32
	gprev, gnext int32
	oprev, onext int32
	hnext        int32 // (owner, reqID) bucket chain, or next free waiter
}

// ownerRec lists the queued acquires and the held locks of one owner. Records
// exist only while the owner has at least one of either.
type ownerRec struct {
	owner    Owner
	head     int32 // first waiter of this owner
	n        int
	hhead    int32 // first entry held by this owner
	nheld    int
	detached bool // grants to this owner are revocable (see Table.SetDetached)
	live     bool
	hnext    int32 // owner bucket chain, or next free record
}

// mum is the wyhash mixing step: the 128-bit product of a and b folded to 64
// bits. With secret per-table seeds mixed into both operands, request ids
// chosen by a client cannot be steered into one bucket.
func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

func (t *Table) reqHash(o Owner, reqID uint64) uint64 {
	return mum(uint64(o)^t.reqSeed[0], reqID^t.reqSeed[1])
}

func (t *Table) ownerHash(o Owner) uint64 {
	return mum(uint64(o)^t.ownerSeed[0], t.ownerSeed[1])
}

// findReq returns the queued acquire (owner, reqID), or nilIdx.
func (t *Table) findReq(o Owner, reqID uint64) int32 {
	h := t.reqHash(o, reqID)
	for i := t.rbuckets[h&uint64(len(t.rbuckets)-1)]; i != nilIdx; {
		w := t.waiters.at(i)
		if w.owner == o && w.reqID == reqID {
			return i
		}
		i = w.hnext
	}
	return nilIdx
}

func (t *Table) linkReq(i int32) {
	w := t.waiters.at(i)
	b := t.reqHash(w.owner, w.reqID) & uint64(len(t.rbuckets)-1)
	w.hnext = t.rbuckets[b]
	t.rbuckets[b] = i
}

func (t *Table) unlinkReq(i int32) {
	w := t.waiters.at(i)
	b := t.reqHash(w.owner, w.reqID) & uint64(len(t.rbuckets)-1)
	if t.rbuckets[b] == i {
		t.rbuckets[b] = w.hnext
		return
	}
	p := t.rbuckets[b]
	for t.waiters.at(p).hnext != i {
		p = t.waiters.at(p).hnext
	}
	t.waiters.at(p).hnext = w.hnext
}

// growReqs doubles the (owner, reqID) index; called before a waiter is added
// when the index is full (load factor 1).
func (t *Table) growReqs() {
	t.rbuckets = newBuckets(2 * len(t.rbuckets))
	for i := t.ghead; i != nilIdx; i = t.waiters.at(i).gnext {
		t.linkReq(i)
	}
}

// findOwner returns the record of owner o, or nilIdx.
func (t *Table) findOwner(o Owner) int32 {
	h := t.ownerHash(o)
	for i := t.obuckets[h&uint64(len(t.obuckets)-1)]; i != nilIdx; {
		r := &t.owners[i]
		if r.owner == o {
			return i
		}
		i = r.hnext
	}
	return nilIdx
}

// ownerFor returns the record of owner o, creating it if needed.
func (t *Table) ownerFor(o Owner) int32 {
	if i := t.findOwner(o); i != nilIdx {
		return i
	}
	if t.nowners >= len(t.obuckets) {
		nb := newBuckets(2 * len(t.obuckets))
		mask := uint64(len(nb) - 1)
		for i := range t.owners {
			r := &t.owners[i]
			if !r.live {
				continue // free record
			}
			b := t.ownerHash(r.owner) & mask
			r.hnext = nb[b]
			nb[b] = int32(i)
		}
		t.obuckets = nb
	}
	var i int32
	if t.freeO != nilIdx {
		i = t.freeO
		t.freeO = t.owners[i].hnext
	} else {
		t.owners = append(t.owners, ownerRec{})
		i = int32(len(t.owners) - 1)
	}
	b := t.ownerHash(o) & uint64(len(t.obuckets)-1)
	t.owners[i] = ownerRec{owner: o, head: nilIdx, hhead: nilIdx, live: true, hnext: t.obuckets[b]}
	t.obuckets[b] = i
	t.nowners++
	return i
}

// releaseOwner frees the (now empty) record i.
func (t *Table) releaseOwner(i int32) {
	r := &t.owners[i]
	b := t.ownerHash(r.owner) & uint64(len(t.obuckets)-1)
	if t.obuckets[b] == i {
		t.obuckets[b] = r.hnext
	} else {
		p := t.obuckets[b]
		for t.owners[p].hnext != i {
			p = t.owners[p].hnext
		}
		t.owners[p].hnext = r.hnext
	}
	r.live = false
	r.hnext = t.freeO
	t.freeO = i
	t.nowners--
}

// maybeReleaseOwner frees record i once it has neither waiters nor held locks.
func (t *Table) maybeReleaseOwner(i int32) {
	if r := &t.owners[i]; r.n == 0 && r.nheld == 0 {
		t.releaseOwner(i)
	}
}

// enqueue appends a new waiter to the FIFO of entry ei. wait == 0 only for a
// try-once acquire queued on a key that waits for storage.
func (t *Table) enqueue(now int64, ei int32, o Owner, reqID uint64, lease, wait int64) {
	if t.nwait >= len(t.rbuckets) {
		t.growReqs()
	}
	oi := t.ownerFor(o)
	var wi int32
	if t.freeW != nilIdx {
		wi = t.freeW
		t.freeW = t.waiters.at(wi).hnext
	} else {
		wi = t.waiters.add()
	}
	e := t.entries.at(ei)
	r := &t.owners[oi]
	*t.waiters.at(wi) = waiter{
		owner:    o,
		reqID:    reqID,
		lease:    lease,
		since:    now,
		entry:    ei,
		ownerRec: oi,
		try:      wait == 0,
		qprev:    e.qtail,
		qnext:    nilIdx,
		gprev:    t.gtail,
		gnext:    nilIdx,
		oprev:    nilIdx,
		onext:    r.head,
	}
	// Key FIFO.
	if e.qtail != nilIdx {
		t.waiters.at(e.qtail).qnext = wi
	} else {
		e.qhead = wi
	}
	e.qtail = wi
	e.nwait++
	// Global FIFO.
	if t.gtail != nilIdx {
		t.waiters.at(t.gtail).gnext = wi
	} else {
		t.ghead = wi
	}
	t.gtail = wi
	// Owner list (order irrelevant: push front).
	if r.head != nilIdx {
		t.waiters.at(r.head).oprev = wi
	}
	r.head = wi
	r.n++
	t.linkReq(wi)
	t.nwait++
	if t.obs != nil {
		t.obs.Queued(t.key(e), int(e.nwait))
	}
	if wait > 0 {
		at := addSat(now, wait)
		w := t.waiters.at(wi)
		w.waitAt = at
		w.tseq = t.pushTimer(at, tWait, wi)
	}
}

// removeWaiter unlinks waiter wi from every structure, cancels its wait timer
// and frees it. It never frees the key entry: callers call maybeFree or
// grant afterwards.
func (t *Table) removeWaiter(wi int32) {
	w := t.waiters.at(wi)
	e := t.entries.at(w.entry)
	if w.qprev != nilIdx {
		t.waiters.at(w.qprev).qnext = w.qnext
	} else {
		e.qhead = w.qnext
	}
	if w.qnext != nilIdx {
		t.waiters.at(w.qnext).qprev = w.qprev
	} else {
		e.qtail = w.qprev
	}
	e.nwait--

	if w.gprev != nilIdx {
		t.waiters.at(w.gprev).gnext = w.gnext
	} else {
		t.ghead = w.gnext
	}
	if w.gnext != nilIdx {
		t.waiters.at(w.gnext).gprev = w.gprev
	} else {
		t.gtail = w.gprev
	}

	r := &t.owners[w.ownerRec]
	if w.oprev != nilIdx {
		t.waiters.at(w.oprev).onext = w.onext
	} else {
		r.head = w.onext
	}
	if w.onext != nilIdx {
		t.waiters.at(w.onext).oprev = w.oprev
	}
	r.n--
	t.maybeReleaseOwner(w.ownerRec)

	t.unlinkReq(wi)
	t.cancelTimer(&w.tseq)
	w.hnext = t.freeW
	t.freeW = wi
	t.nwait--
}
