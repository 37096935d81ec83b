package ticketing

import (
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ticketing/ticketing/wire"
)

// Sentinel errors. Every error this package returns matches one of them with errors.Is: an
// answer from the server is a *StatusError, a lost lock a *LockLostError, and the rest carry the
// operation, the key, the token or the endpoint in their one-line message.
var (
	// ErrNotAcquired: the wait timeout passed, or an Acquire with WithWaitTimeout(0) found the key
	// taken (status TIMED_OUT). Nothing is held. (TryAcquire reports this as a nil *Lock instead.)
	ErrNotAcquired = errors.New("ticketing: not acquired")

	// ErrNotHeld: the token does not hold the key (expired, released, never issued); nothing
	// changed on the server (status NOT_HELD). Never retry it.
	ErrNotHeld = errors.New("ticketing: not held")

	// ErrInvalid: an argument was rejected, by the client before anything was sent (an empty key,
	// a lease below 1ms, a negative option) or by the server (status INVALID; StatusError.Detail
	// names the field).
	ErrInvalid = errors.New("ticketing: invalid argument")

	// ErrAlreadyHeld: WithRefuseHeld was given and this Client already holds the key.
	ErrAlreadyHeld = errors.New("ticketing: already held by this client")

	// ErrNotLeader: the node is not the cluster leader (status NOT_LEADER). The client follows the
	// hint and re-sends the request by itself; this surfaces only from a handshake.
	ErrNotLeader = errors.New("ticketing: not the leader")

	// ErrBusy: a server limit was reached (status BUSY; StatusError.Detail names it). Retry later.
	ErrBusy = errors.New("ticketing: server busy")

	// ErrShuttingDown: the server is stopping (status SHUTTING_DOWN). With several endpoints the
	// client retries on the next one by itself; with one, the call fails with this error.
	ErrShuttingDown = errors.New("ticketing: server shutting down")

	// ErrAuthFailed: the mutual authentication failed: a wrong token, a server that requires a
	// token the client lacks, a server whose proof does not verify, or a server without auth while
	// the client has a token. Not retried.
	ErrAuthFailed = errors.New("ticketing: authentication failed")

	// ErrUnsupportedVersion: the server does not speak protocol version 1. Not retried.
	ErrUnsupportedVersion = errors.New("ticketing: unsupported protocol version")

	// ErrCancelled: the call's context was done before the answer came (the error also matches
	// the context's own error), or the server withdrew an ACQUIRE (status CANCELLED).
	ErrCancelled = errors.New("ticketing: cancelled")

	// ErrLockLost: the lock is, or may be, no longer held. Returned (as a *LockLostError naming
	// the reason) by Lock.Err, Lock.Release, Lock.Extend and Client.WithLock once the lost signal
	// has fired.
	ErrLockLost = errors.New("ticketing: lock lost")

	// ErrTimeout: no answer within the request timeout (WithRequestTimeout), or a heartbeat went
	// unanswered: the server is frozen, or the network silently drops the connection.
	ErrTimeout = errors.New("ticketing: timeout")

	// ErrConnectionLost: the connection dropped and the session could not be resumed (the server
	// ended it, or the session grace passed without a reconnect): the outcome of the request is
	// unknown. An ACQUIRE that fails this way may have been granted; such a lock runs its lease.
	ErrConnectionLost = errors.New("ticketing: connection lost")

	// ErrServerRestarted: the client reconnected to a server with a different state id (a single
	// node restarted, or a cluster was restored): every request in flight fails with it and every
	// held lock is lost with reason ReasonServerRestarted. Nothing was re-queued.
	ErrServerRestarted = errors.New("ticketing: server restarted")

	// ErrUnavailable: no endpoint could be connected to (refused, unreachable, dial timeout, a
	// server that is full or stopping).
	ErrUnavailable = errors.New("ticketing: server unavailable")

	// ErrTLS: the TLS handshake failed, including TLS spoken to a plaintext server and back.
	ErrTLS = errors.New("ticketing: TLS error")

	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("ticketing: client closed")

	// ErrProtocol: the server sent bytes that break PROTOCOL.md; the connection is closed.
	ErrProtocol = errors.New("ticketing: protocol error")
)

// IsRetryable reports whether err is transient: the same call may succeed later. True for
// ErrTimeout, ErrConnectionLost, ErrServerRestarted, ErrUnavailable, ErrBusy, ErrShuttingDown and
// ErrNotLeader; false for everything else, including ErrNotAcquired (the answer was "no").
func IsRetryable(err error) bool {
	for _, e := range [...]error{ErrTimeout, ErrConnectionLost, ErrServerRestarted, ErrUnavailable, ErrBusy, ErrShuttingDown, ErrNotLeader} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Status is a protocol status code (PROTOCOL.md, "Status codes").
type Status uint8

// The status codes of protocol version 1.
const (
	StatusOK                 Status = 0
	StatusTimedOut           Status = 1
	StatusNotHeld            Status = 2
	StatusInvalid            Status = 3
	StatusNotLeader          Status = 4
	StatusBusy               Status = 5
	StatusShuttingDown       Status = 6
	StatusAuthFailed         Status = 7
	StatusUnsupportedVersion Status = 8
	StatusCancelled          Status = 9
)

// String returns the protocol's name of the status ("TIMED_OUT"), or "0x.." for an unknown one.
func (s Status) String() string { return wire.Status(s).String() }

// sentinel maps a status to its sentinel error (nil for OK and unknown statuses).
func (s Status) sentinel() error {
	switch s {
	case StatusTimedOut:
		return ErrNotAcquired
	case StatusNotHeld:
		return ErrNotHeld
	case StatusInvalid:
		return ErrInvalid
	case StatusNotLeader:
		return ErrNotLeader
	case StatusBusy:
		return ErrBusy
	case StatusShuttingDown:
		return ErrShuttingDown
	case StatusAuthFailed:
		return ErrAuthFailed
	case StatusUnsupportedVersion:
		return ErrUnsupportedVersion
	case StatusCancelled:
		return ErrCancelled
	}
	return nil
}

// StatusError is a non-OK answer from the server. errors.Is matches the sentinel of its Status
// (ErrNotHeld for NOT_HELD, ...); an unknown status matches none but still carries its number.
type StatusError struct {
	Op      string // the request's operation: "ACQUIRE", "RELEASE", "EXTEND", "CANCEL", "PING", "INSPECT", "HANDSHAKE"
	Key     string // the request's key ("" for requests without one)
	Token   uint64 // the request's token (RELEASE, EXTEND, INSPECT; 0 otherwise)
	Status  Status
	Detail  uint32 // INVALID: the field code; BUSY: the limit code (see DetailName)
	Message string // the server's message; for NOT_LEADER the leader's address
	Wait    int64  // ACQUIRE TIMED_OUT: the wait timeout in ms (-1: without limit)
}

// DetailName names Detail: the field of an INVALID answer ("KEY"), the limit of a BUSY one
// ("WAITERS_PER_KEY"), or "" for other statuses.
func (e *StatusError) DetailName() string {
	switch e.Status {
	case StatusInvalid:
		return wire.FieldName(e.Detail)
	case StatusBusy:
		return wire.LimitName(e.Detail)
	}
	return ""
}

func (e *StatusError) Error() string {
	var b strings.Builder
	b.WriteString("ticketing: ")
	writeSubject(&b, strings.ToLower(e.Op), e.Key, e.Op != "" && e.Op != "HANDSHAKE" && e.Key != "", e.Token)
	b.WriteString(": ")
	switch e.Status {
	case StatusTimedOut:
		switch {
		case e.Message != "": // the server says why (its start-up wait)
			b.WriteString("not acquired (TIMED_OUT)")
		case e.Wait == 0:
			b.WriteString("not acquired: the key is taken (TIMED_OUT)")
		default:
			b.WriteString("not acquired within " + msDuration(e.Wait) + " (TIMED_OUT)")
		}
	case StatusNotHeld:
		b.WriteString("not held: the token does not hold the key (NOT_HELD)")
	default:
		b.WriteString(e.Status.String())
		if d := e.DetailName(); d != "" {
			b.WriteString(" (" + d + ")")
		}
	}
	if e.Message != "" {
		if e.Status == StatusNotLeader {
			b.WriteString(": leader " + strconv.Quote(e.Message))
		} else {
			b.WriteString(": " + oneLine(e.Message))
		}
	}
	return b.String()
}

// Is reports whether target is the sentinel of e's status.
func (e *StatusError) Is(target error) bool {
	s := e.Status.sentinel()
	return s != nil && s == target
}

// LostReason says why a lock was lost. The same names are used by every Ticketing client.
type LostReason string

// The lost reasons (docs/clients.md, rule 3).
const (
	// ReasonExpired: the local deadline passed without a successful extend, or the server reported
	// that the lease ran out (EXPIRED reason LEASE).
	ReasonExpired LostReason = "expired"
	// ReasonNotHeld: the server answered NOT_HELD to an Extend or Release of the lock (someone
	// released it by its token, or its lease had ended).
	ReasonNotHeld LostReason = "not held"
	// ReasonServerRestarted: the client reconnected to a server with a different state id: the
	// server that granted the lock is gone with its locks.
	ReasonServerRestarted LostReason = "server restarted"
	// ReasonServerStopping: the server is stopping (EXPIRED reason STOPPING); the lock will not
	// survive the stop.
	ReasonServerStopping LostReason = "server stopping"
)

// LockLostError is the error of a lost lock: Lock.Err once the lost signal has fired, and what
// Lock.Release, Lock.Extend and Client.WithLock return for it. It matches ErrLockLost, and also
// the error that caused it (ErrNotHeld for a NOT_HELD answer).
type LockLostError struct {
	Key    string
	Token  uint64
	Reason LostReason
	Detail string // what happened, for humans
	Err    error  // the cause, when there is one (a NOT_HELD *StatusError); may be nil
}

func (e *LockLostError) Error() string {
	var b strings.Builder
	b.WriteString("ticketing: ")
	writeSubject(&b, "lock", e.Key, true, e.Token)
	b.WriteString(" lost: " + string(e.Reason))
	if e.Detail != "" {
		b.WriteString(" (" + e.Detail + ")")
	}
	return b.String()
}

// Is reports whether target is ErrLockLost.
func (e *LockLostError) Is(target error) bool { return target == ErrLockLost }

// Unwrap returns the cause.
func (e *LockLostError) Unwrap() error { return e.Err }

// opError is every other error of the package: kind is the sentinel it matches, cause (if any)
// is matched too. Its message is one line: "ticketing: OP KEY token N: MESSAGE".
type opError struct {
	kind   error
	op     string // "acquire", "ping", "connect"...
	key    string
	hasK   bool
	token  uint64
	msg    string
	cause  error   // shown after msg
	causes []error // matched too, not shown (msg already says them)
}

func (e *opError) Error() string {
	var b strings.Builder
	b.WriteString("ticketing: ")
	if e.op != "" {
		writeSubject(&b, e.op, e.key, e.hasK, e.token)
		b.WriteString(": ")
	}
	b.WriteString(e.msg)
	if e.cause != nil {
		b.WriteString(": " + causeText(e.cause))
	}
	return b.String()
}

func (e *opError) Unwrap() []error {
	errs := append([]error{e.kind}, e.causes...)
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

// writeSubject writes `op "key" token N`.
func writeSubject(b *strings.Builder, op, key string, hasKey bool, token uint64) {
	b.WriteString(op)
	if hasKey {
		b.WriteString(" " + FormatKey(key))
	}
	if token != 0 {
		b.WriteString(" token " + strconv.FormatUint(token, 10))
	}
}

// causeText is err's message without a leading package prefix (so that a wrapped error of this
// package does not repeat "ticketing: "), on one line.
func causeText(err error) string {
	return oneLine(strings.TrimPrefix(err.Error(), "ticketing: "))
}

// oneLine replaces line breaks, so that every message is one line.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }), "; ")
}

// maxKeyInMessage bounds how much of a key a message shows.
const maxKeyInMessage = 64

// FormatKey renders a key for messages: quoted text when it is valid UTF-8, else 0x-prefixed
// hex; keys longer than 64 bytes are cut, with their length.
func FormatKey(key string) string {
	cut := key
	if len(cut) > maxKeyInMessage {
		cut = cut[:maxKeyInMessage]
		for !utf8.ValidString(cut) && len(cut) > maxKeyInMessage-3 {
			cut = cut[:len(cut)-1] // do not split a character
		}
	}
	var s string
	if utf8.ValidString(key) {
		s = strconv.Quote(cut)
	} else {
		s = "0x" + hex.EncodeToString([]byte(cut))
	}
	if len(cut) < len(key) {
		s += "…(" + strconv.Itoa(len(key)) + " bytes)"
	}
	return s
}

// msDuration renders a count of milliseconds as a Go duration ("1.5s").
func msDuration(ms int64) string {
	return (durationMs(ms)).String()
}

func errf(kind error, op string, msg string) *opError { return &opError{kind: kind, op: op, msg: msg} }
