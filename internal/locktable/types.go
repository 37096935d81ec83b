// Package locktable is the deterministic lock state machine of Ticketing: one
// FIFO queue per key, a holder with a lease, fencing tokens, wait timeouts, an
// optional lock-delay after a lease expiry, client sessions with resume,
// retries and revocable grants, and (on a single node) grants bounded by what
// is durable on disk.
//
// The table has no goroutines, no clocks, no I/O and no locking. Time is an
// int64 (nanoseconds on the caller's clock) passed in with every call, and the
// caller serialises all calls. The same sequence of calls always yields the
// same results, the same events and the same state, so one table serves a
// single node (which applies each batch of requests directly) and a replicated
// state machine (which applies the same batches from a log) alike, and a test
// can replay any history exactly.
//
// Two layers live here:
//   - the core (table.go, keys.go, waiters.go, heap.go): keys, queues, holders,
//     timers and tokens, addressed by an opaque Owner; what it decides later
//     than the call that caused it (a hand-off, a wait timeout, an expiry)
//     comes out as an Event;
//   - the session layer (sessions.go, apply.go): the protocol's rules —
//     sessions, request ids, retries, stored outcomes, ACK, revocation — turning
//     requests into answers and events into pushes (Out), addressed to
//     connections.
//
// Commands (command.go) are the binary form of every state change, for a log;
// Snapshot and Restore (snapshot.go) copy the whole state.
//
// Deadlines are only acted upon by Advance: the other calls see the state as
// of the last Advance. A caller that wants "now" to be authoritative calls
// Advance(now) first (Apply does, for every batch).
//
// In steady state (no new high-water mark of keys, waiters, owners, sessions,
// stored outcomes, pending deadlines or unconsumed events) the request path
// does not allocate: everything lives in slabs and slices recycled in place.
package locktable

import "math"

// Owner identifies who asked. For the core it is opaque; the session layer
// uses a session's number. The table never compares owners except to find an
// owner's queued acquires and held locks.
type Owner uint64

// Unlimited as Config.TokenLimit or a horizon: no storage bound.
const (
	NoTokenLimit uint64 = math.MaxUint64
	NoHorizon    int64  = math.MaxInt64
)

// Config holds the table's limits. Zero values mean "unlimited" or "off"
// unless stated.
type Config struct {
	MaxWaitersPerKey int   // 0 = unlimited
	MaxWaitersTotal  int   // 0 = unlimited
	MaxLocks         int   // max distinct keys present (held, waited on, in lock-delay or stalled); 0 = unlimited
	LockDelay        int64 // ns a key stays unavailable after a lease EXPIRY (never after release); 0 = off
	// AvailableFrom: no grants before this time. A key first asked for earlier starts in
	// lock-delay until then (a restarted single node's start-up wait: no grant until every
	// lease granted before the restart has run out). 0 = off.
	AvailableFrom int64
	// LastToken: tokens handed out start after this value.
	LastToken uint64
	// Durable: grants need a token at or below the durable token limit and a lease that ends at
	// or before the durable horizon (see Ceiling). Off: both are unlimited (a cluster, whose
	// log is its durability, and tests).
	Durable bool

	// Session layer (sessions.go). Zero values take the defaults.
	MaxSessions int // live sessions; default 20,000
	MaxOutcomes int // stored outcomes per session; default 4,096
	MaxQueued   int // queued acquires per session; default 4,096
}

// Limits are the settings of Config that shape the table's state: what an acquire, an attach
// or an expiry does depends on them. A replicated table must apply the same ones on every
// replica, so a cluster carries them in the log (the CONFIG command, Encoder.Config) and every
// replica applies them from that entry on (SetLimits); they are part of Snapshot and StateHash.
// Zero values mean what they mean in Config.
type Limits struct {
	MaxWaitersPerKey int
	MaxWaitersTotal  int
	MaxLocks         int
	LockDelay        int64 // ns
	MaxSessions      int
	MaxOutcomes      int
	MaxQueued        int
}

// Limits returns the limits of c.
func (c Config) Limits() Limits {
	return Limits{MaxWaitersPerKey: c.MaxWaitersPerKey, MaxWaitersTotal: c.MaxWaitersTotal, MaxLocks: c.MaxLocks,
		LockDelay: c.LockDelay, MaxSessions: c.MaxSessions, MaxOutcomes: c.MaxOutcomes, MaxQueued: c.MaxQueued}
}

// setLimits replaces the limits of c with l.
func (c *Config) setLimits(l Limits) {
	c.MaxWaitersPerKey, c.MaxWaitersTotal, c.MaxLocks = l.MaxWaitersPerKey, l.MaxWaitersTotal, l.MaxLocks
	c.LockDelay, c.MaxSessions, c.MaxOutcomes, c.MaxQueued = l.LockDelay, l.MaxSessions, l.MaxOutcomes, l.MaxQueued
}

// Observer receives what the table decides, for metrics. It is called synchronously, inside
// the table's calls (the caller's lock held): it must be quick, must not allocate in steady
// state, and must not call back into the table. It never influences the table's state.
type Observer interface {
	// Granted: a lock on key was granted; waited is how long the acquire queued (ns; 0 for an
	// immediate grant); handoff: it was queued (a hand-off after a release, expiry, lock-delay
	// or storage stall).
	Granted(key []byte, waited int64, handoff bool)
	// Ended: the hold of key ended after held ns; how says why.
	Ended(key []byte, held int64, how EndReason)
	// Queued: an acquire joined key's queue, which now has depth waiters.
	Queued(key []byte, depth int)
	// TimedOut: a queued acquire on key gave up after waited ns.
	TimedOut(key []byte, waited int64)
}

// EndReason says why a hold ended (Observer.Ended).
type EndReason uint8

const (
	EndReleased EndReason = iota + 1
	EndExpired
	EndRevoked
)

// Status is the immediate answer of a core call.
type Status uint8

const (
	OK        Status = iota // granted now (Acquire) / done (Release, Extend)
	Queued                  // Acquire: waiting; the answer comes later as an event
	TimedOut                // Acquire with wait==0 and the key unavailable
	NotHeld                 // Release/Extend: token is not the current holder's token for that key
	Busy                    // a limit was reached; Result.Limit says which
	Duplicate               // Acquire: this owner already has a queued acquire with this reqID
	Deferred                // Extend: waits for a durable horizon; the answer comes later as an event
)

var statusNames = [...]string{"OK", "Queued", "TimedOut", "NotHeld", "Busy", "Duplicate", "Deferred"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "Status(?)"
}

// Limit says which limit made a call answer Busy.
type Limit uint8

const (
	LimitNone Limit = iota
	LimitWaitersPerKey
	LimitWaitersTotal
	LimitLocks
	LimitStorage // storage is failing: no durable token or horizon can be had now
)

var limitNames = [...]string{"LimitNone", "LimitWaitersPerKey", "LimitWaitersTotal", "LimitLocks", "LimitStorage"}

func (l Limit) String() string {
	if int(l) < len(limitNames) {
		return limitNames[l]
	}
	return "Limit(?)"
}

// Result is the immediate answer to Acquire and Extend.
type Result struct {
	Status Status
	Token  uint64 // OK from Acquire
	Limit  Limit  // Busy
	entry  int32  // OK from Acquire: the entry granted
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	EvGranted       EventKind = iota + 1 // a queued acquire was granted (hand-off after release, expiry, lock-delay end, storage)
	EvTimedOut                           // a queued acquire's wait timeout passed (or a try found the key taken after a storage stall); it left the queue
	EvExpired                            // a holder's lease ran out; the lock was taken from it
	EvAborted                            // a queued acquire removed by Abort (server stopping)
	EvStorageBusy                        // a queued try-acquire, or a deferred extend (Extend set), failed because storage is failing
	EvExtended                           // a deferred extend was applied (Token, Lease)
	EvExtendNotHeld                      // a deferred extend's token no longer held the key
)

var eventNames = [...]string{"Ev(0)", "EvGranted", "EvTimedOut", "EvExpired", "EvAborted", "EvStorageBusy", "EvExtended", "EvExtendNotHeld"}

func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "Ev(?)"
}

// Event is something the core decided outside the immediate answer to a
// call: a hand-off, a wait timeout, a lease expiry, an abort, the outcome of a
// deferred extend.
type Event struct {
	Kind  EventKind
	Owner Owner  // the waiter (Granted/TimedOut/Aborted/StorageBusy), the holder that lost the lock (Expired), the extender
	ReqID uint64 // the request id (for Expired: that of the acquire that was granted)
	Token uint64 // Granted: new token; Expired: the token that expired; Extended: the token
	Lease int64  // Granted, Extended: lease in ns; TimedOut, Aborted, StorageBusy: the lease asked for
	Key   []byte // view into table memory; valid until the next call that may insert a key (Acquire)
	// Since: Granted/TimedOut/Aborted: the `now` at which the acquire was queued; Expired: the
	// `now` at which the expired lock was granted.
	Since  int64
	Extend bool  // StorageBusy: the failed request was an EXTEND (else an ACQUIRE)
	entry  int32 // Granted: the entry granted (it may have changed hands before the event is read)
}

// Info is what Inspect reports about a key. Holder, HolderReqID, Token,
// GrantedAt and Deadline are zero unless Held. DelayUntil is non-zero only
// while the key is in lock-delay (then Held is false).
type Info struct {
	Holder      Owner
	HolderReqID uint64
	Token       uint64
	GrantedAt   int64
	Deadline    int64
	Held        bool
	Revocable   bool // the grant was made while its owner was detached
	Waiters     int
	DelayUntil  int64
	Stalled     bool // the key waits for a durable token or horizon before its next grant
}
