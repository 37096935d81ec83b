package ticketing

import (
	"errors"
	"strconv"

	"github.com/ticketing/ticketing/internal/wire"
)

// Sentinel errors. Errors returned by this package match them with errors.Is; an answer from the
// server is a *StatusError that matches the sentinel of its status.
var (
	// ErrNotAcquired: the lock was not granted within the wait timeout (TryAcquire: it was taken).
	// Nothing is held. Status TIMED_OUT.
	ErrNotAcquired = errors.New("ticketing: lock not acquired")

	// ErrNotHeld: the token is not the key's current holder (expired, released, never issued);
	// nothing changed on the server. Status NOT_HELD. Never retry it.
	ErrNotHeld = errors.New("ticketing: lock not held")

	// ErrInvalid: the server (or the client, before sending) rejected an argument: an empty or
	// too long key, a lease out of range. Status INVALID; StatusError.Detail names the field.
	ErrInvalid = errors.New("ticketing: invalid request")

	// ErrNotLeader: the node is not the cluster leader. The client follows the hint and retries
	// by itself; this surfaces only when its retries are exhausted. Status NOT_LEADER.
	ErrNotLeader = errors.New("ticketing: not the leader")

	// ErrBusy: a server limit was reached (StatusError.Detail names it); retry later. Status BUSY.
	ErrBusy = errors.New("ticketing: server busy")

	// ErrShuttingDown: the server is stopping. The client moves to the next endpoint and retries
	// by itself; this surfaces only when its retries are exhausted. Status SHUTTING_DOWN.
	ErrShuttingDown = errors.New("ticketing: server shutting down")

	// ErrAuthFailed: the handshake's mutual authentication failed: a wrong token, a token the
	// server requires but the client lacks, a server that does not prove it holds the token, or
	// a server without auth while the client has a token. Status AUTH_FAILED. Not retried.
	ErrAuthFailed = errors.New("ticketing: authentication failed")

	// ErrUnsupportedVersion: the server does not speak protocol version 1. Not retried.
	ErrUnsupportedVersion = errors.New("ticketing: unsupported protocol version")

	// ErrCancelled: the server withdrew an acquire after a CANCEL. Acquire reports ctx.Err()
	// instead when its own context caused the cancel, so this is rare.
	ErrCancelled = errors.New("ticketing: acquire cancelled")

	// ErrLockLost: the lock is, or may be, no longer held: the server reported its lease expired,
	// its local deadline passed without a successful extend, or an extend answered NOT_HELD.
	// Returned by Lock.Release and Lock.Extend after the lost signal fired.
	ErrLockLost = errors.New("ticketing: lock lost")

	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("ticketing: client closed")

	// ErrConnectionLost: the connection failed while the request was in flight; its outcome is
	// unknown. Retryable: the next call reconnects. (An Acquire that fails this way may have been
	// granted just before the connection dropped; such a lock stays held until its lease ends.)
	ErrConnectionLost = errors.New("ticketing: connection lost")

	// ErrUnavailable: no endpoint could be reached (dial, TLS or handshake failure, BUSY at
	// connect). Retryable.
	ErrUnavailable = errors.New("ticketing: no server available")

	// ErrProtocol: the server sent bytes that break PROTOCOL.md; the connection is closed.
	ErrProtocol = errors.New("ticketing: protocol error")
)

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

// StatusError is a non-OK answer from the server. errors.Is(err, ErrNotHeld) and the like match
// the sentinel of its Status; an unknown status matches none but still carries its number.
type StatusError struct {
	Op      string // the request's operation: "ACQUIRE", "RELEASE", "EXTEND", "CANCEL", "PING", "HANDSHAKE"
	Status  Status
	Detail  uint32 // INVALID: the field code; BUSY: the limit code (see DetailName)
	Message string // the server's message; for NOT_LEADER the leader's address
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
	s := "ticketing: " + e.Op + ": " + e.Status.String()
	if d := e.DetailName(); d != "" {
		s += " (" + d + ")"
	}
	if e.Message != "" {
		if e.Status == StatusNotLeader {
			s += ": leader " + strconv.Quote(e.Message)
		} else {
			s += ": " + e.Message
		}
	}
	return s
}

// Is reports whether target is the sentinel of e's status.
func (e *StatusError) Is(target error) bool {
	s := e.Status.sentinel()
	return s != nil && s == target
}

// IsRetryable reports whether err is transient: the same call may succeed later (after a
// reconnect or a backoff). True for ErrConnectionLost, ErrUnavailable, ErrBusy, ErrShuttingDown
// and ErrNotLeader; false for everything else, including ErrNotAcquired (the answer was "no").
func IsRetryable(err error) bool {
	for _, e := range []error{ErrConnectionLost, ErrUnavailable, ErrBusy, ErrShuttingDown, ErrNotLeader} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func opName(op wire.Op) string { return op.String() }
