package locktable

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	"github.com/ticketing/ticketing/wire"
)

// Snapshot and Restore copy the table's whole logical state: keys with their holders,
// deadlines, queues (in key order and in global order), lock-delays and stalls, sessions with
// their request-id bounds and stored outcomes, the token counter and durable bounds, the timer
// sequence number (deadline ties resolve the same way after a restore), deferred extends. A
// restored table behaves exactly as the original from then on.
//
// The encoding is canonical: two tables in the same logical state give the same bytes whatever
// their memory layout (keys are sorted, sessions listed by slot), so StateHash can compare
// replicas. Big-endian, versioned; Restore rejects what it cannot read.
//
// Version 2 adds the table's limits (Limits: replicated by CONFIG, so part of the state).
// Version 3 keeps a holder's lease in ms and adds, per held key, the ms its acquire queued and
// the count of its grant answers (entry.queuedMs, entry.answers). Restore reads version 2 too:
// queued 0 (a retry's answer then counts from the grant, which is later: safe) and answers 2 (no
// dropped frame makes such a grant revocable: it runs its lease).

const (
	snapMagic   = "TKSN"
	snapVersion = 3
)

// ErrSnapshot is wrapped by Restore's errors.
var ErrSnapshot = errors.New("locktable: bad snapshot")

type snapWriter struct{ b []byte }

func (w *snapWriter) u8(v uint8)   { w.b = append(w.b, v) }
func (w *snapWriter) u16(v uint16) { w.b = be.AppendUint16(w.b, v) }
func (w *snapWriter) u32(v uint32) { w.b = be.AppendUint32(w.b, v) }
func (w *snapWriter) u64(v uint64) { w.b = be.AppendUint64(w.b, v) }
func (w *snapWriter) i64(v int64)  { w.b = be.AppendUint64(w.b, uint64(v)) }
func (w *snapWriter) bool(v bool) {
	if v {
		w.u8(1)
	} else {
		w.u8(0)
	}
}

// Snapshot returns the table's logical state (see above). It does not change the table. Pending
// outputs and events are not part of it: take a snapshot between applies.
func (t *Table) Snapshot() []byte {
	w := &snapWriter{b: make([]byte, 0, 256+64*t.nkeys+64*t.nwait)}
	w.b = append(w.b, snapMagic...)
	w.u32(snapVersion)
	w.u64(t.lastToken)
	w.u64(t.tokenLimit)
	w.i64(t.horizon)
	w.bool(t.failing)
	w.bool(t.sess.stopping)
	w.i64(t.sess.now)
	w.u64(t.seq)
	w.u64(t.sess.nextNum)
	w.b = append(w.b, t.stateID[:]...)
	w.i64(t.availFrom)
	ids := make([]string, 0, len(t.nodes))
	for id := range t.nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	w.u32(uint32(len(ids)))
	for _, id := range ids {
		w.u16(uint16(len(id)))
		w.b = append(w.b, id...)
		a := t.nodes[id]
		w.u16(uint16(len(a)))
		w.b = append(w.b, a...)
	}
	for _, v := range t.cfg.Limits().words() {
		w.i64(v)
	}

	// Sessions: the slot array's length, the free list in order, then the live sessions by slot.
	ss := &t.sess
	w.u32(uint32(len(ss.slots)))
	var free []int32
	for i := ss.free; i != noSession; i = ss.slots[i].nextFree {
		free = append(free, i)
	}
	w.u32(uint32(len(free)))
	for _, i := range free {
		w.u32(uint32(i))
	}
	w.u32(uint32(ss.live))
	for i := range ss.slots {
		s := &ss.slots[i]
		if !s.inUse {
			continue
		}
		w.u32(uint32(i))
		w.b = append(w.b, s.id[:]...)
		w.u64(uint64(s.owner))
		w.u64(s.conn)
		w.u64(s.last)
		w.i64(s.grace)
		w.i64(s.expireAt)
		w.u64(s.tseq)
		w.u64(s.highest)
		w.u64(s.retryBound)
		w.u64(s.acks)
		w.u32(uint32(len(s.records)))
		for _, r := range s.records {
			w.u64(r.id)
			w.u64(r.token)
			w.u64(uint64(r.epoch)) // an 8-byte field of the format
			w.u32(r.keyHash)
			w.u32(r.lease)
			w.u8(uint8(r.op))
			w.u8(uint8(r.status))
			w.u8(r.detail)
		}
	}

	// Keys, sorted; waiters in key-queue order with their global position.
	keys := make([]int32, 0, t.nkeys)
	for i := int32(0); i < t.entries.n; i++ {
		if t.entries.at(i).live() {
			keys = append(keys, i)
		}
	}
	slices.SortFunc(keys, func(a, b int32) int { return bytes.Compare(t.key(t.entries.at(a)), t.key(t.entries.at(b))) })
	keyNum := make(map[int32]uint32, len(keys))
	for n, ei := range keys {
		keyNum[ei] = uint32(n)
	}
	gpos := make(map[int32]uint64, t.nwait)
	var g uint64
	for wi := t.ghead; wi != nilIdx; wi = t.waiters.at(wi).gnext {
		gpos[wi] = g
		g++
	}
	w.u32(uint32(len(keys)))
	for _, ei := range keys {
		e := t.entries.at(ei)
		w.u16(e.klen)
		w.b = append(w.b, t.key(e)...)
		var flags uint8
		for bit, on := range []bool{e.held(), e.inDelay(), e.stalled(), e.revocable(), e.orec != nilIdx} {
			if on {
				flags |= 1 << bit
			}
		}
		w.u8(flags)
		w.u64(uint64(e.holder))
		w.u64(e.holderReq)
		w.u32(e.holderLeaseMs)
		w.u32(e.queuedMs)
		w.u8(e.answers)
		w.u64(e.token)
		w.i64(e.grantedAt)
		// The lease's end, then the lock-delay's end: one field in memory, two in the snapshot
		// (its format predates the merge), 0 where the entry has no such timer.
		var lease, delay int64
		if e.held() {
			lease = e.deadline
		} else if e.inDelay() {
			delay = e.deadline
		}
		w.i64(lease)
		w.i64(delay)
		w.u64(e.tseq)
		w.u32(uint32(e.nwait))
		for wi := e.qhead; wi != nilIdx; wi = t.waiters.at(wi).qnext {
			x := t.waiters.at(wi)
			w.u64(uint64(x.owner))
			w.u64(x.reqID)
			w.i64(x.lease)
			w.i64(x.since)
			w.i64(x.waitAt)
			w.u64(x.tseq)
			w.bool(x.try)
			w.u64(gpos[wi])
		}
	}
	w.u32(uint32(t.nstalled))
	for ei := t.shead; ei != nilIdx; ei = t.entries.at(ei).lnext {
		w.u32(keyNum[ei])
	}
	w.u32(uint32(len(t.deferred)))
	for _, d := range t.deferred {
		num, ok := keyNum[d.entry]
		if !ok || !t.entries.at(d.entry).live() {
			num = ^uint32(0) // its key is gone: the extend will answer NOT_HELD
		}
		w.u32(num)
		w.u64(d.token)
		w.i64(d.lease)
		w.u64(uint64(d.owner))
		w.u64(d.reqID)
	}
	return w.b
}

// StateHash is a digest of the logical state (SHA-256 of the canonical snapshot): equal on two
// replicas that applied the same entries.
func (t *Table) StateHash() [32]byte { return sha256.Sum256(t.Snapshot()) }

type snapReader struct {
	b   []byte
	err error
}

func (r *snapReader) take(n int) []byte {
	if r.err != nil || len(r.b) < n {
		r.err = fmt.Errorf("%w: truncated", ErrSnapshot)
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
func (r *snapReader) u8() uint8   { return r.take(1)[0] }
func (r *snapReader) u16() uint16 { return be.Uint16(r.take(2)) }
func (r *snapReader) u32() uint32 { return be.Uint32(r.take(4)) }
func (r *snapReader) u64() uint64 { return be.Uint64(r.take(8)) }
func (r *snapReader) i64() int64  { return int64(be.Uint64(r.take(8))) }
func (r *snapReader) bool() bool  { return r.u8() != 0 }

// count reads a count and checks it against what the rest of the input could hold (each item at
// least min bytes), so a corrupt snapshot cannot make Restore allocate without bound.
func (r *snapReader) count(min int) int {
	n := int(r.u32())
	if r.err == nil && n*min > len(r.b) {
		r.err = fmt.Errorf("%w: count %d beyond its data", ErrSnapshot, n)
		return 0
	}
	return n
}

type restoredWaiter struct {
	ei                 int32
	owner              Owner
	reqID              uint64
	lease, since, wait int64
	tseq, gpos         uint64
	try                bool
}

// Restore builds a table with configuration cfg from a snapshot. The snapshot's limits replace
// cfg's.
func Restore(cfg Config, snap []byte) (*Table, error) {
	r := &snapReader{b: snap}
	if string(r.take(4)) != snapMagic {
		return nil, fmt.Errorf("%w: magic", ErrSnapshot)
	}
	version := r.u32()
	if version != snapVersion && version != 2 {
		return nil, fmt.Errorf("%w: version %d", ErrSnapshot, version)
	}
	t := New(cfg)
	t.lastToken = r.u64()
	t.tokenLimit = r.u64()
	t.horizon = r.i64()
	t.failing = r.bool()
	t.sess.stopping = r.bool()
	t.sess.now = r.i64()
	seq := r.u64()
	t.sess.nextNum = r.u64()
	copy(t.stateID[:], r.take(wire.StateIDSize))
	t.availFrom = r.i64()
	for k, n := 0, r.count(4); k < n; k++ {
		id := string(r.take(int(r.u16())))
		addr := string(r.take(int(r.u16())))
		if t.nodes == nil {
			t.nodes = make(map[string]string)
		}
		t.nodes[id] = addr
	}
	var lw [limitWords]int64
	for k := range lw {
		lw[k] = r.i64()
	}
	t.cfg.setLimits(limitsOf(lw))
	t.sess.limits(&t.cfg)

	ss := &t.sess
	nslots := r.count(0)
	if nslots > maxSlots {
		return nil, fmt.Errorf("%w: %d session slots", ErrSnapshot, nslots)
	}
	ss.slots = make([]session, nslots)
	nfree := r.count(4)
	prev := noSession
	for k := 0; k < nfree; k++ {
		i := int32(r.u32())
		if int(i) >= nslots {
			return nil, fmt.Errorf("%w: free slot %d", ErrSnapshot, i)
		}
		ss.slots[i].nextFree = noSession
		if prev == noSession {
			ss.free = i
		} else {
			ss.slots[prev].nextFree = i
		}
		prev = i
	}
	live := r.count(16)
	for k := 0; k < live && r.err == nil; k++ {
		i := int32(r.u32())
		if int(i) >= nslots || ss.slots[i].inUse {
			return nil, fmt.Errorf("%w: session slot %d", ErrSnapshot, i)
		}
		s := &ss.slots[i]
		copy(s.id[:], r.take(wire.SessionIDSize))
		s.owner = Owner(r.u64())
		s.conn = r.u64()
		s.last = r.u64()
		s.grace = r.i64()
		s.expireAt = r.i64()
		s.tseq = r.u64()
		s.highest = r.u64()
		s.retryBound = r.u64()
		s.acks = r.u64()
		s.inUse = true
		nrec := r.count(35)
		s.records = make([]record, nrec)
		for j := range s.records {
			s.records[j] = record{id: r.u64(), token: r.u64(), epoch: uint32(r.u64()), keyHash: r.u32(), lease: r.u32(),
				op: wire.Op(r.u8()), status: wire.Status(r.u8()), detail: r.u8()}
		}
		if uint64(s.owner)&slotMask != uint64(i) {
			return nil, fmt.Errorf("%w: session owner %d in slot %d", ErrSnapshot, s.owner, i)
		}
		ss.byID[s.id] = i
		ss.live++
		if s.tseq != 0 {
			t.pushTimerSeq(s.expireAt, tSession, i, s.tseq)
		}
	}

	nkeys := r.count(3)
	numToEntry := make([]int32, 0, nkeys)
	var ws []restoredWaiter
	var linked []int32 // held entries still on their owner's list
	for k := 0; k < nkeys && r.err == nil; k++ {
		key := r.take(int(r.u16()))
		ei, h := t.lookup(key)
		if ei != nilIdx {
			return nil, fmt.Errorf("%w: key %q twice", ErrSnapshot, key)
		}
		ei = t.insertKey(key, h)
		numToEntry = append(numToEntry, ei)
		flags := r.u8()
		e := t.entries.at(ei)
		e.set(fHeld, flags&1 != 0)
		e.set(fInDelay, flags&2 != 0)
		e.set(fRevocable, flags&8 != 0)
		stalled, onList := flags&4 != 0, flags&16 != 0
		e.holder = Owner(r.u64())
		e.holderReq = r.u64()
		if version == 2 {
			e.holderLeaseMs, e.answers = msOf(r.i64()), 2
		} else {
			e.holderLeaseMs, e.queuedMs, e.answers = r.u32(), r.u32(), r.u8()
		}
		e.token = r.u64()
		e.grantedAt = r.i64()
		lease, delay := r.i64(), r.i64()
		e.tseq = r.u64()
		if e.held() {
			e.deadline = lease
			t.nheld++
			t.pushTimerSeq(e.deadline, tLease, ei, e.tseq)
			if onList {
				linked = append(linked, ei)
			}
		} else if e.inDelay() {
			e.deadline = delay
			t.pushTimerSeq(e.deadline, tDelay, ei, e.tseq)
		}
		_ = stalled // the stalled list below restores it, in order
		nw := r.count(49)
		for j := 0; j < nw; j++ {
			ws = append(ws, restoredWaiter{ei: ei, owner: Owner(r.u64()), reqID: r.u64(), lease: r.i64(), since: r.i64(),
				wait: r.i64(), tseq: r.u64(), try: r.bool(), gpos: r.u64()})
		}
	}
	// Held lists in grant (token) order, each grant put first as grant does: the same lists as
	// the original's, whatever the key order.
	slices.SortFunc(linked, func(a, b int32) int { return cmp.Compare(t.entries.at(a).token, t.entries.at(b).token) })
	for _, ei := range linked {
		t.linkHeld(t.ownerFor(t.entries.at(ei).holder), ei)
	}
	// Waiters in global order rebuild both the global FIFO and every key's queue (a key's queue
	// is a subsequence of the global order).
	slices.SortFunc(ws, func(a, b restoredWaiter) int {
		switch {
		case a.gpos < b.gpos:
			return -1
		case a.gpos > b.gpos:
			return 1
		}
		return 0
	})
	for _, x := range ws {
		if t.findReq(x.owner, x.reqID) != nilIdx {
			return nil, fmt.Errorf("%w: waiter (%d, %d) twice", ErrSnapshot, x.owner, x.reqID)
		}
		t.restoreWaiter(x)
	}
	nst := r.count(4)
	for k := 0; k < nst; k++ {
		n := r.u32()
		if int(n) >= len(numToEntry) {
			return nil, fmt.Errorf("%w: stalled key %d", ErrSnapshot, n)
		}
		t.stall(numToEntry[n])
	}
	ndef := r.count(36)
	for k := 0; k < ndef; k++ {
		n := r.u32()
		d := deferredExtend{entry: nilIdx, token: r.u64(), lease: r.i64(), owner: Owner(r.u64()), reqID: r.u64()}
		if int(n) < len(numToEntry) {
			d.entry = numToEntry[n]
		} else {
			d.entry = t.deadEntry()
		}
		t.deferred = append(t.deferred, d)
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the end", ErrSnapshot, len(r.b))
	}
	t.seq = seq
	// An owner's record is detached exactly when its session is.
	for i := range t.owners {
		if rec := &t.owners[i]; rec.live {
			if si := ss.slotOf(rec.owner); si != noSession {
				rec.detached = ss.slots[si].conn == 0
			}
		}
	}
	return t, nil
}

// restoreWaiter appends a waiter with its saved fields and timer.
func (t *Table) restoreWaiter(x restoredWaiter) {
	wait := int64(-1) // enqueue sets no timer for a waiter without limit, nor for a try-once one
	if x.try {
		wait = 0
	}
	t.enqueue(x.since, x.ei, x.owner, x.reqID, x.lease, wait)
	wi := t.gtail
	w := t.waiters.at(wi)
	w.waitAt = x.wait
	if x.tseq != 0 {
		w.tseq = x.tseq
		t.pushTimerSeq(x.wait, tWait, wi, x.tseq)
	}
}

// deadEntry returns the index of an entry that is not live (for a deferred extend whose key is
// gone), creating one if needed.
func (t *Table) deadEntry() int32 {
	for i := int32(0); i < t.entries.n; i++ {
		if !t.entries.at(i).live() {
			return i
		}
	}
	ei := t.insertKey([]byte{0}, 0)
	t.removeKey(ei)
	return ei
}

// pushTimerSeq adds a deadline with a given seq (Restore).
func (t *Table) pushTimerSeq(at int64, kind timerKind, idx int32, seq uint64) {
	t.insertTimer(timer{at: at, seq: seq, idx: idx, kind: kind})
}
