package locktable

import (
	"hash/maphash"
	"math"
	"math/rand/v2"
)

// Table is the lock table. The zero value is not usable; call New. A Table is
// not safe for concurrent use: the caller serialises every call.
//
// Invariants (checked by the tests after every operation):
//   - a key is present iff it is held, in lock-delay, or has waiters;
//   - a key with waiters is held or in lock-delay (a free key never has a
//     queue: the head is granted the moment the key becomes free);
//   - held and in lock-delay are exclusive; a held key has exactly one lease
//     timer, a key in lock-delay exactly one delay timer;
//   - a waiter has a wait timer iff it was queued with a wait > 0.
type Table struct {
	cfg    Config
	tokens TokenSource

	// Keys: chained hash index over the entry slab.
	kseed    maphash.Seed
	kbuckets []int32
	entries  slab[entry]
	freeE    int32
	nkeys    int
	nheld    int

	// Waiters: slab, global FIFO, (owner, reqID) index.
	waiters      slab[waiter]
	freeW        int32
	nwait        int
	ghead, gtail int32
	rbuckets     []int32

	// Owners with queued acquires.
	owners   []ownerRec
	freeO    int32
	nowners  int
	obuckets []int32

	s0, s1, s2, s3 uint64 // hash seeds for the uint64-keyed indices

	heap  []timer
	seq   uint64
	stale int // heap items whose owner has cancelled them

	events []Event
}

// New returns an empty table. tokens is called once per grant.
func New(cfg Config, tokens TokenSource) *Table {
	return &Table{
		cfg:      cfg,
		tokens:   tokens,
		kseed:    maphash.MakeSeed(),
		kbuckets: newBuckets(minBuckets),
		freeE:    nilIdx,
		freeW:    nilIdx,
		ghead:    nilIdx,
		gtail:    nilIdx,
		rbuckets: newBuckets(minBuckets),
		freeO:    nilIdx,
		obuckets: newBuckets(minBuckets),
		s0:       rand.Uint64(),
		s1:       rand.Uint64(),
		s2:       rand.Uint64(),
		s3:       rand.Uint64() | 1,
	}
}

// addSat returns now+d, saturated at math.MaxInt64 (d >= 0).
func addSat(now, d int64) int64 {
	if d > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + d
}

// Acquire asks for key on behalf of owner, request reqID. lease > 0 in ns
// (validated by the caller). wait: 0 = try once, < 0 = wait without limit,
// > 0 = wait at most that many ns.
//
// The checks, in order:
//  1. owner already has a queued acquire reqID (on any key): Duplicate.
//  2. the key is absent (hence free): if MaxLocks keys are present, Busy
//     (LimitLocks); otherwise it is granted: OK with a new token, the lease
//     running from now (before Config.AvailableFrom the new key enters
//     lock-delay until then instead, and the checks below apply). A present key is never free (it is held, in
//     lock-delay or has waiters), so strict FIFO holds: nobody overtakes a
//     queue.
//  3. wait == 0: TimedOut.
//  4. MaxWaitersPerKey, then MaxWaitersTotal reached: Busy with that Limit.
//  5. Queued at the tail of the key's FIFO. The outcome comes later as
//     EvGranted (lease from the hand-off), EvTimedOut, or EvAborted; or never,
//     if the caller removes it with Cancel or DropOwner.
//
// The same owner may queue behind its own lock: ownership is the token.
func (t *Table) Acquire(now int64, owner Owner, reqID uint64, key []byte, lease, wait int64) Result {
	if t.nwait > 0 && t.findReq(owner, reqID) != nilIdx {
		return Result{Status: Duplicate}
	}
	ei, h := t.lookup(key)
	if ei == nilIdx {
		if t.cfg.MaxLocks > 0 && t.nkeys >= t.cfg.MaxLocks {
			return Result{Status: Busy, Limit: LimitLocks}
		}
		ei = t.insertKey(key, h)
		if now >= t.cfg.AvailableFrom {
			return Result{Status: OK, Token: t.grant(now, ei, owner, reqID, lease)}
		}
		e := t.entries.at(ei) // start-up grace: the key waits in lock-delay like one after an expiry
		e.inDelay = true
		e.delayUntil = t.cfg.AvailableFrom
		e.tseq = t.pushTimer(e.delayUntil, tDelay, ei)
	}
	if wait == 0 {
		return Result{Status: TimedOut}
	}
	if t.cfg.MaxWaitersPerKey > 0 && t.entries.at(ei).nwait >= t.cfg.MaxWaitersPerKey {
		return Result{Status: Busy, Limit: LimitWaitersPerKey}
	}
	if t.cfg.MaxWaitersTotal > 0 && t.nwait >= t.cfg.MaxWaitersTotal {
		return Result{Status: Busy, Limit: LimitWaitersTotal}
	}
	t.enqueue(now, ei, owner, reqID, lease, wait)
	return Result{Status: Queued}
}

// grant makes owner the holder of the free entry ei with a new token and a
// lease running from now. It returns the token.
func (t *Table) grant(now int64, ei int32, owner Owner, reqID uint64, lease int64) uint64 {
	tok := t.tokens.Next()
	e := t.entries.at(ei)
	e.held = true
	e.holder = owner
	e.holderReq = reqID
	e.token = tok
	e.grantedAt = now
	e.deadline = addSat(now, lease)
	t.nheld++
	e.tseq = t.pushTimer(e.deadline, tLease, ei)
	return tok
}

// handOff is called when entry ei has just become free (released, expired
// without lock-delay, or lock-delay over): the head of its queue is granted at
// once (EvGranted, lease from now), or the entry is freed.
func (t *Table) handOff(now int64, ei int32) {
	e := t.entries.at(ei)
	wi := e.qhead
	if wi == nilIdx {
		t.removeKey(ei)
		return
	}
	w := t.waiters.at(wi)
	owner, reqID, lease, since := w.owner, w.reqID, w.lease, w.since
	t.removeWaiter(wi)
	tok := t.grant(now, ei, owner, reqID, lease)
	t.events = append(t.events, Event{
		Kind:  EvGranted,
		Owner: owner,
		ReqID: reqID,
		Token: tok,
		Lease: lease,
		Key:   t.entries.at(ei).key,
		Since: since,
	})
}

// maybeFree frees entry ei if it is idle (no holder, no delay, no waiters).
func (t *Table) maybeFree(ei int32) {
	e := t.entries.at(ei)
	if !e.held && !e.inDelay && e.nwait == 0 {
		t.removeKey(ei)
	}
}

// Release ends the hold of token on key. If token is the current holder's
// token for key it answers OK and the lock passes at once to the head of the
// queue (EvGranted, lease from now), or the key is freed. Any other token
// (stale, expired, already released, another key's, made up) answers NotHeld
// and changes nothing. Release never causes lock-delay.
func (t *Table) Release(now int64, key []byte, token uint64) Status {
	ei, _ := t.lookup(key)
	if ei == nilIdx {
		return NotHeld
	}
	e := t.entries.at(ei)
	if !e.held || e.token != token {
		return NotHeld
	}
	t.cancelTimer(&e.tseq)
	e.held = false
	t.nheld--
	t.handOff(now, ei)
	return OK
}

// Extend sets the lease of the holder of key to end at now+lease, if token is
// the current holder's token (OK); otherwise it answers NotHeld and changes
// nothing. The new deadline may be earlier than the old one: the caller asked
// for it. For deadline ties the extended lease counts as set now.
func (t *Table) Extend(now int64, key []byte, token uint64, lease int64) Status {
	ei, _ := t.lookup(key)
	if ei == nilIdx {
		return NotHeld
	}
	e := t.entries.at(ei)
	if !e.held || e.token != token {
		return NotHeld
	}
	e.deadline = addSat(now, lease)
	t.cancelTimer(&e.tseq)
	e.tseq = t.pushTimer(e.deadline, tLease, ei)
	return OK
}

// Cancel removes owner's queued acquire reqID and reports whether there was
// one. No event is emitted: the caller answers the request itself. A granted
// acquire is not queued any more and cannot be cancelled (release it).
func (t *Table) Cancel(now int64, owner Owner, reqID uint64) bool {
	if t.nwait == 0 {
		return false
	}
	wi := t.findReq(owner, reqID)
	if wi == nilIdx {
		return false
	}
	ei := t.waiters.at(wi).entry
	t.removeWaiter(wi)
	t.maybeFree(ei)
	return true
}

// DropOwner removes all queued acquires of owner (its connection closed) and
// returns how many were removed. They are never granted afterwards, and no
// events are emitted for them. Locks the owner holds are untouched: they stay
// until released by token or until their lease ends.
func (t *Table) DropOwner(now int64, owner Owner) int {
	if t.nwait == 0 {
		return 0
	}
	oi := t.findOwner(owner)
	if oi == nilIdx {
		return 0
	}
	n := t.owners[oi].n
	for k := 0; k < n; k++ {
		wi := t.owners[oi].head
		ei := t.waiters.at(wi).entry
		t.removeWaiter(wi)
		t.maybeFree(ei)
	}
	return n
}

// Abort removes every queued acquire, emitting EvAborted for each in the order
// they were queued (across all keys). Holders and lock-delays are untouched.
func (t *Table) Abort(now int64) {
	for t.ghead != nilIdx {
		wi := t.ghead
		w := t.waiters.at(wi)
		ei := w.entry
		t.events = append(t.events, Event{
			Kind:  EvAborted,
			Owner: w.owner,
			ReqID: w.reqID,
			Key:   t.entries.at(ei).key,
			Since: w.since,
		})
		t.removeWaiter(wi)
		t.maybeFree(ei)
	}
}

// Advance processes every pending deadline <= now, in deadline order (ties:
// the order the deadlines were set):
//   - a wait timeout: the waiter leaves its queue (EvTimedOut);
//   - a lease end: EvExpired for the holder, then, with Config.LockDelay > 0,
//     the key stays unavailable until now+LockDelay; otherwise the head of
//     the queue is granted (EvGranted) or the key freed;
//   - a lock-delay end: the head of the queue is granted or the key freed.
//
// Grants made by Advance start their lease at now (not at the expired
// deadline), so a late Advance never cuts a lease short; likewise lock-delay
// runs from now. Every timer Advance sets lies after now (unless deadlines
// saturate at math.MaxInt64), so one call does not cascade.
func (t *Table) Advance(now int64) {
	for {
		top := t.top()
		if top == nil || top.at > now {
			return
		}
		tm := *top
		t.popTimer()
		if tm.kind == tWait {
			t.waiters.at(tm.idx).tseq = 0 // fired, not cancelled
		} else {
			t.entries.at(tm.idx).tseq = 0
		}
		switch tm.kind {
		case tWait:
			w := t.waiters.at(tm.idx)
			ei := w.entry
			t.events = append(t.events, Event{
				Kind:  EvTimedOut,
				Owner: w.owner,
				ReqID: w.reqID,
				Key:   t.entries.at(ei).key,
				Since: w.since,
			})
			t.removeWaiter(tm.idx)
			t.maybeFree(ei)
		case tLease:
			e := t.entries.at(tm.idx)
			t.events = append(t.events, Event{
				Kind:  EvExpired,
				Owner: e.holder,
				ReqID: e.holderReq,
				Token: e.token,
				Key:   e.key,
				Since: e.grantedAt,
			})
			e.held = false
			t.nheld--
			if t.cfg.LockDelay > 0 {
				e.inDelay = true
				e.delayUntil = addSat(now, t.cfg.LockDelay)
				e.tseq = t.pushTimer(e.delayUntil, tDelay, tm.idx)
			} else {
				t.handOff(now, tm.idx)
			}
		case tDelay:
			e := t.entries.at(tm.idx)
			e.inDelay = false
			e.delayUntil = 0
			t.handOff(now, tm.idx)
		}
	}
}

// NextDeadline is the earliest pending deadline (lease end, wait timeout,
// lock-delay end); false if there is none.
func (t *Table) NextDeadline() (int64, bool) {
	top := t.top()
	if top == nil {
		return 0, false
	}
	return top.at, true
}

// Events returns the events emitted since the last ClearEvents, in order. The
// slice is table memory: read it, then call ClearEvents (events accumulate
// until then).
func (t *Table) Events() []Event { return t.events }

// ClearEvents empties the event list, keeping its memory for reuse.
func (t *Table) ClearEvents() { t.events = t.events[:0] }

// Inspect reports the state of key; ok is false if the key is not present
// (free).
func (t *Table) Inspect(key []byte) (info Info, ok bool) {
	ei, _ := t.lookup(key)
	if ei == nilIdx {
		return Info{}, false
	}
	e := t.entries.at(ei)
	info.Waiters = e.nwait
	if e.held {
		info.Held = true
		info.Holder = e.holder
		info.HolderReqID = e.holderReq
		info.Token = e.token
		info.GrantedAt = e.grantedAt
		info.Deadline = e.deadline
	}
	if e.inDelay {
		info.DelayUntil = e.delayUntil
	}
	return info, true
}

// Stats reports the keys present, the locks held and the waiters queued.
func (t *Table) Stats() (keys, held, waiters int) {
	return t.nkeys, t.nheld, t.nwait
}
