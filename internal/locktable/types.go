// Package locktable is the deterministic lock engine of Ticketing: one FIFO
// queue per key, a holder with a lease, fencing tokens, wait timeouts and an
// optional lock-delay after a lease expiry.
//
// The table has no goroutines, no clocks, no I/O and no locking. Time is an
// int64 (nanoseconds on a monotonic clock) supplied by the caller on every
// call, and the caller serialises all calls. Whatever the table decides later
// than the call that caused it (a hand-off, a wait timeout, an expiry) comes
// out as an Event. The same sequence of calls (with the same TokenSource
// answers) always yields the same results and the same events, so the table
// can serve a single node and a replicated state machine alike, and a test can
// replay any history exactly.
//
// Deadlines are only acted upon by Advance: Acquire, Release, Extend, Cancel
// and DropOwner see the state as of the last Advance. A caller that wants
// "now" to be authoritative calls Advance(now) first (the server does this
// once per batch of requests).
//
// In steady state (no new high-water mark of keys, waiters, owners, pending
// deadlines or unconsumed events) no method allocates on the heap: keys,
// waiters and owners live in slabs recycled through free lists and are found
// through the table's own hash indices, and all deadlines share one min-heap.
package locktable

// Owner identifies who asked (the server uses a connection id). It is opaque
// to the table: the table never compares owners except to find an owner's
// queued acquires (Cancel, DropOwner, Duplicate).
type Owner uint64

// TokenSource hands out fencing tokens; each call returns a value larger than
// every previous one (and never 0). The table calls Next exactly once per
// grant, in the order the grants happen.
type TokenSource interface{ Next() uint64 }

// Config holds the table's limits. Zero values mean "unlimited" or "off".
type Config struct {
	MaxWaitersPerKey int   // 0 = unlimited
	MaxWaitersTotal  int   // 0 = unlimited
	MaxLocks         int   // max distinct keys present (held, waited on, or in lock-delay); 0 = unlimited
	LockDelay        int64 // ns a key stays unavailable after a lease EXPIRY (never after release); 0 = off
	// AvailableFrom: no grants before this time. A key first asked for earlier starts in
	// lock-delay until then (a restarted single node's start-up grace: no grant until every
	// lease granted before the restart has run out). 0 = off.
	AvailableFrom int64
}

// Status is the immediate answer to a request.
type Status uint8

const (
	OK        Status = iota // granted now (Acquire) / done (Release, Extend)
	Queued                  // Acquire: waiting; the answer comes later as an event
	TimedOut                // Acquire with wait==0 and the key unavailable
	NotHeld                 // Release/Extend: token is not the current holder's token for that key
	Busy                    // a limit was reached; Result.Limit says which
	Duplicate               // Acquire: this owner already has a queued acquire with this reqID
)

var statusNames = [...]string{"OK", "Queued", "TimedOut", "NotHeld", "Busy", "Duplicate"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "Status(?)"
}

// Limit says which limit made an Acquire answer Busy.
type Limit uint8

const (
	LimitNone Limit = iota
	LimitWaitersPerKey
	LimitWaitersTotal
	LimitLocks
)

var limitNames = [...]string{"LimitNone", "LimitWaitersPerKey", "LimitWaitersTotal", "LimitLocks"}

func (l Limit) String() string {
	if int(l) < len(limitNames) {
		return limitNames[l]
	}
	return "Limit(?)"
}

// Result is the immediate answer to Acquire.
type Result struct {
	Status Status
	Token  uint64 // OK from Acquire
	Limit  Limit  // Busy
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	EvGranted  EventKind = iota + 1 // a queued acquire was granted (hand-off after release, expiry, lock-delay end)
	EvTimedOut                      // a queued acquire's wait timeout passed; it left the queue
	EvExpired                       // a holder's lease ran out; the lock was taken from it
	EvAborted                       // a queued acquire removed by Abort (server shutting down)
)

var eventNames = [...]string{"Ev(0)", "EvGranted", "EvTimedOut", "EvExpired", "EvAborted"}

func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "Ev(?)"
}

// Event is something the table decided outside the immediate answer to a
// call: a hand-off, a wait timeout, a lease expiry, an abort.
type Event struct {
	Kind  EventKind
	Owner Owner  // the waiter (Granted/TimedOut/Aborted) or the holder that lost the lock (Expired)
	ReqID uint64 // the acquire's request id (for Expired: the request id of the acquire that was granted)
	Token uint64 // Granted: new token; Expired: the token that expired
	Lease int64  // Granted: lease in ns
	Key   []byte // view into table memory; valid until the next call that may insert a key (Acquire)
	// Since (an addition to the original API, for wait- and hold-time
	// metrics): Granted/TimedOut/Aborted: the `now` at which the acquire was
	// queued; Expired: the `now` at which the expired lock was granted.
	Since int64
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
	Waiters     int
	DelayUntil  int64
}
