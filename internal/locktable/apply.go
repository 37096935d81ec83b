package locktable

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/ticketing/ticketing/wire"
)

// Error messages as byte slices, so answering does not allocate.
var (
	msgRequestIDUsed = []byte(wire.MsgRequestIDUsed)
	msgRetryDiffers  = []byte(wire.MsgRetryDiffers)
	msgShuttingDown  = []byte(wire.MsgShuttingDown)
	msgInflight      = []byte(wire.MsgInflight)
	msgOutcomes      = []byte(wire.MsgOutcomes)
	msgPerKey        = []byte(wire.MsgWaitersPerKey)
	msgWaiters       = []byte(wire.MsgWaitersTotal)
	msgLocks         = []byte(wire.MsgLocks)
	msgStorage       = []byte(wire.MsgStorage)
	msgOp            = []byte(wire.MsgOp)
)

// Requests applies a batch of requests that arrived on connection conn of session owner, in
// order, after applying the deadlines up to now. The requests must have passed the
// connection-local checks (flags, request id non-zero, known op, key length, lease range,
// non-zero tokens: the server's validate step). A batch from a connection that is not (or no
// longer) the session's current one is ignored: a session is served only on its newest
// connection. Answers and pushes come out through Outs.
func (t *Table) Requests(now int64, owner Owner, conn uint64, reqs []wire.Request) {
	now = t.tick(now)
	t.Advance(now)
	t.drain(now)
	i := t.sess.slotOf(owner)
	if i == noSession || conn == 0 || t.sess.slots[i].conn != conn {
		return
	}
	for k := range reqs {
		t.request(now, i, &reqs[k])
		t.drain(now)
	}
}

// Tick applies the deadlines up to now.
func (t *Table) Tick(now int64) {
	now = t.tick(now)
	t.Advance(now)
	t.drain(now)
}

// Ceiling raises the durable bounds (Config.Durable) after applying the deadlines up to now:
// tokens up to tokenLimit and leases ending up to horizon may be granted; bounds never go down.
// Stalled keys are then handed off in the order they stalled, and deferred extends applied in
// order (EvExtended or EvExtendNotHeld); what still does not fit stays waiting.
func (t *Table) Ceiling(now int64, tokenLimit uint64, horizon int64) {
	t.CeilingStep(now, tokenLimit, horizon, math.MaxInt)
}

// CeilingStep is Ceiling in steps: it raises the durable bounds and hands off at most max of
// the stalled keys; it reports whether more are left, for ResumeStalled to hand off once the
// outputs so far are routed (see resumeStalled). The state at the end of the steps is the one
// Ceiling leaves.
func (t *Table) CeilingStep(now int64, tokenLimit uint64, horizon int64, max int) bool {
	now = t.tick(now)
	t.Advance(now)
	t.raiseCeiling(tokenLimit, horizon)
	more := t.resumeStalled(now, max)
	t.drain(now)
	return more
}

// ResumeStalled hands off at most max more of the keys left by CeilingStep, after applying the
// deadlines up to now, and reports whether any are still left. Call it only while the last
// CeilingStep or ResumeStalled reported more (the end of a pass applies the deferred extends).
func (t *Table) ResumeStalled(now int64, max int) bool {
	now = t.tick(now)
	t.Advance(now)
	more := t.resumeStalled(now, max)
	t.drain(now)
	return more
}

// Storage records whether storage is failing (see SetStorageFailing).
func (t *Table) Storage(now int64, failing bool) {
	now = t.tick(now)
	t.Advance(now)
	t.SetStorageFailing(now, failing)
	t.drain(now)
}

// Stop begins a graceful stop of a single node: every queued acquire is answered
// SHUTTING_DOWN, every holder is told EXPIRED with reason STOPPING (its lease still runs), and
// from now on ACQUIRE and EXTEND answer SHUTTING_DOWN.
func (t *Table) Stop(now int64) {
	now = t.tick(now)
	t.Advance(now)
	t.drain(now)
	t.sess.stopping = true
	t.Abort(now)
	t.drain(now)
	// Holders in token order (grant order), so the notices do not depend on memory layout.
	var held []int32
	for ei := int32(0); ei < t.entries.n; ei++ {
		if e := t.entries.at(ei); e.live() && e.held() {
			held = append(held, ei)
		}
	}
	slices.SortFunc(held, func(a, b int32) int { return cmp.Compare(t.entries.at(a).token, t.entries.at(b).token) })
	for _, ei := range held {
		e := t.entries.at(ei)
		if i := t.sess.slotOf(e.holder); i != noSession {
			t.out(t.sess.slots[i].conn, wire.Response{Op: wire.OpExpired, Token: e.token, Detail: wire.ExpiredStopping, Data: t.keep(t.key(e))})
		}
	}
}

// keep copies b into the outputs' scratch memory: key buffers of the table may be reused by a
// later request of the same batch, before the outputs are routed.
func (t *Table) keep(b []byte) []byte {
	sc := t.sess.scratch
	n := len(sc)
	sc = append(sc, b...)
	t.sess.scratch = sc
	return sc[n:len(sc):len(sc)]
}

// Now returns the table's time: the latest time passed to it.
func (t *Table) Now() int64 { return t.sess.now }

// out adds r for connection conn to the outputs. It is not inlined: every call site would keep
// a Response and an Out of its own on the stack; inlined into run, those made its frame 1.6 KB,
// enough to take every connection's reader goroutine from a 4 KB to an 8 KB stack.
//
//go:noinline
func (t *Table) out(conn uint64, r wire.Response) {
	t.sess.outs = append(t.sess.outs, Out{Conn: conn, Resp: r})
}

// reply adds an answer for session i's connection and returns it to be filled in place: the
// hot answers are written field by field where they end up, instead of being built on the
// stack and copied into the outputs in 16-byte pieces that straddle the fields' stores (each
// such load stalls: no store forwarding).
func (t *Table) reply(i int32, op wire.Op, st wire.Status, id uint64) *wire.Response {
	return t.outFor(t.sess.slots[i].conn, op, st, id)
}

func (t *Table) outFor(conn uint64, op wire.Op, st wire.Status, id uint64) *wire.Response {
	t.sess.outs = append(t.sess.outs, Out{})
	o := &t.sess.outs[len(t.sess.outs)-1]
	o.Conn = conn
	r := &o.Resp
	r.Op, r.Status, r.ID = op, st, id
	return r
}

// answer sends r to session i's connection. Not inlined, like out.
//
//go:noinline
func (t *Table) answer(i int32, r wire.Response) {
	t.out(t.sess.slots[i].conn, r)
}

func (t *Table) answerInvalid(i int32, r *wire.Request, field uint32, msg []byte) {
	t.answer(i, wire.Response{Op: r.Op, Status: wire.StatusInvalid, ID: r.ID, Detail: field, Data: msg})
}

func leaseNs(ms uint32) int64 { return int64(ms) * nsPerMs }

func waitNs(ms uint32) int64 {
	if ms == wire.WaitForever {
		return -1
	}
	return int64(ms) * nsPerMs
}

// startupMsg is the message of a TIMED_OUT answered during the start-up wait (nil after it):
// otherwise a timeout on a key nobody holds would look unexplained.
func (t *Table) startupMsg(now int64) []byte {
	if now >= t.availFrom {
		return nil
	}
	return t.keep(fmt.Appendf(nil, wire.MsgStartup, msOf(t.availFrom-now)))
}

// answered counts a grant answer of held entry ei addressed to a connection (entry.answers).
func (t *Table) answered(ei int32) {
	if e := t.entries.at(ei); e.answers < 2 {
		e.answers++
	}
}

// addMs is a+b, saturated.
func addMs(a, b uint32) uint32 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint32(0)
}

func msOf(ns int64) uint32 {
	if ns <= 0 {
		return 0
	}
	return uint32(min(ns/nsPerMs, int64(^uint32(0))))
}

// request applies one request of session slot i.
func (t *Table) request(now int64, i int32, r *wire.Request) {
	s := &t.sess.slots[i]
	switch {
	case r.ID > s.highest:
		s.highest = r.ID
		t.run(now, i, r)
	case r.ID <= s.retryBound:
		t.retry(now, i, r)
	default:
		t.answerInvalid(i, r, wire.FieldRequestID, msgRequestIDUsed)
	}
}

// run applies a new request (or reruns a retry that has nothing stored).
func (t *Table) run(now int64, i int32, r *wire.Request) {
	s := &t.sess.slots[i]
	owner := s.owner
	switch r.Op {
	case wire.OpAcquire:
		switch {
		case t.sess.stopping:
			t.finishAcquire(i, r.ID, r.Key, r.Lease, wire.StatusShuttingDown, 0, msgShuttingDown)
			return
		case len(s.records) >= t.sess.maxOutcomes && !t.grantsAtOnce(now, r.Key, leaseNs(r.Lease)):
			// Only an acquire that could end without a grant stores an outcome; one granted at
			// once stores none, so it is answered even with the session's outcomes full.
			t.answer(i, wire.Response{Op: r.Op, Status: wire.StatusBusy, ID: r.ID, Detail: wire.LimitInflight, Data: msgOutcomes})
			return
		}
		wait := waitNs(r.WaitMs)
		if wait != 0 && t.queuedOf(owner) >= t.sess.maxQueued {
			t.finishAcquire(i, r.ID, r.Key, r.Lease, wire.StatusBusy, wire.LimitInflight, msgInflight)
			return
		}
		res := t.Acquire(now, owner, r.ID, r.Key, leaseNs(r.Lease), wait)
		switch res.Status {
		case OK:
			a := t.reply(i, r.Op, wire.StatusOK, r.ID)
			a.Token, a.Lease = res.Token, r.Lease
			t.answered(res.entry)
		case Queued:
		case TimedOut:
			t.finishAcquire(i, r.ID, r.Key, r.Lease, wire.StatusTimedOut, 0, t.startupMsg(now))
		case Busy:
			code, msg := limitCode(res.Limit)
			t.finishAcquire(i, r.ID, r.Key, r.Lease, wire.StatusBusy, code, msg)
		default: // Duplicate: impossible for a new id
			t.answerInvalid(i, r, wire.FieldRequestID, msgRequestIDUsed)
		}
	case wire.OpRelease:
		if len(s.records) >= t.sess.maxOutcomes {
			t.answer(i, wire.Response{Op: r.Op, Status: wire.StatusBusy, ID: r.ID, Detail: wire.LimitInflight, Data: msgOutcomes})
			return
		}
		st := wire.StatusNotHeld
		if t.Release(now, r.Key, r.Token) == OK {
			st = wire.StatusOK
		}
		rec := s.put(r.ID)
		rec.op, rec.status, rec.token, rec.keyHash, rec.epoch = r.Op, st, r.Token, keyHash(r.Key), uint32(s.acks)
		t.reply(i, r.Op, st, r.ID)
	case wire.OpExtend:
		if t.sess.stopping {
			t.answer(i, wire.Response{Op: r.Op, Status: wire.StatusShuttingDown, ID: r.ID, Data: msgShuttingDown})
			return
		}
		res := t.Extend(now, owner, r.ID, r.Key, r.Token, leaseNs(r.Lease))
		switch res.Status {
		case OK:
			t.answer(i, wire.Response{Op: r.Op, ID: r.ID, Token: r.Token, Lease: r.Lease})
		case NotHeld:
			t.answer(i, wire.Response{Op: r.Op, Status: wire.StatusNotHeld, ID: r.ID})
		case Busy:
			t.answer(i, wire.Response{Op: r.Op, Status: wire.StatusBusy, ID: r.ID, Detail: wire.LimitStorage, Data: msgStorage})
		}
	case wire.OpCancel:
		if len(s.records) >= t.sess.maxOutcomes {
			t.answer(i, wire.Response{Op: r.Op, Status: wire.StatusBusy, ID: r.ID, Detail: wire.LimitInflight, Data: msgOutcomes})
			return
		}
		var withdrawn uint8
		target := r.Token
		// A grant is never revocable here: CANCEL comes on a connection of the session, whose
		// attach (applied before any of its requests) made the session's grants ordinary.
		if key, lease, ok := t.QueuedReq(owner, target); ok {
			kh, lms := keyHash(key), uint32(lease/nsPerMs)
			t.Cancel(now, owner, target)
			t.finishAcquireHashed(i, target, kh, lms, wire.StatusCancelled, 0, nil)
			withdrawn = 1
		}
		s = &t.sess.slots[i]
		s.store(record{id: r.ID, op: r.Op, token: target, detail: withdrawn, epoch: uint32(s.acks)})
		t.answer(i, wire.Response{Op: r.Op, ID: r.ID, Detail: uint32(withdrawn)})
	case wire.OpInspect:
		t.inspect(now, i, r)
	case wire.OpAck:
		s.ack(r.Token)
		t.reply(i, r.Op, wire.StatusOK, r.ID).Detail = uint32(len(s.records))
	case wire.OpPing:
		t.answer(i, wire.Response{Op: r.Op, ID: r.ID})
	default:
		t.answerInvalid(i, r, wire.FieldOp, msgOp)
	}
}

// retry answers a request id at or below the connection's retry bound: never run as new.
func (t *Table) retry(now int64, i int32, r *wire.Request) {
	s := &t.sess.slots[i]
	owner := s.owner
	switch r.Op {
	case wire.OpAcquire:
		if key, lease, ok := t.QueuedReq(owner, r.ID); ok {
			if string(key) != string(r.Key) || lease != leaseNs(r.Lease) {
				t.answerInvalid(i, r, wire.FieldRequestID, msgRetryDiffers)
			}
			return // still queued: re-attached; its answer comes when it is decided
		}
		if ei := t.FindHeld(owner, r.ID); ei != nilIdx {
			e := t.entries.at(ei)
			if string(t.key(e)) != string(r.Key) || e.holderLeaseMs != r.Lease {
				t.answerInvalid(i, r, wire.FieldRequestID, msgRetryDiffers)
				return
			}
			// Like every grant answer, counted from the request's first arrival: detail is the
			// time since then, lease_ms what is left now (PROTOCOL.md, "The lost signal").
			a := t.reply(i, r.Op, wire.StatusOK, r.ID)
			a.Token, a.Lease, a.Detail = e.token, msOf(e.deadline-now), addMs(e.queuedMs, msOf(now-e.grantedAt))
			t.answered(ei)
			return
		}
		if rec := s.find(r.ID); rec != nil {
			if rec.op != r.Op || rec.keyHash != keyHash(r.Key) || rec.lease != r.Lease {
				t.answerInvalid(i, r, wire.FieldRequestID, msgRetryDiffers)
				return
			}
			t.replay(i, r, rec)
			return
		}
		t.answer(i, wire.Response{Op: r.Op, Status: wire.StatusNotHeld, ID: r.ID})
	case wire.OpRelease, wire.OpCancel:
		if rec := s.find(r.ID); rec != nil {
			if rec.op != r.Op || rec.token != r.Token || (r.Op == wire.OpRelease && rec.keyHash != keyHash(r.Key)) {
				t.answerInvalid(i, r, wire.FieldRequestID, msgRetryDiffers)
				return
			}
			t.replay(i, r, rec)
			return
		}
		t.rerun(now, i, r)
	default:
		if rec := s.find(r.ID); rec != nil && rec.op != r.Op {
			t.answerInvalid(i, r, wire.FieldRequestID, msgRetryDiffers)
			return
		}
		t.rerun(now, i, r)
	}
}

// rerun runs a retry that has no stored outcome of its own op, unless the table still knows
// its id as an ACQUIRE of the session (queued or held): then the "retry" is another request
// under a used id, and running it could, for instance, shorten the lease of the lock that id
// holds. PROTOCOL.md, "Request ids".
func (t *Table) rerun(now int64, i int32, r *wire.Request) {
	owner := t.sess.slots[i].owner
	if _, _, ok := t.QueuedReq(owner, r.ID); ok || t.FindHeld(owner, r.ID) != nilIdx {
		t.answerInvalid(i, r, wire.FieldRequestID, msgRetryDiffers)
		return
	}
	t.run(now, i, r)
}

// replay answers a retry from its stored outcome.
func (t *Table) replay(i int32, r *wire.Request, rec *record) {
	resp := wire.Response{Op: rec.op, Status: rec.status, ID: rec.id, Detail: uint32(rec.detail)}
	switch {
	case rec.status == wire.StatusBusy:
		resp.Data = limitMsg(uint32(rec.detail))
	case rec.status == wire.StatusShuttingDown:
		resp.Data = msgShuttingDown
	}
	t.answer(i, resp)
}

// finishAcquire answers an ACQUIRE that ended without a grant, and stores the outcome.
func (t *Table) finishAcquire(i int32, id uint64, key []byte, leaseMs uint32, st wire.Status, detail uint32, msg []byte) {
	t.finishAcquireHashed(i, id, keyHash(key), leaseMs, st, detail, msg)
}

func (t *Table) finishAcquireHashed(i int32, id uint64, kh, leaseMs uint32, st wire.Status, detail uint32, msg []byte) {
	s := &t.sess.slots[i]
	s.store(record{id: id, op: wire.OpAcquire, status: st, detail: uint8(detail), keyHash: kh, lease: leaseMs, epoch: uint32(s.acks)})
	t.answer(i, wire.Response{Op: wire.OpAcquire, Status: st, ID: id, Detail: detail, Data: msg})
}

func limitCode(l Limit) (uint32, []byte) {
	switch l {
	case LimitWaitersPerKey:
		return wire.LimitWaitersPerKey, msgPerKey
	case LimitWaitersTotal:
		return wire.LimitWaitersTotal, msgWaiters
	case LimitStorage:
		return wire.LimitStorage, msgStorage
	}
	return wire.LimitLocks, msgLocks
}

func limitMsg(code uint32) []byte {
	switch code {
	case wire.LimitWaitersPerKey:
		return msgPerKey
	case wire.LimitWaitersTotal:
		return msgWaiters
	case wire.LimitStorage:
		return msgStorage
	case wire.LimitInflight:
		return msgInflight
	}
	return msgLocks
}

// queuedOf is the number of queued acquires of owner.
func (t *Table) queuedOf(o Owner) int {
	if t.nwait == 0 {
		return 0
	}
	if oi := t.findOwner(o); oi != nilIdx {
		return t.owners[oi].n
	}
	return 0
}

// QueuedReq reports the key and lease of owner's queued acquire reqID.
func (t *Table) QueuedReq(owner Owner, reqID uint64) (key []byte, lease int64, ok bool) {
	if t.nwait == 0 {
		return nil, 0, false
	}
	wi := t.findReq(owner, reqID)
	if wi == nilIdx {
		return nil, 0, false
	}
	w := t.waiters.at(wi)
	return t.key(t.entries.at(w.entry)), w.lease, true
}

// inspect answers INSPECT (PROTOCOL.md): the token only to its holder's session or to a request
// carrying it.
func (t *Table) inspect(now int64, i int32, r *wire.Request) {
	resp := wire.Response{Op: r.Op, ID: r.ID}
	var heldMs, delayMs, flags uint32
	if info, ok := t.Inspect(r.Key); ok {
		if info.Held {
			flags |= wire.InspectHeld
			if r.Token != 0 && r.Token == info.Token {
				flags |= wire.InspectTokenMatch
			}
			if info.Holder == t.sess.slots[i].owner {
				flags |= wire.InspectSession
			}
			if flags&(wire.InspectTokenMatch|wire.InspectSession) != 0 {
				resp.Token = info.Token
			}
			resp.Lease = msOf(info.Deadline - now)
			heldMs = msOf(now - info.GrantedAt)
		}
		if info.Stalled {
			flags |= wire.InspectStalled
		}
		if info.DelayUntil > 0 {
			delayMs = msOf(info.DelayUntil - now)
		}
		resp.Detail = uint32(info.Waiters)
	}
	if now < t.availFrom {
		// The start-up wait holds every key, present or not: no grant before it ends.
		flags |= wire.InspectStartup
		delayMs = msOf(t.availFrom - now)
	}
	sc := t.sess.scratch
	n := len(sc)
	sc = binary.BigEndian.AppendUint32(sc, heldMs)
	sc = binary.BigEndian.AppendUint32(sc, delayMs)
	sc = binary.BigEndian.AppendUint32(sc, flags)
	t.sess.scratch = sc
	resp.Data = sc[n:len(sc):len(sc)]
	t.answer(i, resp)
}

// drain turns the core's events into outputs: answers to the sessions whose acquires were
// decided, EXPIRED pushes to the holders that lost their lock, and stored outcomes.
func (t *Table) drain(now int64) {
	evs := t.events
	if len(evs) == 0 {
		return
	}
	// One output per event, most often: room for them at once (see resumeStalled).
	t.sess.outs = slices.Grow(t.sess.outs, len(evs))
	for k := range evs {
		ev := &evs[k]
		i := t.sess.slotOf(ev.Owner)
		var conn uint64
		if i != noSession {
			conn = t.sess.slots[i].conn
		}
		switch ev.Kind {
		case EvGranted:
			a := t.outFor(conn, wire.OpAcquire, wire.StatusOK, ev.ReqID)
			a.Token, a.Lease, a.Detail = ev.Token, uint32(ev.Lease/nsPerMs), msOf(now-ev.Since)
			if conn != 0 {
				if e := t.entries.at(ev.entry); e.held() && e.token == ev.Token {
					t.answered(ev.entry)
				}
			}
		case EvTimedOut, EvAborted:
			st, msg := wire.StatusTimedOut, t.startupMsg(now)
			if ev.Kind == EvAborted {
				st, msg = wire.StatusShuttingDown, msgShuttingDown
			}
			if i != noSession {
				t.finishAcquire(i, ev.ReqID, ev.Key, uint32(ev.Lease/nsPerMs), st, 0, msg)
			}
		case EvStorageBusy:
			if ev.Extend {
				t.out(conn, wire.Response{Op: wire.OpExtend, Status: wire.StatusBusy, ID: ev.ReqID, Detail: wire.LimitStorage, Data: msgStorage})
			} else if i != noSession {
				t.finishAcquire(i, ev.ReqID, ev.Key, uint32(ev.Lease/nsPerMs), wire.StatusBusy, wire.LimitStorage, msgStorage)
			}
		case EvExpired:
			if conn != 0 {
				t.out(conn, wire.Response{Op: wire.OpExpired, Token: ev.Token, Detail: wire.ExpiredLease, Data: t.keep(ev.Key)})
			}
		case EvExtended:
			t.out(conn, wire.Response{Op: wire.OpExtend, ID: ev.ReqID, Token: ev.Token, Lease: uint32(ev.Lease / nsPerMs)})
		case EvExtendNotHeld:
			t.out(conn, wire.Response{Op: wire.OpExtend, Status: wire.StatusNotHeld, ID: ev.ReqID})
		}
	}
	t.ClearEvents()
}
