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
		{"CHALLENGE", uint32(OpChallenge), "server -> client: status, server version, flags, server nonce"},
		{"AUTH", uint32(OpAuth), "client -> server: client proof"},
		{"WELCOME", uint32(OpWelcome), "server -> client: status, server proof; the handshake is done"},
		{"ACQUIRE", uint32(OpAcquire), "take key for lease_ms, waiting up to wait_ms in the FIFO queue"},
		{"RELEASE", uint32(OpRelease), "release key held with token"},
		{"EXTEND", uint32(OpExtend), "set the lease of key held with token to lease_ms from now"},
		{"CANCEL", uint32(OpCancel), "withdraw this connection's pending ACQUIRE whose request id is in token"},
		{"PING", uint32(OpPing), "liveness; answered OK"},
		{"INSPECT", uint32(OpInspect), "report key's holder token, lease left, queue length, held-for and lock-delay left"},
		{"EXPIRED", uint32(OpExpired), "server push: the lease of key (data) with token ran out; the lock is lost"},
	}
	Statuses = []Named{
		{"OK", uint32(StatusOK), "done"},
		{"TIMED_OUT", uint32(StatusTimedOut), "the wait timeout passed (or wait 0 found the key taken); nothing is held"},
		{"NOT_HELD", uint32(StatusNotHeld), "the token is not the key's current holder; nothing changed"},
		{"INVALID", uint32(StatusInvalid), "bad request; detail is the field code; do not retry unchanged"},
		{"NOT_LEADER", uint32(StatusNotLeader), "this node is not the leader; data is the leader's address (may be empty); retry there"},
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
		{"WAIT", FieldWait, "wait_ms above the server's max wait (and not WAIT_FOREVER)"},
		{"TOKEN", FieldToken, "token is zero"},
		{"REQUEST_ID", FieldRequestID, "request id is zero or already used by a pending ACQUIRE on this connection"},
		{"HANDSHAKE", FieldHandshake, "a handshake frame was malformed or out of order; the connection closes"},
	}
	Limits = []Named{
		{"CONNECTIONS", LimitConnections, "too many connections (CHALLENGE status BUSY, then close)"},
		{"WAITERS_PER_KEY", LimitWaitersPerKey, "the key's queue is full"},
		{"WAITERS_TOTAL", LimitWaitersTotal, "the server's total number of queued acquires is reached"},
		{"LOCKS", LimitLocks, "the server's number of distinct keys is reached"},
		{"INFLIGHT", LimitInflight, "this connection has too many pending acquires"},
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
