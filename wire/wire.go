// Package wire is the Ticketing protocol, version 1: frame layouts, opcodes and status codes, encoded
// and decoded at fixed offsets without allocating. PROTOCOL.md at the repository root is the
// specification; protocol/constants.json and protocol/vectors.json are generated from this package
// (cd wire && go test -update) and every client checks itself against them.
//
// All integers are big-endian. Every frame starts with a 4-byte length: the number of bytes that
// follow the length field. After the handshake, requests and responses share one 32-byte header
// followed by a variable part (the key of a request, the data of a response).
package wire

import (
	"encoding/binary"
	"errors"
	"slices"
)

// Version is the protocol version this package speaks.
const Version = 1

// Op is a frame's operation code (offset 4 of every frame).
type Op uint8

// Handshake operations.
const (
	OpHello     Op = 0x01 // client -> server: version, session id, client nonce
	OpChallenge Op = 0x02 // server -> client: status, server version, auth flag, server nonce
	OpAuth      Op = 0x03 // client -> server: client proof
	OpWelcome   Op = 0x04 // server -> client: status, server proof
)

// Request operations (client -> server); the response carries the same op.
const (
	OpAcquire Op = 0x10
	OpRelease Op = 0x11
	OpExtend  Op = 0x12
	OpCancel  Op = 0x13
	OpPing    Op = 0x14
	OpInspect Op = 0x15
	OpAck     Op = 0x16
)

// Server pushes (request id 0), sent to the connection a session is attached to.
const (
	// OpExpired: the lease of a lock held by this session ended (Detail: Expired* reason); Token
	// is the lock's token, Data its key.
	OpExpired Op = 0x20
	// OpGoaway: this node is going away (Detail: Goaway* reason); Data is the leader's client
	// address when known. The client reconnects (there, or to the next endpoint) and resumes.
	OpGoaway Op = 0x21
)

// INSPECT answer data: u32 ms since the lock was granted, u32 ms of lock-delay left, u32 flags.
const InspectDataSize = 12

// INSPECT answer flags (the last u32 of its data).
const (
	InspectHeld       uint32 = 1 << 0 // somebody holds the key
	InspectTokenMatch uint32 = 1 << 1 // the request's token is the holder's token
	InspectSession    uint32 = 1 << 2 // the asking session holds the key
	InspectStalled    uint32 = 1 << 3 // the key waits for storage (tokens or horizon not yet durable)
	InspectStartup    uint32 = 1 << 4 // the server is in its start-up wait: no grant before it ends (lock-delay left says when)
)

// EXPIRED reasons (Response.Detail of an EXPIRED push).
const (
	ExpiredLease    uint32 = 1 // the lease ran out and the server reclaimed the lock
	ExpiredStopping uint32 = 2 // the server is stopping; the lease still runs, but treat the lock as lost
)

// GOAWAY reasons (Response.Detail of a GOAWAY push).
const (
	GoawayLeadership uint32 = 1 // this node is no longer (or soon not) the leader
	GoawayStopping   uint32 = 2 // this cluster node is stopping for maintenance
)

// Status is a response's outcome (offset 5 of every server frame).
type Status uint8

const (
	StatusOK                 Status = 0
	StatusTimedOut           Status = 1 // wait timeout passed (or wait 0 and the key was taken)
	StatusNotHeld            Status = 2 // token is not the current holder's; nothing changed
	StatusInvalid            Status = 3 // bad request; Detail names the field (Field*)
	StatusNotLeader          Status = 4 // Data holds the leader's client address ("" when unknown)
	StatusBusy               Status = 5 // a limit was reached; Detail names it (Limit*)
	StatusShuttingDown       Status = 6 // the server is stopping; retry on another endpoint
	StatusAuthFailed         Status = 7 // proof did not verify; the connection closes
	StatusUnsupportedVersion Status = 8 // the connection closes; CHALLENGE.Version is the server's
	StatusCancelled          Status = 9 // the acquire was withdrawn by a CANCEL request
)

// Field codes: Response.Detail of an INVALID answer.
const (
	FieldLength    uint32 = 1  // frame length inconsistent or too large (connection closes)
	FieldOp        uint32 = 2  // unknown operation
	FieldFlags     uint32 = 3  // reserved flags not zero
	FieldKey       uint32 = 4  // key empty or longer than the server's limit
	FieldLease     uint32 = 5  // lease outside the server's range
	FieldWait      uint32 = 6  // reserved: every wait_ms is valid in version 1
	FieldToken     uint32 = 7  // token zero
	FieldRequestID uint32 = 8  // request id zero, already used on this connection, or a retry that differs from its original
	FieldHandshake uint32 = 9  // reserved: handshake frames with a bad layout close without an answer
	FieldSession   uint32 = 10 // HELLO: the session id is all zero
)

// Limit codes: Response.Detail of a BUSY answer.
const (
	LimitConnections   uint32 = 1 // too many connections (CHALLENGE status BUSY, then close)
	LimitWaitersPerKey uint32 = 2
	LimitWaitersTotal  uint32 = 3
	LimitLocks         uint32 = 4 // too many distinct keys in the table
	LimitInflight      uint32 = 5 // the session has too many queued acquires or stored outcomes
	LimitStorage       uint32 = 6 // tokens or the restart horizon cannot be made durable now
	LimitSessions      uint32 = 7 // too many sessions (WELCOME status BUSY, then close)
)

// Sizes and special values.
const (
	HeaderSize    = 32 // request and response header
	HelloSize     = 56 // whole HELLO frame
	ChallengeSize = 48 // whole CHALLENGE frame without its data
	AuthSize      = 40 // whole AUTH frame
	WelcomeSize   = 64 // whole WELCOME frame
	StateIDSize   = 16
	// MaxChallengeData bounds a CHALLENGE's data (a leader address or a message).
	MaxChallengeData = 1024
	MaxKeyLen        = 0xFFFF // the format's ceiling; servers set a lower limit
	MaxDataLen       = 0xFFFF // response data ceiling
	MaxFrameSize     = HeaderSize + MaxKeyLen
	SessionIDSize    = 16
	NonceSize        = 32
	ProofSize        = 32
	// WaitForever as Request.WaitMs: wait without limit.
	WaitForever uint32 = 0xFFFFFFFF
	// ChallengeAuthRequired is the CHALLENGE flag bit saying the server requires auth.
	ChallengeAuthRequired uint8 = 0x01
	// WelcomeResumed is the WELCOME flag bit saying the session named in HELLO was resumed.
	WelcomeResumed uint8 = 0x01
)

// Rules every client follows (PROTOCOL.md, "Sessions" and "The lost signal").
const (
	// AckEvery: a client sends ACK at least once per this many answers received.
	AckEvery = 1024
	// ClockRateBoundPPM bounds the rate error of each of the client's and the server's clocks,
	// in parts per million: the local deadline is shortened by twice this fraction.
	ClockRateBoundPPM = 1000
	// LostMarginMs: the lost signal fires this many ms before the local deadline (or a tenth of
	// the lease when that is shorter), for timer latency.
	LostMarginMs = 5
	// LostCheckMs: a client holding locks checks their deadlines against its suspend-counting
	// clock at least this often (runtime timers stop during a suspend).
	LostCheckMs = 250
)

// Decoding errors. ErrShort is not an error on a stream: it means "read more bytes".
var (
	ErrShort    = errors.New("wire: incomplete frame")
	ErrLength   = errors.New("wire: frame length does not match its layout")
	ErrTooLarge = errors.New("wire: frame larger than the limit")
	ErrWrongOp  = errors.New("wire: unexpected operation")
)

var be = binary.BigEndian

// Request is a decoded request frame. Key aliases the input buffer.
type Request struct {
	Op     Op
	Flags  uint8
	ID     uint64 // request id, chosen by the client, non-zero
	Token  uint64 // RELEASE, EXTEND: the lock's token; CANCEL: the request id to withdraw; ACK: the lowest id still awaited; INSPECT: 0 or a token to check
	Lease  uint32 // ms; ACQUIRE, EXTEND
	WaitMs uint32 // ms; ACQUIRE (0 = try once, WaitForever = no limit)
	Key    []byte // ACQUIRE, RELEASE, EXTEND
}

// Response is a decoded response (or pushed notice). Data aliases the input buffer.
type Response struct {
	Op     Op
	Status Status
	ID     uint64 // the request's id; 0 for EXPIRED notices
	Token  uint64 // ACQUIRE OK: the fencing token; EXPIRED: the token that expired
	Lease  uint32 // ACQUIRE/EXTEND OK: the lease granted, ms
	Detail uint32 // ACQUIRE OK: ms spent queued; INSPECT: queued acquires; INVALID: Field*; BUSY: Limit*; CANCEL: 1 if withdrawn; ACK: outcomes still stored; EXPIRED/GOAWAY: reason
	Data   []byte // EXPIRED: the key; GOAWAY, NOT_LEADER: leader address; INSPECT: 12 bytes; errors: a UTF-8 message
}

// FrameLen reports the total size of the frame at the start of b (length field included), or
// ErrShort when fewer than 4 bytes are present. It does not check the frame's layout.
func FrameLen(b []byte) (int, error) {
	if len(b) < 4 {
		return 0, ErrShort
	}
	return 4 + int(be.Uint32(b)), nil
}

// AppendRequest appends the encoding of r to dst.
func AppendRequest(dst []byte, r *Request) []byte {
	n := len(r.Key)
	dst = be.AppendUint32(dst, uint32(HeaderSize-4+n))
	dst = append(dst, byte(r.Op), r.Flags)
	dst = be.AppendUint16(dst, uint16(n))
	dst = be.AppendUint64(dst, r.ID)
	dst = be.AppendUint64(dst, r.Token)
	dst = be.AppendUint32(dst, r.Lease)
	dst = be.AppendUint32(dst, r.WaitMs)
	return append(dst, r.Key...)
}

// DecodeRequest decodes the request frame at the start of b into r and returns the frame's size.
// maxKey bounds the frame (HeaderSize+maxKey): a larger length yields ErrTooLarge before the
// body is needed, so a reader never buffers an oversize frame. r.Key aliases b.
func DecodeRequest(b []byte, maxKey int, r *Request) (int, error) {
	size, err := frameBounds(b, maxKey)
	if err != nil {
		return 0, err
	}
	h := (*[HeaderSize]byte)(b[:HeaderSize]) // one bounds check for the fixed fields
	if int(be.Uint16(h[6:8])) != size-HeaderSize {
		return 0, ErrLength
	}
	r.Op = Op(h[4])
	r.Flags = h[5]
	r.ID = be.Uint64(h[8:16])
	r.Token = be.Uint64(h[16:24])
	r.Lease = be.Uint32(h[24:28])
	r.WaitMs = be.Uint32(h[28:32])
	r.Key = b[HeaderSize:size:size]
	return size, nil
}

// AppendResponse appends the encoding of r to dst.
func AppendResponse(dst []byte, r *Response) []byte {
	return appendResponse(dst, r.Op, r.Status, r.ID, r.Token, r.Lease, r.Detail, r.Data)
}

// AppendResponseString is AppendResponse with the data given as a string (a message), so
// callers with constant messages do not allocate.
func AppendResponseString(dst []byte, op Op, st Status, id, token uint64, lease, detail uint32, data string) []byte {
	if len(data) > MaxDataLen {
		data = data[:MaxDataLen]
	}
	dst = appendHeader(dst, op, st, len(data), id, token, lease, detail)
	return append(dst, data...)
}

func appendResponse(dst []byte, op Op, st Status, id, token uint64, lease, detail uint32, data []byte) []byte {
	if len(data) > MaxDataLen {
		data = data[:MaxDataLen]
	}
	dst = appendHeader(dst, op, st, len(data), id, token, lease, detail)
	return append(dst, data...)
}

// appendHeader appends a response header announcing n data bytes, with room for them reserved:
// one capacity check, then stores at fixed offsets.
func appendHeader(dst []byte, op Op, st Status, n int, id, token uint64, lease, detail uint32) []byte {
	off := len(dst)
	if cap(dst)-off < HeaderSize+n {
		dst = slices.Grow(dst, HeaderSize+n)
	}
	dst = dst[:off+HeaderSize]
	h := (*[HeaderSize]byte)(dst[off:])
	be.PutUint32(h[0:4], uint32(HeaderSize-4+n))
	h[4], h[5] = byte(op), byte(st)
	be.PutUint16(h[6:8], uint16(n))
	be.PutUint64(h[8:16], id)
	be.PutUint64(h[16:24], token)
	be.PutUint32(h[24:28], lease)
	be.PutUint32(h[28:32], detail)
	return dst
}

// DecodeResponse decodes the response frame at the start of b into r and returns its size.
// maxData bounds the data part. r.Data aliases b.
func DecodeResponse(b []byte, maxData int, r *Response) (int, error) {
	size, err := frameBounds(b, maxData)
	if err != nil {
		return 0, err
	}
	if int(be.Uint16(b[6:])) != size-HeaderSize {
		return 0, ErrLength
	}
	r.Op = Op(b[4])
	r.Status = Status(b[5])
	r.ID = be.Uint64(b[8:])
	r.Token = be.Uint64(b[16:])
	r.Lease = be.Uint32(b[24:])
	r.Detail = be.Uint32(b[28:])
	r.Data = b[HeaderSize:size:size]
	return size, nil
}

// frameBounds checks the length field of a 32-byte-header frame against the variable-part limit
// and reports the frame size once all of it is in b.
func frameBounds(b []byte, maxVar int) (int, error) {
	if len(b) < 4 {
		return 0, ErrShort
	}
	l := be.Uint32(b)
	if l < HeaderSize-4 {
		return 0, ErrLength
	}
	if maxVar > MaxKeyLen {
		maxVar = MaxKeyLen
	}
	if uint64(l) > uint64(HeaderSize-4+maxVar) {
		return 0, ErrTooLarge
	}
	size := 4 + int(l)
	if len(b) < size {
		return 0, ErrShort
	}
	return size, nil
}
