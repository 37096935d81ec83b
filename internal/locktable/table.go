package locktable

import (
	"cmp"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/ticketing/ticketing/wire"
)

// Table is the lock table. The zero value is not usable; call New. A Table is
// not safe for concurrent use: the caller serialises every call.
//
// Invariants of the core (checked by the tests after every operation):
//   - a key is present iff it is held, in lock-delay, stalled, or has waiters;
//   - a key with waiters is held, in lock-delay or stalled (a free key never
//     has a queue: the head is granted the moment the key becomes free);
//   - held, in lock-delay and stalled are exclusive; a held key has exactly
//     one lease timer, a key in lock-delay exactly one delay timer, a stalled
//     key none and sits in the stalled list;
//   - a waiter has a wait timer iff it was queued with a wait > 0; a try-once
//     waiter (wait 0) only waits on a stalled key;
//   - a held key whose owner record exists is in that owner's held list;
//     revocable implies held.
type Table struct {
	cfg Config

	// Tokens: the last one handed out, and the durable bounds on grants (Config.Durable).
	lastToken  uint64
	tokenLimit uint64 // no grant may take a token above this
	horizon    int64  // no lease may end after this
	failing    bool   // storage cannot raise the bounds now: what needs them is refused

	// Keys: chained hash index over the entry slab.
	kseed    maphash.Seed
	kbuckets []int32
	entries  slab[entry]
	keys     keyStore // the entries' keys
	freeE    int32
	nkeys    int
	nheld    int

	// Entries waiting for storage, oldest first.
	shead, stail int32
	nstalled     int
	// The stalled entries that the pass begun by the last raise of the durable bounds has still
	// to try (resumeStalled); 0 when no pass is under way.
	resumeLeft int

	// Extends waiting for a durable horizon, oldest first.
	deferred []deferredExtend

	// Waiters: slab, global FIFO, (owner, reqID) index.
	waiters      slab[waiter]
	freeW        int32
	nwait        int
	ghead, gtail int32
	rbuckets     []int32

	// Owners with queued acquires or held locks.
	owners   []ownerRec
	freeO    int32
	nowners  int
	obuckets []int32

	reqSeed, ownerSeed [2]uint64 // secret seeds of the uint64-keyed indices

	tm  timers // pending deadlines (heap.go)
	seq uint64

	events  []Event
	scratch []int32 // DropOwner's list of entries

	sess sessions // the session layer's state (sessions.go)

	obs Observer // nil: no metrics

	// Cluster state: the state id (zero until INIT) and the nodes' client addresses.
	availFrom int64 // no grant before this time (Config.AvailableFrom; raised by INIT)
	stateID   [wire.StateIDSize]byte
	nodes     map[string]string
}

// deferredExtend is an EXTEND that needs a horizon beyond the durable one.
type deferredExtend struct {
	entry int32
	token uint64
	lease int64
	owner Owner
	reqID uint64
}

// New returns an empty table.
func New(cfg Config) *Table {
	t := &Table{
		cfg:        cfg,
		lastToken:  cfg.LastToken,
		tokenLimit: NoTokenLimit,
		horizon:    NoHorizon,
		availFrom:  cfg.AvailableFrom,
		kseed:      maphash.MakeSeed(),
		kbuckets:   newBuckets(minBuckets),
		freeE:      nilIdx,
		shead:      nilIdx,
		stail:      nilIdx,
		freeW:      nilIdx,
		ghead:      nilIdx,
		gtail:      nilIdx,
		rbuckets:   newBuckets(minBuckets),
		freeO:      nilIdx,
		obuckets:   newBuckets(minBuckets),
		reqSeed:    [2]uint64{rand.Uint64(), rand.Uint64()},
		ownerSeed:  [2]uint64{rand.Uint64(), rand.Uint64() | 1},
	}
	if cfg.Durable {
		t.tokenLimit = cfg.LastToken
		t.horizon = 0
	}
	t.sess.init(&t.cfg)
	return t
}

// SetObserver installs an observer (nil removes it). It is not part of the state.
func (t *Table) SetObserver(o Observer) { t.obs = o }

// SetLimits replaces the table's limits (the CONFIG command) after applying the deadlines up to
// now. They govern what comes next: a lowered limit refuses new keys, waiters, sessions, queued
// acquires and stored outcomes beyond it, but removes nothing already there; a lock-delay
// applies to the expiries from now on.
func (t *Table) SetLimits(now int64, l Limits) {
	now = t.tick(now)
	t.Advance(now)
	t.drain(now)
	t.cfg.setLimits(l)
	t.sess.limits(&t.cfg)
}

// Limits returns the limits in force.
func (t *Table) Limits() Limits { return t.cfg.Limits() }

// addSat returns now+d, saturated at math.MaxInt64 (d >= 0).
func addSat(now, d int64) int64 {
	if d > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + d
}

// canGrant reports whether a grant of lease at now is within the durable bounds.
func (t *Table) canGrant(now, lease int64) bool {
	return t.lastToken < t.tokenLimit && addSat(now, lease) <= t.horizon
}

// grantsAtOnce reports whether an Acquire of key with lease would be granted now, without
// queueing (the key is absent, within the limits and the durable bounds, outside the start-up
// wait).
func (t *Table) grantsAtOnce(now int64, key []byte, lease int64) bool {
	if ei, _ := t.lookup(key); ei != nilIdx {
		return false
	}
	return (t.cfg.MaxLocks == 0 || t.nkeys < t.cfg.MaxLocks) && now >= t.availFrom && t.canGrant(now, lease)
}

// Acquire asks for key on behalf of owner, request reqID. lease > 0 in ns
// (validated by the caller). wait: 0 = try once, < 0 = wait without limit,
// > 0 = wait at most that many ns.
//
// The checks, in order:
//  1. owner already has a queued acquire reqID (on any key): Duplicate.
//  2. the key is absent (hence free): if MaxLocks keys are present, Busy
//     (LimitLocks). Before the table's available-from time (Config.AvailableFrom,
//     or an INIT's) the new key enters lock-delay
//     until then and the checks below apply. If the grant is within the
//     durable bounds it happens: OK with a new token, the lease running from
//     now. Otherwise, a try-once acquire with storage failing is Busy
//     (LimitStorage); else the key is stalled (waiting for storage) and the
//     acquire queues on it, even a try-once one: Queued (a waiting acquire
//     waits for storage as long as its wait allows, failing or not).
//  3. wait == 0: TimedOut.
//  4. MaxWaitersPerKey, then MaxWaitersTotal reached: Busy with that Limit.
//  5. Queued at the tail of the key's FIFO. The outcome comes later as
//     EvGranted (lease from the hand-off), EvTimedOut, EvAborted or
//     EvStorageBusy; or never, if the caller removes it with Cancel or DropOwner.
//
// A present key is never free (it is held, in lock-delay, stalled or has
// waiters), so strict FIFO holds: nobody overtakes a queue. The same owner may
// queue behind its own lock: ownership is the token.
func (t *Table) Acquire(now int64, owner Owner, reqID uint64, key []byte, lease, wait int64) Result {
	if t.nwait > 0 && t.findReq(owner, reqID) != nilIdx {
		return Result{Status: Duplicate}
	}
	ei, h := t.lookup(key)
	if ei == nilIdx {
		if t.cfg.MaxLocks > 0 && t.nkeys >= t.cfg.MaxLocks {
			return Result{Status: Busy, Limit: LimitLocks}
		}
		switch {
		case now < t.availFrom:
			// Start-up wait: the key waits in lock-delay like one after an expiry.
			ei = t.insertKey(key, h)
			e := t.entries.at(ei)
			e.set(fInDelay, true)
			e.deadline = t.availFrom
			e.tseq = t.pushTimer(e.deadline, tDelay, ei)
		case t.canGrant(now, lease):
			ei = t.insertKey(key, h)
			tok := t.grant(now, now, ei, owner, reqID, lease, false)
			if t.obs != nil {
				t.obs.Granted(key, 0, false)
			}
			return Result{Status: OK, Token: tok, entry: ei}
		case t.failing && wait == 0:
			return Result{Status: Busy, Limit: LimitStorage}
		default:
			ei = t.insertKey(key, h)
			t.stall(ei)
			if t.cfg.MaxWaitersTotal > 0 && t.nwait >= t.cfg.MaxWaitersTotal {
				t.maybeFree(ei)
				return Result{Status: Busy, Limit: LimitWaitersTotal}
			}
			t.enqueue(now, ei, owner, reqID, lease, wait)
			return Result{Status: Queued}
		}
	}
	if wait == 0 {
		return Result{Status: TimedOut}
	}
	if t.cfg.MaxWaitersPerKey > 0 && int(t.entries.at(ei).nwait) >= t.cfg.MaxWaitersPerKey {
		return Result{Status: Busy, Limit: LimitWaitersPerKey}
	}
	if t.cfg.MaxWaitersTotal > 0 && t.nwait >= t.cfg.MaxWaitersTotal {
		return Result{Status: Busy, Limit: LimitWaitersTotal}
	}
	t.enqueue(now, ei, owner, reqID, lease, wait)
	return Result{Status: Queued}
}

// grant makes owner the holder of the free entry ei with a new token and a
// lease running from now (within the durable bounds: the caller checked); the
// acquire was queued at since. It returns the token. detached says whether the
// owner is detached (see SetDetached): such a grant is revocable.
func (t *Table) grant(now, since int64, ei int32, owner Owner, reqID uint64, lease int64, detached bool) uint64 {
	t.lastToken++
	tok := t.lastToken
	e := t.entries.at(ei)
	e.set(fHeld, true)
	e.holder = owner
	e.holderReq = reqID
	e.holderLeaseMs = msOf(lease)
	e.queuedMs = msOf(now - since)
	e.answers = 0
	e.token = tok
	e.grantedAt = now
	e.deadline = addSat(now, lease)
	t.nheld++
	e.tseq = t.pushTimer(e.deadline, tLease, ei)
	oi := t.ownerFor(owner)
	t.owners[oi].detached = detached
	e.set(fRevocable, detached)
	t.linkHeld(oi, ei)
	return tok
}

// linkHeld adds entry ei to the held list of owner record oi.
func (t *Table) linkHeld(oi, ei int32) {
	r := &t.owners[oi]
	e := t.entries.at(ei)
	e.orec = oi
	e.lprev = nilIdx
	e.lnext = r.hhead
	if r.hhead != nilIdx {
		t.entries.at(r.hhead).lprev = ei
	}
	r.hhead = ei
	r.nheld++
}

// unlinkHeld removes held entry ei from its owner's list (if it is on one) and
// frees the owner's record if it is now empty.
func (t *Table) unlinkHeld(ei int32) {
	e := t.entries.at(ei)
	oi := e.orec
	if oi == nilIdx {
		return
	}
	r := &t.owners[oi]
	if e.lprev != nilIdx {
		t.entries.at(e.lprev).lnext = e.lnext
	} else {
		r.hhead = e.lnext
	}
	if e.lnext != nilIdx {
		t.entries.at(e.lnext).lprev = e.lprev
	}
	e.orec, e.lprev, e.lnext = nilIdx, nilIdx, nilIdx
	r.nheld--
	t.maybeReleaseOwner(oi)
}

// unhold ends the hold of entry ei (released, expired or revoked: how): its lease
// timer is cancelled and it leaves its owner's list.
func (t *Table) unhold(now int64, ei int32, how EndReason) {
	e := t.entries.at(ei)
	if t.obs != nil {
		t.obs.Ended(t.key(e), now-e.grantedAt, how)
	}
	t.cancelTimer(&e.tseq)
	e.set(fHeld, false)
	e.set(fRevocable, false)
	t.nheld--
	t.unlinkHeld(ei)
}

// handOff is called when entry ei has just become free (released, expired
// without lock-delay, lock-delay over, revoked, or storage arrived): the head
// of its queue is granted at once (EvGranted, lease from now), or the entry is
// freed. If the grant is beyond the durable bounds the entry stalls instead,
// queue intact. Try-once waiters behind a grant time out (the key is taken).
func (t *Table) handOff(now int64, ei int32) {
	e := t.entries.at(ei)
	wi := e.qhead
	if wi == nilIdx {
		t.removeKey(ei)
		return
	}
	if now < t.availFrom {
		// Nothing is granted before the table's available-from time (a recovered or restored
		// state): the key waits in lock-delay until then, queue intact.
		e.set(fInDelay, true)
		e.deadline = t.availFrom
		e.tseq = t.pushTimer(e.deadline, tDelay, ei)
		return
	}
	w := t.waiters.at(wi)
	if !t.canGrant(now, w.lease) {
		t.stall(ei)
		return
	}
	owner, reqID, lease, since := w.owner, w.reqID, w.lease, w.since
	detached := t.owners[w.ownerRec].detached
	t.removeWaiter(wi) // may free the owner's record; grant re-creates it
	tok := t.grant(now, since, ei, owner, reqID, lease, detached)
	if t.obs != nil {
		t.obs.Granted(t.key(t.entries.at(ei)), now-since, true)
	}
	t.events = append(t.events, Event{
		Kind:  EvGranted,
		Owner: owner,
		ReqID: reqID,
		Token: tok,
		Lease: lease,
		Key:   t.key(t.entries.at(ei)),
		Since: since,
		entry: ei,
	})
	// Try-once waiters queued while the key waited for storage find it taken.
	for wi := t.entries.at(ei).qhead; wi != nilIdx; {
		w := t.waiters.at(wi)
		next := w.qnext
		if w.try {
			t.events = append(t.events, Event{Kind: EvTimedOut, Owner: w.owner, ReqID: w.reqID, Lease: w.lease, Key: t.key(t.entries.at(ei)), Since: w.since})
			t.removeWaiter(wi)
		}
		wi = next
	}
}

// stall puts entry ei (free, not in delay) in the stalled list: it waits for
// Ceiling.
func (t *Table) stall(ei int32) {
	e := t.entries.at(ei)
	e.set(fStalled, true)
	e.lnext = nilIdx
	e.lprev = t.stail
	if t.stail != nilIdx {
		t.entries.at(t.stail).lnext = ei
	} else {
		t.shead = ei
	}
	t.stail = ei
	t.nstalled++
}

// unstall removes entry ei from the stalled list.
func (t *Table) unstall(ei int32) {
	e := t.entries.at(ei)
	if e.lprev != nilIdx {
		t.entries.at(e.lprev).lnext = e.lnext
	} else {
		t.shead = e.lnext
	}
	if e.lnext != nilIdx {
		t.entries.at(e.lnext).lprev = e.lprev
	} else {
		t.stail = e.lprev
	}
	e.set(fStalled, false)
	e.lprev, e.lnext = nilIdx, nilIdx
	t.nstalled--
}

// maybeFree frees entry ei if it is idle (no holder, no delay, no waiters).
func (t *Table) maybeFree(ei int32) {
	e := t.entries.at(ei)
	if !e.held() && !e.inDelay() && e.nwait == 0 {
		if e.stalled() {
			t.unstall(ei)
		}
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
	if !e.held() || e.token != token {
		return NotHeld
	}
	t.unhold(now, ei, EndReleased)
	t.handOff(now, ei)
	return OK
}

// Extend sets the lease of the holder of key to end at now+lease, if token is
// the current holder's token (OK); otherwise it answers NotHeld and changes
// nothing. The new deadline may be earlier than the old one: the caller asked
// for it. For deadline ties the extended lease counts as set now. A lease that
// would end beyond the durable horizon is Deferred (answered later by
// EvExtended, EvExtendNotHeld or EvStorageBusy), or Busy (LimitStorage) while
// storage is failing. owner and reqID identify the request for those events.
func (t *Table) Extend(now int64, owner Owner, reqID uint64, key []byte, token uint64, lease int64) Result {
	ei, _ := t.lookup(key)
	if ei == nilIdx {
		return Result{Status: NotHeld}
	}
	e := t.entries.at(ei)
	if !e.held() || e.token != token {
		return Result{Status: NotHeld}
	}
	if addSat(now, lease) > t.horizon {
		if t.failing {
			return Result{Status: Busy, Limit: LimitStorage}
		}
		t.deferred = append(t.deferred, deferredExtend{entry: ei, token: token, lease: lease, owner: owner, reqID: reqID})
		return Result{Status: Deferred}
	}
	t.extend(now, ei, lease)
	return Result{Status: OK, Token: token}
}

func (t *Table) extend(now int64, ei int32, lease int64) {
	e := t.entries.at(ei)
	e.deadline = addSat(now, lease)
	t.cancelTimer(&e.tseq)
	e.tseq = t.pushTimer(e.deadline, tLease, ei)
}

// Cancel removes owner's queued acquire reqID and reports whether there was
// one. No event is emitted: the caller answers the request itself. A granted
// acquire is not queued any more and cannot be cancelled (release it, or
// Revoke it if revocable).
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

// Revoke takes back owner's revocable grant for request reqID, if there is
// one, and reports whether there was: the lock passes at once to the next
// waiter (no EvExpired, no lock-delay). See SetDetached.
func (t *Table) Revoke(now int64, owner Owner, reqID uint64) bool {
	ei := t.FindHeld(owner, reqID)
	if ei == nilIdx || !t.entries.at(ei).revocable() {
		return false
	}
	t.unhold(now, ei, EndRevoked)
	t.handOff(now, ei)
	return true
}

// FindHeld returns the entry that owner holds through request reqID, or
// nilIdx. It walks the owner's held locks.
func (t *Table) FindHeld(owner Owner, reqID uint64) int32 {
	oi := t.findOwner(owner)
	if oi == nilIdx {
		return nilIdx
	}
	for ei := t.owners[oi].hhead; ei != nilIdx; ei = t.entries.at(ei).lnext {
		if t.entries.at(ei).holderReq == reqID {
			return ei
		}
	}
	return nilIdx
}

// SetDetached records whether owner is detached (its session has no
// connection). Grants made to a detached owner are revocable; attaching
// (detached false) makes every revocable grant of the owner an ordinary one.
func (t *Table) SetDetached(owner Owner, detached bool) {
	oi := t.findOwner(owner)
	if oi == nilIdx {
		return
	}
	r := &t.owners[oi]
	r.detached = detached
	if !detached {
		for ei := r.hhead; ei != nilIdx; ei = t.entries.at(ei).lnext {
			t.entries.at(ei).set(fRevocable, false)
		}
	}
}

// DropOwner ends owner (its session ended): its queued acquires leave their
// queues (no events), its revocable grants are revoked, most recent grant
// first (the lock passes on at once), and its other held locks are forgotten by
// owner: they stay held until released by token or until their lease ends. It
// returns the number of waiters removed and of grants revoked.
func (t *Table) DropOwner(now int64, owner Owner) (waiters, revoked int) {
	oi := t.findOwner(owner)
	if oi == nilIdx {
		return 0, 0
	}
	for t.owners[oi].n > 0 {
		wi := t.owners[oi].head
		ei := t.waiters.at(wi).entry
		t.removeWaiter(wi) // may free the record: re-find it below
		t.maybeFree(ei)
		waiters++
		if oi = t.findOwner(owner); oi == nilIdx {
			return waiters, revoked
		}
	}
	// Most recent grant first (descending tokens): each revocation's hand-off takes the next
	// token, so the order must be a function of the replicated state, never of the held list's
	// own, which is history a snapshot does not keep.
	held := t.scratch[:0]
	for ei := t.owners[oi].hhead; ei != nilIdx; ei = t.entries.at(ei).lnext {
		held = append(held, ei)
	}
	slices.SortFunc(held, func(a, b int32) int { return cmp.Compare(t.entries.at(b).token, t.entries.at(a).token) })
	for _, ei := range held {
		if t.entries.at(ei).revocable() {
			t.unhold(now, ei, EndRevoked)
			t.handOff(now, ei)
			revoked++
		} else {
			t.unlinkHeld(ei)
		}
	}
	t.scratch = held[:0]
	return waiters, revoked
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
			Lease: w.lease,
			Key:   t.key(t.entries.at(ei)),
			Since: w.since,
		})
		t.removeWaiter(wi)
		t.maybeFree(ei)
	}
	for _, d := range t.deferred {
		t.events = append(t.events, Event{Kind: EvStorageBusy, Owner: d.owner, ReqID: d.reqID, Extend: true})
	}
	t.deferred = t.deferred[:0]
}

// raiseCeiling raises the durable bounds (Config.Durable): tokens up to tokenLimit and leases
// ending up to horizon may be granted. Bounds never go down. It begins a pass over what waits
// for them (resumeStalled).
func (t *Table) raiseCeiling(tokenLimit uint64, horizon int64) {
	if !t.cfg.Durable {
		return
	}
	t.tokenLimit = max(t.tokenLimit, tokenLimit)
	t.horizon = max(t.horizon, horizon)
	t.resumeLeft = t.nstalled
}

// resumeStalled goes on with the pass raiseCeiling began: up to max more stalled keys are
// handed off, oldest first (a key whose next grant still does not fit stalls again, behind the
// others); once every key stalled at the raise was tried, the deferred extends are applied in
// order. It reports whether keys are left for the pass.
//
// A node's first burst of acquires waits for its first horizon write (2,048 at 64 connections
// with 32 in flight each). Granted in one go, the event and output lists took room for all of
// them (about 350 KB), kept for reuse, resident for good; in steps of ceilingStep, with the
// outputs routed between steps (CeilingStep), they stay at the size of one step (issue 28).
func (t *Table) resumeStalled(now int64, max int) bool {
	n := min(t.resumeLeft, max)
	// Every key tried may produce an event: room for them at once (not by doubling, whose
	// outgrown arrays would stay resident until a collection that a busy node runs late).
	t.events = slices.Grow(t.events, min(n, t.nstalled))
	for ; n > 0 && t.shead != nilIdx; n-- {
		t.resumeLeft--
		ei := t.shead
		t.unstall(ei)
		t.handOff(now, ei)
	}
	if t.resumeLeft > 0 && t.shead != nilIdx {
		return true
	}
	t.resumeLeft = 0
	t.events = slices.Grow(t.events, len(t.deferred))
	kept := t.deferred[:0]
	for _, d := range t.deferred {
		e := t.entries.at(d.entry)
		switch {
		case !e.live() || !e.held() || e.token != d.token:
			t.events = append(t.events, Event{Kind: EvExtendNotHeld, Owner: d.owner, ReqID: d.reqID, Token: d.token})
		case addSat(now, d.lease) <= t.horizon:
			t.extend(now, d.entry, d.lease)
			t.events = append(t.events, Event{Kind: EvExtended, Owner: d.owner, ReqID: d.reqID, Token: d.token, Lease: d.lease, Key: t.key(e)})
		default:
			kept = append(kept, d)
		}
	}
	clear(t.deferred[len(kept):])
	t.deferred = kept
	return false
}

// SetStorageFailing records whether storage can raise the durable bounds. When
// it starts failing, what waits for storage and cannot wait is refused
// (EvStorageBusy): try-once acquires on stalled keys and deferred extends.
// Ordinary waiters on stalled keys keep their places (their wait timers run);
// the keys resume in order once Ceiling raises the bounds.
func (t *Table) SetStorageFailing(now int64, failing bool) {
	if !t.cfg.Durable || t.failing == failing {
		return
	}
	t.failing = failing
	if !failing {
		return
	}
	for ei := t.shead; ei != nilIdx; {
		next := t.entries.at(ei).lnext
		for wi := t.entries.at(ei).qhead; wi != nilIdx; {
			w := t.waiters.at(wi)
			nw := w.qnext
			if w.try {
				t.events = append(t.events, Event{Kind: EvStorageBusy, Owner: w.owner, ReqID: w.reqID, Lease: w.lease, Key: t.key(t.entries.at(ei)), Since: w.since})
				t.removeWaiter(wi)
			}
			wi = nw
		}
		t.maybeFree(ei)
		ei = next
	}
	for _, d := range t.deferred {
		t.events = append(t.events, Event{Kind: EvStorageBusy, Owner: d.owner, ReqID: d.reqID, Extend: true})
	}
	t.deferred = t.deferred[:0]
}

// StorageNeeds is the highest lease end the durable horizon must cover for the grants waiting
// for storage now (stalled heads, deferred extends), each given its lease from now.
func (t *Table) StorageNeeds(now int64) (leaseEnd int64) {
	for ei := t.shead; ei != nilIdx; ei = t.entries.at(ei).lnext {
		if wi := t.entries.at(ei).qhead; wi != nilIdx {
			leaseEnd = max(leaseEnd, addSat(now, t.waiters.at(wi).lease))
		}
	}
	for _, d := range t.deferred {
		leaseEnd = max(leaseEnd, addSat(now, d.lease))
	}
	return leaseEnd
}

// StorageWaiting reports whether anything waits for storage. While a pass begun by a raise of
// the bounds is under way (CeilingStep), what it has yet to try waits for that pass, not for
// storage: false.
func (t *Table) StorageWaiting() bool {
	return t.resumeLeft == 0 && (t.nstalled > 0 || len(t.deferred) > 0)
}

// Bounds returns the durable bounds in force and whether storage is failing.
func (t *Table) Bounds() (tokenLimit uint64, horizon int64, failing bool) {
	return t.tokenLimit, t.horizon, t.failing
}

// LastToken returns the last token handed out.
func (t *Table) LastToken() uint64 { return t.lastToken }

// MaxDeadline returns the latest lease end among the locks held now (0 if none).
func (t *Table) MaxDeadline() int64 {
	var m int64
	for i := int32(0); i < t.entries.n; i++ {
		if e := t.entries.at(i); e.live() && e.held() {
			m = max(m, e.deadline)
		}
	}
	return m
}

// Advance processes every pending deadline <= now, in deadline order (ties:
// the order the deadlines were set):
//   - a wait timeout: the waiter leaves its queue (EvTimedOut);
//   - a lease end: EvExpired for the holder, then, with Config.LockDelay > 0,
//     the key stays unavailable until now+LockDelay; otherwise the head of
//     the queue is granted (EvGranted) or the key freed;
//   - a lock-delay end: the head of the queue is granted or the key freed;
//   - a session's grace end (tSession): the session layer ends the session.
//
// Grants made by Advance start their lease at now (not at the expired
// deadline), so a late Advance never cuts a lease short; likewise lock-delay
// runs from now. Every timer Advance sets lies after now (unless deadlines
// saturate at math.MaxInt64), so one call does not cascade.
func (t *Table) Advance(now int64) {
	if now < t.tm.floor {
		return // nothing is due (the usual case: one comparison per call)
	}
	for {
		top := t.top()
		if top == nil || top.at > now {
			return
		}
		tm := *top
		t.popTop()
		switch tm.kind {
		case tWait:
			t.waiters.at(tm.idx).tseq = 0 // fired, not cancelled
			w := t.waiters.at(tm.idx)
			ei := w.entry
			if t.obs != nil {
				t.obs.TimedOut(t.key(t.entries.at(ei)), now-w.since)
			}
			t.events = append(t.events, Event{
				Kind:  EvTimedOut,
				Owner: w.owner,
				ReqID: w.reqID,
				Lease: w.lease,
				Key:   t.key(t.entries.at(ei)),
				Since: w.since,
			})
			t.removeWaiter(tm.idx)
			t.maybeFree(ei)
		case tLease:
			e := t.entries.at(tm.idx)
			e.tseq = 0
			t.events = append(t.events, Event{
				Kind:  EvExpired,
				Owner: e.holder,
				ReqID: e.holderReq,
				Token: e.token,
				Key:   t.key(e),
				Since: e.grantedAt,
			})
			t.unhold(now, tm.idx, EndExpired)
			if t.cfg.LockDelay > 0 {
				e.set(fInDelay, true)
				e.deadline = addSat(now, t.cfg.LockDelay)
				e.tseq = t.pushTimer(e.deadline, tDelay, tm.idx)
			} else {
				t.handOff(now, tm.idx)
			}
		case tDelay:
			e := t.entries.at(tm.idx)
			e.tseq = 0
			e.set(fInDelay, false)
			e.deadline = 0
			t.handOff(now, tm.idx)
		case tSession:
			t.sess.slots[tm.idx].tseq = 0
			t.expireSession(now, tm.idx)
		}
	}
}

// DeadlineFloor is a time no pending deadline is earlier than (math.MaxInt64: none is
// pending), without looking for the earliest: NextDeadline >= DeadlineFloor. It is cheap
// enough to call after every batch.
func (t *Table) DeadlineFloor() int64 { return t.tm.floor }

// NextDeadline is the earliest pending deadline (lease end, wait timeout,
// lock-delay end, session grace end); false if there is none.
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
func (t *Table) ClearEvents() {
	clear(t.events)
	t.events = t.events[:0]
}

// Inspect reports the state of key; ok is false if the key is not present
// (free).
func (t *Table) Inspect(key []byte) (info Info, ok bool) {
	ei, _ := t.lookup(key)
	if ei == nilIdx {
		return Info{}, false
	}
	e := t.entries.at(ei)
	info.Waiters = int(e.nwait)
	info.Stalled = e.stalled()
	if e.held() {
		info.Held = true
		info.Holder = e.holder
		info.HolderReqID = e.holderReq
		info.Token = e.token
		info.GrantedAt = e.grantedAt
		info.Deadline = e.deadline
		info.Revocable = e.revocable()
	}
	if e.inDelay() {
		info.DelayUntil = e.deadline
	}
	return info, true
}

// Stats reports the keys present, the locks held and the waiters queued.
func (t *Table) Stats() (keys, held, waiters int) {
	return t.nkeys, t.nheld, t.nwait
}
