package locktable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/ticketing/ticketing/wire"
)

// The command encoding: the binary form of every state change, so that a log can carry it and
// every replica applies exactly the same thing. A single node applies the same functions
// directly (Requests, Attach, ...) without encoding; a cluster proposes an Entry and every node
// calls Apply. Big-endian, fixed-width like the protocol.
//
// Entry (one log entry, or one batch on a single node):
//
//	0  1  version (CommandVersion)
//	1  3  reserved, 0
//	4  4  count: commands that follow
//	8  8  time: ns on the table's clock, stamped by the proposer; Apply uses max(last, time)
//	16 .. commands
//
// Command:
//
//	0  1  type (Cmd*)
//	1  1  flags: bit 0 IGNORABLE — an unknown type with this bit is skipped, without it Apply fails
//	2  2  reserved, 0
//	4  4  body length n
//	8  n  body
//
// Bodies:
//
//	REQUESTS  session_id[16] conn u64, then request frames exactly as on the wire (PROTOCOL.md),
//	          already validated by the proposer
//	ATTACH    session_id[16] conn u64 grace_ms u32 reserved u32
//	DETACH    session_id[16] conn u64
//	TICK      empty (the entry's time is the point)
//	CEILING   token_limit u64 horizon i64 (single node: what is durable on disk)
//	STORAGE   failing u8, reserved [7]
//	STOP      empty (graceful stop of a single node)
//	SEED      last_token u64 (a cluster bootstrapped from a single node's state: tokens continue above it)
//	UNDELIVERED session_id[16] conn u64 request_id u64 (a grant's answer was dropped unwritten:
//	          see Table.Undelivered)
//	INIT      state_id[16] flags u8 (bit 0 FORCE) reserved[7] not_before i64: a cluster's state
//	          id, set once (later INITs are ignored unless FORCE: a forced recovery or a restore
//	          makes a new one); no grant before not_before (table time)
//	NODE      id_len u16 id, addr_len u16 addr (a cluster node's client address, for leader hints)
//	DETACH_ALL empty (a new leader: no session has a connection any more)
//	CONFIG    max_waiters_per_key u64 max_waiters u64 max_locks u64 lock_delay_ns i64
//	          max_sessions u64 max_outcomes u64 max_queued u64: the table's limits (Limits)
//	          from this command on, on every replica (a cluster's leader appends its own when
//	          elected); 0 means what it means in Config
const (
	CommandVersion = 1

	CmdRequests  byte = 0x01
	CmdAttach    byte = 0x02
	CmdDetach    byte = 0x03
	CmdTick      byte = 0x04
	CmdCeiling   byte = 0x05
	CmdStorage   byte = 0x06
	CmdStop      byte = 0x07
	CmdSeed      byte = 0x08
	CmdUndeliv   byte = 0x09
	CmdInit      byte = 0x0a
	CmdNode      byte = 0x0b
	CmdDetachAll byte = 0x0c
	CmdConfig    byte = 0x0d

	CmdFlagIgnorable byte = 0x01

	entryHeaderSize = 16
	cmdHeaderSize   = 8
	configBodySize  = limitWords * 8
)

// Errors from Apply: the entry is not one this version can apply.
var (
	ErrCommandVersion = errors.New("locktable: unsupported command version")
	ErrCommandLayout  = errors.New("locktable: malformed command")
	ErrCommandType    = errors.New("locktable: unknown command type")
)

var be = binary.BigEndian

// Encoder builds one entry. The zero value is ready; Reset starts a new entry in the same
// memory.
type Encoder struct {
	buf   []byte
	count uint32
	start int // offset of the open REQUESTS command's header, or -1
}

// Reset starts a new entry stamped with time now.
func (e *Encoder) Reset(now int64) {
	e.buf = append(e.buf[:0], CommandVersion, 0, 0, 0, 0, 0, 0, 0)
	e.buf = be.AppendUint64(e.buf, uint64(now))
	e.count = 0
	e.start = -1
}

// Len is the entry's size so far.
func (e *Encoder) Len() int { return len(e.buf) }

// Bytes returns the entry (valid until the next call on e).
func (e *Encoder) Bytes() []byte {
	e.close()
	be.PutUint32(e.buf[4:], e.count)
	return e.buf
}

func (e *Encoder) open(typ byte) int {
	e.close()
	at := len(e.buf)
	e.buf = append(e.buf, typ, 0, 0, 0, 0, 0, 0, 0)
	e.count++
	return at
}

func (e *Encoder) finish(at int) {
	be.PutUint32(e.buf[at+4:], uint32(len(e.buf)-at-cmdHeaderSize))
}

// close finishes an open REQUESTS command.
func (e *Encoder) close() {
	if e.start >= 0 {
		e.finish(e.start)
		e.start = -1
	}
}

// Requests begins a REQUESTS command for session sid on connection conn; add its frames with
// Request (or append raw frames with Frames).
func (e *Encoder) Requests(sid *[wire.SessionIDSize]byte, conn uint64) {
	at := e.open(CmdRequests)
	e.buf = append(e.buf, sid[:]...)
	e.buf = be.AppendUint64(e.buf, conn)
	e.start = at
}

// Request adds one request to the open REQUESTS command.
func (e *Encoder) Request(r *wire.Request) { e.buf = wire.AppendRequest(e.buf, r) }

// Attach adds an ATTACH command.
func (e *Encoder) Attach(sid *[wire.SessionIDSize]byte, conn uint64, graceMs uint32) {
	at := e.open(CmdAttach)
	e.buf = append(e.buf, sid[:]...)
	e.buf = be.AppendUint64(e.buf, conn)
	e.buf = be.AppendUint32(e.buf, graceMs)
	e.buf = be.AppendUint32(e.buf, 0)
	e.finish(at)
}

// Detach adds a DETACH command.
func (e *Encoder) Detach(sid *[wire.SessionIDSize]byte, conn uint64) {
	at := e.open(CmdDetach)
	e.buf = append(e.buf, sid[:]...)
	e.buf = be.AppendUint64(e.buf, conn)
	e.finish(at)
}

// Tick adds a TICK command.
func (e *Encoder) Tick() { e.finish(e.open(CmdTick)) }

// Ceiling adds a CEILING command.
func (e *Encoder) Ceiling(tokenLimit uint64, horizon int64) {
	at := e.open(CmdCeiling)
	e.buf = be.AppendUint64(e.buf, tokenLimit)
	e.buf = be.AppendUint64(e.buf, uint64(horizon))
	e.finish(at)
}

// Storage adds a STORAGE command.
func (e *Encoder) Storage(failing bool) {
	at := e.open(CmdStorage)
	var f byte
	if failing {
		f = 1
	}
	e.buf = append(e.buf, f, 0, 0, 0, 0, 0, 0, 0)
	e.finish(at)
}

// Stop adds a STOP command.
func (e *Encoder) Stop() { e.finish(e.open(CmdStop)) }

// Seed adds a SEED command.
func (e *Encoder) Seed(lastToken uint64) {
	at := e.open(CmdSeed)
	e.buf = be.AppendUint64(e.buf, lastToken)
	e.finish(at)
}

// Undelivered adds an UNDELIVERED command.
func (e *Encoder) Undelivered(sid *[wire.SessionIDSize]byte, conn, reqID uint64) {
	at := e.open(CmdUndeliv)
	e.buf = append(e.buf, sid[:]...)
	e.buf = be.AppendUint64(e.buf, conn)
	e.buf = be.AppendUint64(e.buf, reqID)
	e.finish(at)
}

// Init adds an INIT command: state id, whether it replaces an existing one, and the time
// before which nothing is granted.
func (e *Encoder) Init(stateID *[wire.StateIDSize]byte, force bool, notBefore int64) {
	at := e.open(CmdInit)
	e.buf = append(e.buf, stateID[:]...)
	var f byte
	if force {
		f = 1
	}
	e.buf = append(e.buf, f, 0, 0, 0, 0, 0, 0, 0)
	e.buf = be.AppendUint64(e.buf, uint64(notBefore))
	e.finish(at)
}

// Node adds a NODE command.
func (e *Encoder) Node(id, addr string) {
	at := e.open(CmdNode)
	e.buf = be.AppendUint16(e.buf, uint16(len(id)))
	e.buf = append(e.buf, id...)
	e.buf = be.AppendUint16(e.buf, uint16(len(addr)))
	e.buf = append(e.buf, addr...)
	e.finish(at)
}

// DetachAll adds a DETACH_ALL command.
func (e *Encoder) DetachAll() { e.finish(e.open(CmdDetachAll)) }

// Config adds a CONFIG command carrying the limits l.
func (e *Encoder) Config(l Limits) {
	at := e.open(CmdConfig)
	for _, v := range l.words() {
		e.buf = be.AppendUint64(e.buf, uint64(v))
	}
	e.finish(at)
}

// SetTime overwrites the time stamped in a finished entry (a proposer stamps at submission).
func SetTime(entry []byte, now int64) { be.PutUint64(entry[8:], uint64(now)) }

// EntryTime returns the time stamped in an entry.
func EntryTime(entry []byte) (int64, error) {
	if len(entry) < entryHeaderSize {
		return 0, ErrCommandLayout
	}
	return int64(be.Uint64(entry[8:])), nil
}

// Apply applies one entry: every command in order, at time max(the table's time, the entry's
// time). Outputs come out through Outs. It stops at the first malformed or unknown
// (non-ignorable) command and returns an error; the commands before it stay applied, so a
// caller that replicates the table must treat an error as fatal for that replica. reqs is
// scratch memory for decoded requests (may be nil); Apply returns it for reuse.
func (t *Table) Apply(entry []byte, reqs []wire.Request) ([]wire.Request, error) {
	if len(entry) < entryHeaderSize {
		return reqs, ErrCommandLayout
	}
	if entry[0] != CommandVersion {
		return reqs, fmt.Errorf("%w %d", ErrCommandVersion, entry[0])
	}
	count := be.Uint32(entry[4:])
	now := int64(be.Uint64(entry[8:]))
	b := entry[entryHeaderSize:]
	for c := uint32(0); c < count; c++ {
		if len(b) < cmdHeaderSize {
			return reqs, ErrCommandLayout
		}
		typ, flags, n := b[0], b[1], be.Uint32(b[4:])
		if uint64(n) > uint64(len(b)-cmdHeaderSize) {
			return reqs, ErrCommandLayout
		}
		body := b[cmdHeaderSize : cmdHeaderSize+int(n)]
		b = b[cmdHeaderSize+int(n):]
		var err error
		reqs, err = t.applyCommand(now, typ, flags, body, reqs)
		if err != nil {
			return reqs, err
		}
	}
	if len(b) != 0 {
		return reqs, ErrCommandLayout
	}
	return reqs, nil
}

func (t *Table) applyCommand(now int64, typ, flags byte, body []byte, reqs []wire.Request) ([]wire.Request, error) {
	var sid [wire.SessionIDSize]byte
	switch typ {
	case CmdRequests:
		if len(body) < 24 {
			return reqs, ErrCommandLayout
		}
		copy(sid[:], body)
		conn := be.Uint64(body[16:])
		reqs = reqs[:0]
		for off := 24; off < len(body); {
			reqs = append(reqs, wire.Request{})
			n, err := wire.DecodeRequest(body[off:], wire.MaxKeyLen, &reqs[len(reqs)-1])
			if err != nil {
				return reqs, ErrCommandLayout
			}
			off += n
		}
		owner := Owner(0)
		if i, ok := t.sess.byID[sid]; ok {
			owner = t.sess.slots[i].owner
		}
		t.Requests(now, owner, conn, reqs)
	case CmdAttach:
		if len(body) != 32 {
			return reqs, ErrCommandLayout
		}
		copy(sid[:], body)
		conn := be.Uint64(body[16:])
		if conn == 0 || sid == ([wire.SessionIDSize]byte{}) {
			return reqs, ErrCommandLayout
		}
		t.Attach(now, sid, conn, int64(be.Uint32(body[24:]))*nsPerMs)
	case CmdDetach:
		if len(body) != 24 {
			return reqs, ErrCommandLayout
		}
		copy(sid[:], body)
		if i, ok := t.sess.byID[sid]; ok {
			t.Detach(now, t.sess.slots[i].owner, be.Uint64(body[16:]))
		} else {
			t.Tick(now)
		}
	case CmdTick:
		t.Tick(now)
	case CmdCeiling:
		if len(body) != 16 {
			return reqs, ErrCommandLayout
		}
		t.Ceiling(now, be.Uint64(body), int64(be.Uint64(body[8:])))
	case CmdStorage:
		if len(body) != 8 {
			return reqs, ErrCommandLayout
		}
		t.Storage(now, body[0] != 0)
	case CmdStop:
		t.Stop(now)
	case CmdSeed:
		if len(body) != 8 {
			return reqs, ErrCommandLayout
		}
		t.Tick(now)
		t.lastToken = max(t.lastToken, be.Uint64(body))
	case CmdUndeliv:
		if len(body) != 32 {
			return reqs, ErrCommandLayout
		}
		copy(sid[:], body)
		if i, ok := t.sess.byID[sid]; ok {
			t.Undelivered(now, t.sess.slots[i].owner, be.Uint64(body[16:]), be.Uint64(body[24:]))
			t.drain(t.sess.now)
		} else {
			t.Tick(now)
		}
	case CmdInit:
		if len(body) != wire.StateIDSize+16 {
			return reqs, ErrCommandLayout
		}
		t.Tick(now)
		if force := body[wire.StateIDSize]&1 != 0; force || t.stateID == ([wire.StateIDSize]byte{}) {
			copy(t.stateID[:], body)
			t.availFrom = max(t.availFrom, int64(be.Uint64(body[wire.StateIDSize+8:])))
		}
	case CmdNode:
		if len(body) < 2 {
			return reqs, ErrCommandLayout
		}
		n := int(be.Uint16(body))
		if len(body) < 2+n+2 {
			return reqs, ErrCommandLayout
		}
		id := string(body[2 : 2+n])
		m := int(be.Uint16(body[2+n:]))
		if len(body) != 4+n+m {
			return reqs, ErrCommandLayout
		}
		t.Tick(now)
		if t.nodes == nil {
			t.nodes = make(map[string]string)
		}
		t.nodes[id] = string(body[4+n:])
	case CmdDetachAll:
		t.DetachAll(now)
	case CmdConfig:
		if len(body) != configBodySize {
			return reqs, ErrCommandLayout
		}
		var w [limitWords]int64
		for k := range w {
			w[k] = int64(be.Uint64(body[8*k:]))
		}
		t.SetLimits(now, limitsOf(w))
	default:
		if flags&CmdFlagIgnorable == 0 {
			return reqs, fmt.Errorf("%w 0x%02x", ErrCommandType, typ)
		}
		t.Tick(now)
	}
	return reqs, nil
}

// limitWords is the number of 8-byte words of a CONFIG body (and of the limits in a snapshot).
const limitWords = 7

// words is l as CONFIG and Snapshot carry it, in the order of the CONFIG body. The counts are
// clamped to 0..math.MaxInt32 (negative means what 0 means in Config; more than MaxInt32 is
// more than any table holds), so that the same words decode to the same limits on every
// platform and a decoded Limits encodes to the same words.
func (l Limits) words() [limitWords]int64 {
	c := func(v int) int64 { return int64(min(max(v, 0), math.MaxInt32)) }
	return [limitWords]int64{c(l.MaxWaitersPerKey), c(l.MaxWaitersTotal), c(l.MaxLocks), l.LockDelay,
		c(l.MaxSessions), c(l.MaxOutcomes), c(l.MaxQueued)}
}

// limitsOf is the inverse of words, for any words (a malformed count is clamped as in words).
func limitsOf(w [limitWords]int64) Limits {
	c := func(v int64) int { return int(min(max(v, 0), math.MaxInt32)) }
	return Limits{MaxWaitersPerKey: c(w[0]), MaxWaitersTotal: c(w[1]), MaxLocks: c(w[2]), LockDelay: w[3],
		MaxSessions: c(w[4]), MaxOutcomes: c(w[5]), MaxQueued: c(w[6])}
}
