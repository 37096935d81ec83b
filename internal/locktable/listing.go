package locktable

import "github.com/ticketing/ticketing/wire"

// Read-only listings for operators (the admin listener's inspection pages). None of these
// changes the table, and none is on the request path: they may allocate, and they cost time
// proportional to what they list (bounded by the caller).

// WaiterInfo is one queued acquire (Table.Waiters).
type WaiterInfo struct {
	Owner     Owner
	ReqID     uint64
	Since     int64 // when it queued (table time)
	Lease     int64 // ns asked for
	WaitUntil int64 // its wait deadline; 0 when it waits without limit (or is a try on a stalled key)
	Try       bool  // asked with wait 0: queued only while its key waits for storage
}

// Waiters appends up to max of key's queued acquires, in queue order, to dst. It returns dst
// and the queue's full length.
func (t *Table) Waiters(key []byte, dst []WaiterInfo, max int) ([]WaiterInfo, int) {
	ei, _ := t.lookup(key)
	if ei == nilIdx {
		return dst, 0
	}
	e := t.entries.at(ei)
	for wi, n := e.qhead, 0; wi != nilIdx && n < max; n++ {
		w := t.waiters.at(wi)
		wu := int64(0)
		if w.tseq != 0 {
			wu = w.waitAt
		}
		dst = append(dst, WaiterInfo{Owner: w.owner, ReqID: w.reqID, Since: w.since, Lease: w.lease, WaitUntil: wu, Try: w.try})
		wi = w.qnext
	}
	return dst, int(e.nwait)
}

// EachKey calls fn with every present key (held, waited on, in lock-delay or stalled) and
// what Inspect reports about it, in no particular order, until fn returns false. key is a
// view into table memory, valid only during the call.
func (t *Table) EachKey(fn func(key []byte, info Info) bool) {
	for i := int32(0); i < t.entries.n; i++ {
		e := t.entries.at(i)
		if !e.live() {
			continue
		}
		if info, ok := t.Inspect(t.key(e)); ok && !fn(t.key(e), info) {
			return
		}
	}
}

// SessionOf returns the live session of owner: its id, its attached connection (0 while
// detached) and, while detached, when its grace ends (table time).
func (t *Table) SessionOf(o Owner) (sid [wire.SessionIDSize]byte, conn uint64, graceEnd int64, ok bool) {
	i := t.sess.slotOf(o)
	if i == noSession {
		return sid, 0, 0, false
	}
	s := &t.sess.slots[i]
	if s.conn == 0 {
		graceEnd = s.expireAt
	}
	return s.id, s.conn, graceEnd, true
}
