package wire

import "strconv"

// Named is one entry of a code table: the canonical name shared by every client.
type Named struct {
	Name  string `json:"name"`
	Value uint32 `json:"value"`
	Doc   string `json:"doc"`
}

// Ops, Statuses, Fields and Limits are the code tables. protocol/constants.json is generated from
// them and every client verifies its own constants against that file.
var (
	Ops = []Named{
		{"HELLO", uint32(OpHello), "client -> server, first frame: version, session id, client nonce"},
		{"CHALLENGE", uint32(OpChallenge), "server -> client: status, server version, flags, detail, server nonce, data (leader address or message)"},
		{"AUTH", uint32(OpAuth), "client -> server: client proof"},
		{"WELCOME", uint32(OpWelcome), "server -> client: status, resumed flag, session grace, state id, server proof; the handshake is done"},
		{"ACQUIRE", uint32(OpAcquire), "take key for lease_ms, waiting up to wait_ms in the FIFO queue"},
		{"RELEASE", uint32(OpRelease), "release key held with token"},
		{"EXTEND", uint32(OpExtend), "set the lease of key held with token to lease_ms from now"},
		{"CANCEL", uint32(OpCancel), "withdraw this session's ACQUIRE whose request id is in token"},
		{"PING", uint32(OpPing), "liveness; answered OK"},
		{"INSPECT", uint32(OpInspect), "report key's state: lease left, queue length, held-for, lock-delay left, flags; the token only to its holder"},
		{"ACK", uint32(OpAck), "token = the lowest request id still awaited: the server may drop stored outcomes below it"},
		{"EXPIRED", uint32(OpExpired), "server push: the lock on key (data) with token is lost; detail is the reason"},
		{"GOAWAY", uint32(OpGoaway), "server push: this node is going away; data is the leader's address; reconnect and resume"},
	}
	Statuses = []Named{
		{"OK", uint32(StatusOK), "done"},
		{"TIMED_OUT", uint32(StatusTimedOut), "the wait timeout passed (or wait 0 found the key taken); nothing is held"},
		{"NOT_HELD", uint32(StatusNotHeld), "the token is not the key's current holder (or a retried ACQUIRE holds nothing); nothing changed"},
		{"INVALID", uint32(StatusInvalid), "bad request; detail is the field code; do not retry unchanged"},
		{"NOT_LEADER", uint32(StatusNotLeader), "this node is not the leader; data is the leader's address (may be empty); reconnect there and resume"},
		{"BUSY", uint32(StatusBusy), "a server limit was reached; detail is the limit code; retry later with backoff"},
		{"SHUTTING_DOWN", uint32(StatusShuttingDown), "the server is stopping; reconnect (another endpoint) and retry"},
		{"AUTH_FAILED", uint32(StatusAuthFailed), "the proof did not verify; the connection closes; fix the token"},
		{"UNSUPPORTED_VERSION", uint32(StatusUnsupportedVersion), "the server does not speak the client's version; the connection closes"},
		{"CANCELLED", uint32(StatusCancelled), "the ACQUIRE was withdrawn by CANCEL; nothing is held"},
	}
	Fields = []Named{
		{"LENGTH", FieldLength, "frame length inconsistent with its layout or above the ceiling; the connection closes"},
		{"OP", FieldOp, "unknown operation"},
		{"FLAGS", FieldFlags, "reserved flags are not zero"},
		{"KEY", FieldKey, "key empty or longer than the server's max key length"},
		{"LEASE", FieldLease, "lease_ms outside the server's range"},
		{"WAIT", FieldWait, "reserved; never sent in version 1 (every wait_ms is valid)"},
		{"TOKEN", FieldToken, "token is zero"},
		{"REQUEST_ID", FieldRequestID, "request id zero, already used on this connection, or a retry that differs from its original"},
		{"HANDSHAKE", FieldHandshake, "reserved; a handshake frame with a bad layout closes the connection without an answer"},
		{"SESSION", FieldSession, "HELLO's session id is all zero"},
	}
	Limits = []Named{
		{"CONNECTIONS", LimitConnections, "too many connections (CHALLENGE status BUSY, then close)"},
		{"WAITERS_PER_KEY", LimitWaitersPerKey, "the key's queue is full"},
		{"WAITERS_TOTAL", LimitWaitersTotal, "the server's total number of queued acquires is reached"},
		{"LOCKS", LimitLocks, "the server's number of distinct keys is reached"},
		{"INFLIGHT", LimitInflight, "the session has too many queued acquires or stored outcomes (send ACK)"},
		{"STORAGE", LimitStorage, "tokens or the restart horizon cannot be made durable now; retry later"},
		{"SESSIONS", LimitSessions, "too many sessions (WELCOME status BUSY, then close)"},
	}
	ExpiredReasons = []Named{
		{"LEASE", ExpiredLease, "the lease ran out and the server reclaimed the lock (lost reason \"expired\")"},
		{"STOPPING", ExpiredStopping, "the server is stopping; the lease still runs but the lock is lost (lost reason \"server stopping\")"},
	}
	GoawayReasons = []Named{
		{"LEADERSHIP", GoawayLeadership, "this node is no longer the leader"},
		{"STOPPING", GoawayStopping, "this cluster node is stopping for maintenance"},
	}
	InspectFlags = []Named{
		{"HELD", InspectHeld, "somebody holds the key"},
		{"TOKEN_MATCH", InspectTokenMatch, "the request's token is the holder's token"},
		{"SESSION", InspectSession, "the asking session holds the key"},
		{"STALLED", InspectStalled, "the key waits for storage before its next grant"},
		{"STARTUP", InspectStartup, "the server is in its start-up wait: no grant before it ends (lock-delay left says when)"},
	}
)

func nameOf(t []Named, v uint32) string {
	for i := range t {
		if t[i].Value == v {
			return t[i].Name
		}
	}
	return "0x" + strconv.FormatUint(uint64(v), 16)
}

func (o Op) String() string     { return nameOf(Ops, uint32(o)) }
func (s Status) String() string { return nameOf(Statuses, uint32(s)) }

// FieldName and LimitName name a Detail value.
func FieldName(v uint32) string { return nameOf(Fields, v) }
func LimitName(v uint32) string { return nameOf(Limits, v) }

// ExpiredReasonName and GoawayReasonName name a push's Detail value.
func ExpiredReasonName(v uint32) string { return nameOf(ExpiredReasons, v) }
func GoawayReasonName(v uint32) string  { return nameOf(GoawayReasons, v) }
