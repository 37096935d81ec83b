package ticketing

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// Defaults of the Client options (docs/clients.md, "Defaults").
const (
	// DefaultEndpoint is the server address used without WithEndpoints.
	DefaultEndpoint = "127.0.0.1:7070"
	// DefaultDialTimeout bounds connecting to one endpoint: TCP, TLS and the handshake.
	DefaultDialTimeout = 5 * time.Second
	// DefaultRequestTimeout bounds the wait for every answer, except the time an ACQUIRE spends
	// queued (see WithRequestTimeout).
	DefaultRequestTimeout = 10 * time.Second
	// DefaultHeartbeat is how long the connection may stay silent before the client sends a PING.
	DefaultHeartbeat = 2 * time.Second
	// DefaultMinBackoff and DefaultMaxBackoff bound the pause between reconnect rounds.
	DefaultMinBackoff = 50 * time.Millisecond
	DefaultMaxBackoff = 2 * time.Second
	// DefaultCleanupTimeout bounds how long a cancelled Acquire waits for its clean-up.
	DefaultCleanupTimeout = 5 * time.Second
)

// Protocol limits that the client checks before sending.
const (
	// MinLease is the shortest lease a request may ask for.
	MinLease = time.Millisecond
	// MaxLease is the longest lease the protocol can carry (2^32-1 ms, about 49.7 days); servers
	// set a lower limit (1h by default) and answer a longer one with ErrInvalid.
	MaxLease = time.Duration(wire.WaitForever-1) * time.Millisecond
	// MaxKeyLen is the longest key the protocol can carry; servers set a lower limit (256 bytes by
	// default) and answer a longer one with ErrInvalid.
	MaxKeyLen = wire.MaxKeyLen
)

// Option configures a Client (see Dial). An invalid value makes Dial fail with ErrInvalid.
type Option func(*options)

type options struct {
	endpoints      []string
	token          []byte
	hasToken       bool
	tls            *tls.Config
	dialTimeout    time.Duration
	requestTimeout time.Duration
	heartbeat      time.Duration
	logger         *slog.Logger
	minBackoff     time.Duration
	maxBackoff     time.Duration
	cleanupTimeout time.Duration
	releaseOnClose bool
	idleRead       time.Duration // idleRead (conn.go); tests change it
	err            error         // the first invalid option
}

func defaultOptions() options {
	return options{
		endpoints:      []string{DefaultEndpoint},
		dialTimeout:    DefaultDialTimeout,
		requestTimeout: DefaultRequestTimeout,
		heartbeat:      DefaultHeartbeat,
		logger:         slog.New(slog.DiscardHandler),
		minBackoff:     DefaultMinBackoff,
		maxBackoff:     DefaultMaxBackoff,
		cleanupTimeout: DefaultCleanupTimeout,
		idleRead:       idleRead,
	}
}

func (o *options) invalid(format string, args ...any) {
	if o.err == nil {
		o.err = errf(ErrInvalid, "dial", fmt.Sprintf(format, args...))
	}
}

// WithEndpoints sets the servers' addresses ("host:port"), tried in order when connecting and
// reconnecting; a leader hint (NOT_LEADER, GOAWAY) is tried first when there is one. An empty
// list or an address without a port is invalid. Default: DefaultEndpoint (127.0.0.1:7070).
func WithEndpoints(addrs ...string) Option {
	return func(o *options) {
		if len(addrs) == 0 {
			o.invalid("WithEndpoints: the endpoint list is empty")
			return
		}
		for _, a := range addrs {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				o.invalid("WithEndpoints: %q is not host:port", a)
				return
			}
		}
		o.endpoints = append([]string(nil), addrs...)
	}
}

// WithToken sets the shared auth token (the server's TICKETING_TOKEN). With a token the client
// proves it holds the token, checks the server's proof (so it also knows the server holds it),
// and refuses a server that does not require auth. An empty token is invalid. Default: none.
func WithToken(token string) Option {
	return func(o *options) {
		if token == "" {
			o.invalid("WithToken: the token is empty (leave WithToken out for a server without auth)")
			return
		}
		o.token, o.hasToken = []byte(token), true
	}
}

// WithTLS makes every connection TLS with cfg (cloned; ServerName defaults to the endpoint's
// host; MinVersion to TLS 1.2). Set cfg.RootCAs to verify the server with your CA (nil: the
// system's), and cfg.Certificates for mutual TLS (TICKETING_TLS_CLIENT_CA on the server). A nil
// cfg means plain TCP. Default: plain TCP.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		if cfg == nil {
			o.tls = nil
			return
		}
		o.tls = cfg.Clone()
		if o.tls.MinVersion == 0 {
			o.tls.MinVersion = tls.VersionTLS12
		}
	}
}

// WithDialTimeout bounds connecting to one endpoint: TCP, TLS and the protocol handshake. It must
// be positive. Default: DefaultDialTimeout (5s).
func WithDialTimeout(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.invalid("WithDialTimeout: %v is not positive", d)
			return
		}
		o.dialTimeout = d
	}
}

// WithRequestTimeout bounds every call's wait for its answer, including the time spent waiting
// for a reconnect, so that no call hangs on a frozen server or a silent network: the call then
// fails with ErrTimeout. The time an ACQUIRE spends queued is not counted: an Acquire is bounded
// by its wait timeout plus d (and, without a wait limit, only by its context and the heartbeat).
// It must be positive. Default: DefaultRequestTimeout (10s).
func WithRequestTimeout(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.invalid("WithRequestTimeout: %v is not positive", d)
			return
		}
		o.requestTimeout = d
	}
}

// WithHeartbeat sets how long the connection may stay silent before the client sends a PING; a
// PING unanswered within the request timeout fails the connection and every call in flight with
// ErrTimeout (a waiting Acquire then counts as cancelled: its request is withdrawn on the next
// connection). 0 disables the heartbeat; negative is invalid. Default: DefaultHeartbeat (2s).
func WithHeartbeat(d time.Duration) Option {
	return func(o *options) {
		if d < 0 {
			o.invalid("WithHeartbeat: %v is negative (0 disables the heartbeat)", d)
			return
		}
		o.heartbeat = d
	}
}

// WithLogger sets the logger for connection events (connects, reconnects, redirects, restarts,
// stray frames). nil means discard. Default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		o.logger = l
	}
}

// WithBackoff sets the pause between reconnect rounds (each round tries every endpoint once):
// min, doubling up to max, with jitter; a round in which a node answered "not the leader" (an
// election) is followed by the min pause. It needs 0 < min <= max. Default: DefaultMinBackoff
// (50ms) to DefaultMaxBackoff (2s).
func WithBackoff(min, max time.Duration) Option {
	return func(o *options) {
		if min <= 0 || max < min {
			o.invalid("WithBackoff: need 0 < min <= max, got %v, %v", min, max)
			return
		}
		o.minBackoff, o.maxBackoff = min, max
	}
}

// WithCleanupTimeout bounds how long a cancelled Acquire waits for its clean-up (the answer to
// its CANCEL, and the release of a lock granted meanwhile) before returning; the clean-up then
// finishes in the background. It must be positive. Default: DefaultCleanupTimeout (5s).
func WithCleanupTimeout(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.invalid("WithCleanupTimeout: %v is not positive", d)
			return
		}
		o.cleanupTimeout = d
	}
}

// WithReleaseOnClose makes Close release every lock the Client still holds (each bounded by the
// request timeout) before it closes the connection. Default: off: Close leaves held locks to
// their lease, like a crash would.
func WithReleaseOnClose() Option {
	return func(o *options) { o.releaseOnClose = true }
}

// AcquireOption configures one Acquire (or TryAcquire, WithLock). An invalid value makes the call
// fail with ErrInvalid before anything is sent.
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	wait       time.Duration // <0: without limit
	keepAlive  bool
	kaInterval time.Duration // 0: lease/3
	maxHold    time.Duration // 0: none
	refuseHeld bool
	err        string
}

func (o *acquireOptions) invalid(format string, args ...any) {
	if o.err == "" {
		o.err = fmt.Sprintf(format, args...)
	}
}

// WithWaitTimeout makes the server give up queueing after d: Acquire then fails with
// ErrNotAcquired. 0 tries once. Negative values, and values of 2^32-1 ms or more, are invalid.
// Default: wait without limit (until granted, or until the context is done).
func WithWaitTimeout(d time.Duration) AcquireOption {
	return func(o *acquireOptions) {
		if d < 0 || d/time.Millisecond >= time.Duration(wire.WaitForever) {
			o.invalid("WithWaitTimeout: %v is outside 0..%v (leave it out to wait without limit)", d, MaxLease)
			return
		}
		o.wait = d
	}
}

// WithKeepAlive extends the lock in the background with the lease it was acquired with (or last
// extended with), every interval (default, or 0: a third of the lease), until Release, until the
// lock is lost, or until WithMaxHold's cap. A failed extend is retried sooner until the local
// deadline; if none succeeds the lock is lost at that deadline. A negative interval, one not
// below the lease, or more than one value are invalid. Default: off.
func WithKeepAlive(interval ...time.Duration) AcquireOption {
	return func(o *acquireOptions) {
		switch {
		case len(interval) > 1:
			o.invalid("WithKeepAlive: at most one interval, got %d", len(interval))
		case len(interval) == 1 && interval[0] < 0:
			o.invalid("WithKeepAlive: interval %v is negative", interval[0])
		default:
			o.keepAlive = true
			if len(interval) == 1 {
				o.kaInterval = interval[0]
			}
		}
	}
}

// WithMaxHold caps keep-alive: it stops d after the grant, and the lock then runs out its lease
// (and is lost at its deadline unless released). It needs WithKeepAlive and a positive d.
// Default: no cap.
func WithMaxHold(d time.Duration) AcquireOption {
	return func(o *acquireOptions) {
		if d <= 0 {
			o.invalid("WithMaxHold: %v is not positive", d)
			return
		}
		o.maxHold = d
	}
}

// WithRefuseHeld makes Acquire fail at once with ErrAlreadyHeld when this Client already holds
// the key, instead of queueing behind its own lock (which, in one goroutine, waits until that
// lock's lease ends). Default: off: the owner is the token, so two goroutines sharing a Client
// exclude each other like any two clients.
func WithRefuseHeld() AcquireOption {
	return func(o *acquireOptions) { o.refuseHeld = true }
}

// checkKey validates a key before anything is sent.
func checkKey(op, key string) error {
	switch {
	case key == "":
		return &opError{kind: ErrInvalid, op: op, msg: "the key is empty"}
	case len(key) > wire.MaxKeyLen:
		return &opError{kind: ErrInvalid, op: op, msg: "the key is " + strconv.Itoa(len(key)) + " bytes, above the protocol's " + strconv.Itoa(wire.MaxKeyLen)}
	}
	return nil
}

// leaseMs validates a lease and converts it to whole milliseconds, rounding up (a lease is never
// shorter than asked).
func leaseMs(op, key string, d time.Duration) (uint32, error) {
	switch {
	case d < MinLease:
		msg := fmt.Sprintf("lease %v is below the minimum of 1ms", d)
		if d > 0 {
			msg += fmt.Sprintf(" (the lease is a time.Duration: did you mean %d*time.Millisecond or %d*time.Second?)", int64(d), int64(d))
		}
		return 0, &opError{kind: ErrInvalid, op: op, key: key, hasK: key != "", msg: msg}
	case d > MaxLease:
		return 0, &opError{kind: ErrInvalid, op: op, key: key, hasK: key != "", msg: fmt.Sprintf("lease %v is above the protocol's maximum of %v", d, MaxLease)}
	}
	return uint32((d + time.Millisecond - 1) / time.Millisecond), nil
}

func durationMs(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
