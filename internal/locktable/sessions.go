package locktable

import (
	"encoding/binary"
	"math/bits"
	"sort"

	"github.com/ticketing/ticketing/wire"
)

// Defaults of the session layer's limits (Config).
const (
	DefaultMaxSessions = 20_000
	DefaultMaxOutcomes = 4096
	DefaultMaxQueued   = 4096
	// maxSlots bounds session slots: an Owner packs a slot into its low 24 bits.
	maxSlots  = 1 << 24
	slotBits  = 24
	slotMask  = maxSlots - 1
	nsPerMs   = 1_000_000
	noSession = int32(-1)
)

// sessions is the session layer's state, part of Table.
type sessions struct {
	slots    []session
	free     int32 // free slot list, linked through session.nextFree
	byID     map[[wire.SessionIDSize]byte]int32
	live     int
	nextNum  uint64 // session numbers: 1, 2, ...; never reused
	now      int64  // the latest time any call passed in
	stopping bool   // Stop was applied: ACQUIRE and EXTEND answer SHUTTING_DOWN

	maxSessions, maxOutcomes, maxQueued int

	outs    []Out
	scratch []byte // INSPECT data of the outputs in outs
}

// session is one client session (PROTOCOL.md, "Sessions").
type session struct {
	id         [wire.SessionIDSize]byte
	owner      Owner  // the core's owner: session number << 24 | slot
	conn       uint64 // the attached connection; 0 while detached
	last       uint64 // the connection it was last attached to (kept while detached)
	grace      int64  // ns the session outlives its connection
	tseq       uint64 // the grace timer's seq while detached; 0 otherwise
	expireAt   int64
	highest    uint64 // highest request id seen
	retryBound uint64 // highest when the current connection attached
	acks       uint64 // ACKs applied
	records    []record
	inUse      bool
	nextFree   int32
}

// record is a stored outcome (PROTOCOL.md, "Retries and stored outcomes"): what a retry of
// request id is answered, and what it must match.
//
// 32 bytes: a busy session keeps up to two ACK intervals of them (TICKETING_MAX_OUTCOMES at most),
// which makes them most of what a busy session costs.
type record struct {
	id      uint64
	token   uint64 // RELEASE: the token; CANCEL: the target request id; ACQUIRE: 0
	epoch   uint32 // acks of the session when stored, modulo 2^32 (ack compares it for equality)
	keyHash uint32 // ACQUIRE, RELEASE: hash of the key
	lease   uint32 // ACQUIRE: lease_ms
	op      wire.Op
	status  wire.Status
	detail  uint8 // BUSY: limit code; CANCEL: 1 if something was withdrawn
}

// Out is one frame for a connection: an answer or a push, or the result of an Attach. Conn 0
// means the session is detached: nobody receives it. Resp.Data views table memory or constant
// memory and is valid until the next call on the table.
type Out struct {
	Conn uint64
	Resp wire.Response
	// Attach result (Attached is true): the session's owner, whether it was resumed, the
	// connection it was taken from (0: none), or Busy (too many sessions).
	Owner    Owner
	Prev     uint64
	Attached bool
	Resumed  bool
	Busy     bool
}

func (s *sessions) init(cfg *Config) {
	s.free = noSession
	s.byID = make(map[[wire.SessionIDSize]byte]int32)
	s.limits(cfg)
}

// limits takes the session layer's limits from cfg.
func (s *sessions) limits(cfg *Config) {
	s.maxSessions = orDefault(cfg.MaxSessions, DefaultMaxSessions)
	s.maxOutcomes = orDefault(cfg.MaxOutcomes, DefaultMaxOutcomes)
	s.maxQueued = orDefault(cfg.MaxQueued, DefaultMaxQueued)
	s.maxSessions = min(s.maxSessions, maxSlots-1)
}

func orDefault(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}

// slotOf returns the slot of the live session owner, or noSession.
func (s *sessions) slotOf(o Owner) int32 {
	i := int32(uint64(o) & slotMask)
	if int(i) >= len(s.slots) || !s.slots[i].inUse || s.slots[i].owner != o {
		return noSession
	}
	return i
}

// tick moves the session layer's clock: time never goes backwards in the table.
func (t *Table) tick(now int64) int64 {
	if now > t.sess.now {
		t.sess.now = now
	}
	return t.sess.now
}

// Attach attaches connection conn to the session sid, creating the session if it is not live,
// with grace ns of life after a detach. The result is the last Out (Attached true): the
// session's owner, Resumed, the previous connection of a resumed session (Prev, which the
// caller must close: only the newest connection of a session is served), or Busy when
// MaxSessions sessions are live. Deadlines up to now are applied first.
func (t *Table) Attach(now int64, sid [wire.SessionIDSize]byte, conn uint64, grace int64) {
	now = t.tick(now)
	t.Advance(now)
	t.drain(now)
	ss := &t.sess
	res := Out{Conn: conn, Attached: true}
	if i, ok := ss.byID[sid]; ok {
		s := &ss.slots[i]
		t.cancelTimer(&s.tseq)
		res.Owner, res.Resumed, res.Prev = s.owner, true, s.conn
		s.conn, s.last = conn, conn
		s.grace = grace
		s.retryBound = s.highest
		t.SetDetached(s.owner, false)
	} else if ss.live >= ss.maxSessions {
		res.Busy = true
	} else {
		i := ss.free
		if i != noSession {
			ss.free = ss.slots[i].nextFree
		} else {
			ss.slots = append(ss.slots, session{})
			i = int32(len(ss.slots) - 1)
		}
		ss.nextNum++
		s := &ss.slots[i]
		recs := s.records[:0]
		*s = session{
			id:      sid,
			owner:   Owner(ss.nextNum<<slotBits | uint64(i)),
			conn:    conn,
			last:    conn,
			grace:   grace,
			records: recs,
			inUse:   true,
		}
		ss.byID[sid] = i
		ss.live++
		res.Owner = s.owner
	}
	ss.outs = append(ss.outs, res)
}

// Detach records that connection conn of session owner is gone. It does nothing unless conn is
// the session's current connection (an older connection taken over by a newer one detaches
// nothing). The session then lives for its grace; with grace 0 it ends at once.
func (t *Table) Detach(now int64, owner Owner, conn uint64) {
	now = t.tick(now)
	t.Advance(now)
	t.drain(now) // what the deadlines decided went to the connection the session had then
	i := t.sess.slotOf(owner)
	if i == noSession || t.sess.slots[i].conn != conn || conn == 0 {
		t.drain(now)
		return
	}
	s := &t.sess.slots[i]
	s.conn = 0
	t.SetDetached(owner, true)
	if s.grace <= 0 {
		t.expireSession(now, i)
	} else {
		s.expireAt = addSat(now, s.grace)
		s.tseq = t.pushTimer(s.expireAt, tSession, i)
	}
	t.drain(now)
}

// Undelivered records that a grant answer of owner's acquire reqID, addressed to connection
// conn, was dropped unwritten (the connection was doomed: it stopped reading, or its socket
// failed): no byte of that frame can have reached the client. It counts only while conn is the
// last connection the session attached to (a newer connection may have carried a retry's
// answer, even if it is gone too): the session is detached from conn if still attached, and the
// grant, if still held and if that frame was its only answer (entry.answers: a hand-off and a
// retry can each answer it, and the client may have read the other), becomes revocable as if
// the session had been detached when it was made.
func (t *Table) Undelivered(now int64, owner Owner, conn uint64, reqID uint64) {
	now = t.tick(now)
	i := t.sess.slotOf(owner)
	if i == noSession || conn == 0 || t.sess.slots[i].last != conn {
		return
	}
	if ei := t.FindHeld(owner, reqID); ei != nilIdx && t.entries.at(ei).answers <= 1 {
		t.entries.at(ei).set(fRevocable, true)
	}
	if t.sess.slots[i].conn == conn {
		t.Detach(now, owner, conn)
	}
}

// SessionOnConn returns the id of the session attached to connection conn, if any. It scans
// every session: for rare paths only (a grant for a connection the server already dropped).
func (t *Table) SessionOnConn(conn uint64) (sid [wire.SessionIDSize]byte, ok bool) {
	if conn == 0 {
		return sid, false
	}
	for i := range t.sess.slots {
		if s := &t.sess.slots[i]; s.inUse && s.conn == conn {
			return s.id, true
		}
	}
	return sid, false
}

// DetachAll detaches every session from its connection (a new leader: the connections to the
// old one are gone). Each session then lives for its grace.
func (t *Table) DetachAll(now int64) {
	now = t.tick(now)
	t.Advance(now)
	t.drain(now)
	for i := range t.sess.slots {
		if s := &t.sess.slots[i]; s.inUse && s.conn != 0 {
			t.Detach(now, s.owner, s.conn)
		}
	}
	t.drain(now)
}

// StateID returns the cluster's state id (zero until an INIT command was applied).
func (t *Table) StateID() [wire.StateIDSize]byte { return t.stateID }

// NodeAddr returns the client address a NODE command recorded for node id.
func (t *Table) NodeAddr(id string) string { return t.nodes[id] }

// expireSession ends the session in slot i: its queued acquires leave their queues, its
// revocable grants are revoked, its stored outcomes are dropped. Locks it holds otherwise run
// their lease.
func (t *Table) expireSession(now int64, i int32) {
	ss := &t.sess
	s := &ss.slots[i]
	t.cancelTimer(&s.tseq)
	t.DropOwner(now, s.owner)
	delete(ss.byID, s.id)
	clear(s.records)
	s.records = s.records[:0]
	s.inUse = false
	s.conn = 0
	s.nextFree = ss.free
	ss.free = i
	ss.live--
}

// Session reports the state of the live session sid: its owner, attached connection (0 while
// detached) and number of stored outcomes; ok is false when it is not live.
func (t *Table) Session(sid [wire.SessionIDSize]byte) (owner Owner, conn uint64, outcomes int, ok bool) {
	i, ok := t.sess.byID[sid]
	if !ok {
		return 0, 0, 0, false
	}
	s := &t.sess.slots[i]
	return s.owner, s.conn, len(s.records), true
}

// Sessions returns the number of live sessions.
func (t *Table) Sessions() int { return t.sess.live }

// Outs returns the outputs of the calls since the last ClearOuts, in order. The slice and the
// data it views are table memory: route them, then call ClearOuts.
func (t *Table) Outs() []Out { return t.sess.outs }

// ClearOuts empties the output list, keeping its memory for reuse.
func (t *Table) ClearOuts() {
	outs := t.sess.outs
	for k := range outs {
		if outs[k].Resp.Data != nil {
			outs[k].Resp.Data = nil // the one reference: every Out is written whole when reused
		}
	}
	t.sess.outs = outs[:0]
	t.sess.scratch = t.sess.scratch[:0]
}

// store records an outcome in session s, kept in request id order.
func (s *session) store(r record) { *s.put(r.id) = r }

// put returns the zeroed record of request id in session s, to be filled in place: appended
// (ids normally arrive in increasing order), inserted in id order, or the one stored for id
// before, cleared.
func (s *session) put(id uint64) *record {
	n := len(s.records)
	if n == 0 || s.records[n-1].id < id {
		if n == cap(s.records) {
			s.grow()
		}
		s.records = s.records[:n+1]
		s.records[n] = record{id: id}
		return &s.records[n]
	}
	return s.putSlow(id)
}

// A session's stored outcomes grow in few steps: 4, 16, 64 and 256 records (each slice four
// times the last), then by a quarter (rounded up to a multiple of recordsGrowStep, 1 KiB).
//
// Every outgrown slice is garbage, and it stays resident until a collection, which a busy server
// may not run for minutes: its request path allocates nothing. append's doubling from one record
// left 8 KiB of them behind in every session that reached 256 (issue 28: 16 busy connections'
// peak RSS sat at the 10 MB line); these steps leave 2.6 KiB. Past 256, a busy session's count
// settles a little above it when its client ACKs every 256 answers with 32 requests in flight
// (what every client and the benchmark do): doubling there held 512 records (16 KiB) for about
// 300, in every busy session.
const (
	recordsGrowFrom = 256
	recordsGrowStep = 32
)

// grow makes room for more records (see recordsGrowFrom).
func (s *session) grow() {
	n := cap(s.records)
	c := min(max(4, 4*n), recordsGrowFrom)
	if n >= recordsGrowFrom {
		c = (n + n/4 + recordsGrowStep - 1) / recordsGrowStep * recordsGrowStep
	}
	r := make([]record, len(s.records), c)
	copy(r, s.records)
	s.records = r
}

func (s *session) putSlow(id uint64) *record {
	n := len(s.records)
	i := sort.Search(n, func(i int) bool { return s.records[i].id >= id })
	if i == n || s.records[i].id != id {
		if n == cap(s.records) {
			s.grow()
		}
		s.records = s.records[:n+1]
		copy(s.records[i+1:], s.records[i:n])
	}
	s.records[i] = record{id: id}
	return &s.records[i]
}

// find returns the stored outcome of request id, or nil.
func (s *session) find(id uint64) *record {
	n := len(s.records)
	i := sort.Search(n, func(i int) bool { return s.records[i].id >= id })
	if i < n && s.records[i].id == id {
		return &s.records[i]
	}
	return nil
}

// ack applies ACK(x): outcomes below x stored before the previous ACK are dropped. A record's
// epoch is at most the current count, so "stored since the previous ACK" is equality (modulo
// 2^32: a record would have to outlive 2^32 ACKs, about 4*10^12 answers, to be mistaken).
func (s *session) ack(x uint64) {
	cur := uint32(s.acks)
	kept := 0
	i := 0
	for ; i < len(s.records) && s.records[i].id < x; i++ {
		if s.records[i].epoch == cur {
			s.records[kept] = s.records[i]
			kept++
		}
	}
	if kept < i {
		n := copy(s.records[kept:], s.records[i:])
		clear(s.records[kept+n:])
		s.records = s.records[:kept+n]
	}
	s.acks++
}

// keyHash is a fixed 64-bit multiply-mix hash of the key, eight bytes at a time, folded to 32
// bits: the same on every node and every version (it is part of the replicated state), used
// only to tell a retry whose key differs from its original.
func keyHash(k []byte) uint32 {
	h := uint64(len(k)) * 0x9e3779b97f4a7c15
	for len(k) >= 8 {
		h = mix64(h ^ binary.LittleEndian.Uint64(k))
		k = k[8:]
	}
	var tail uint64
	for i, c := range k {
		tail |= uint64(c) << (8 * i)
	}
	h = mix64(h ^ tail ^ 0xff51afd7ed558ccd)
	return uint32(h ^ h>>32)
}

func mix64(x uint64) uint64 {
	hi, lo := bits.Mul64(x, 0xbf58476d1ce4e5b9)
	return hi ^ lo
}
