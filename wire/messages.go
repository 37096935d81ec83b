package wire

// The server's error messages (the data of INVALID, BUSY and SHUTTING_DOWN answers and of
// CHALLENGE errors), constant so that answering does not allocate, except the key and lease
// limits' (MsgKeyTooLong, MsgLeaseRange: formats naming the numbers, on that error path only).
// The vectors use them (MsgKey and MsgLease as examples), so a client can compare texts too;
// clients must not depend on them (act on status and detail).
const (
	MsgLength        = "frame length does not match its layout"
	MsgTooLarge      = "frame larger than the protocol's ceiling"
	MsgOp            = "unknown operation"
	MsgFlags         = "reserved flags must be zero"
	MsgKey           = "key empty or longer than the server's max key length"
	MsgKeyEmpty      = "empty key"
	MsgKeyTooLong    = "key of %d bytes is longer than the server's max key length (%d)"
	MsgLeaseRange    = "lease %d ms is outside the server's range (%s to %s)"
	MsgLease         = "lease outside the server's range"
	MsgToken         = "token must be non-zero"
	MsgRequestID     = "request id must be non-zero and below 2^64-1"
	MsgPingID        = "request id not above this connection's earlier ones"
	MsgRequestIDUsed = "request id already used on this connection"
	MsgRetryDiffers  = "retried request differs from the original"
	MsgShuttingDown  = "server shutting down"
	MsgStartup       = "the server is in its start-up wait: no grant for %d ms more (leases granted before its restart may still run)"
	MsgInflight      = "too many queued acquires on this session"
	MsgOutcomes      = "too many stored outcomes on this session: send ACK"
	MsgWaitersPerKey = "too many waiters on this key"
	MsgWaitersTotal  = "too many waiters on this server"
	MsgLocks         = "too many keys on this server"
	MsgStorage       = "tokens or restart horizon cannot be made durable"
	MsgConnections   = "too many connections"
	MsgSessions      = "too many sessions"
	MsgVersion       = "unsupported protocol version"
	MsgSessionZero   = "session id must be non-zero"
	MsgNotLeader     = "not the leader"
	MsgAuthFailed    = "authentication failed"
)
