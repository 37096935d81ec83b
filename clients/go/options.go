package ticketing

import (
	"crypto/tls"
	"log/slog"
	"time"
)

// Defaults of the Client options.
const (
	DefaultEndpoint     = "127.0.0.1:7070"
	DefaultDialTimeout  = 5 * time.Second
	DefaultWriteTimeout = 10 * time.Second
	DefaultMaxRetries   = 5
	DefaultMinBackoff   = 50 * time.Millisecond
	DefaultMaxBackoff   = 2 * time.Second
	// DefaultCleanupTimeout bounds how long a cancelled Acquire waits for the server to confirm
	// that its request was withdrawn (or for the release of a lock granted meanwhile) before it
	// returns; the clean-up then finishes in the background.
	DefaultCleanupTimeout = 5 * time.Second
)

// Option configures a Client (see Dial).
type Option func(*options)

type options struct {
	endpoints      []string
	token          []byte
	hasToken       bool
	tls            *tls.Config
	dialTimeout    time.Duration
	writeTimeout   time.Duration
	logger         *slog.Logger
	maxRetries     int
	minBackoff     time.Duration
	maxBackoff     time.Duration
	cleanupTimeout time.Duration
}

func defaultOptions() options {
	return options{
		endpoints:      []string{DefaultEndpoint},
		dialTimeout:    DefaultDialTimeout,
		writeTimeout:   DefaultWriteTimeout,
		logger:         slog.New(slog.DiscardHandler),
		maxRetries:     DefaultMaxRetries,
		minBackoff:     DefaultMinBackoff,
		maxBackoff:     DefaultMaxBackoff,
		cleanupTimeout: DefaultCleanupTimeout,
	}
}

// WithEndpoints sets the servers' addresses ("host:port"), tried in order when connecting and
// reconnecting; a cluster's NOT_LEADER hint is tried first when there is one.
// Default: DefaultEndpoint (127.0.0.1:7070).
func WithEndpoints(addrs ...string) Option {
	return func(o *options) {
		if len(addrs) > 0 {
			o.endpoints = append([]string(nil), addrs...)
		}
	}
}

// WithToken sets the shared auth token (the server's TICKETING_TOKEN). With a token the client
// proves it holds the token, checks the server's proof, and refuses a server that does not
// require auth. Default: none (the client refuses nothing, but a server with a token answers
// ErrAuthFailed).
func WithToken(token string) Option {
	return func(o *options) { o.token, o.hasToken = []byte(token), true }
}

// WithTLS makes every connection TLS with cfg (cloned; ServerName defaults to the endpoint's
// host). Default: plain TCP.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) {
		if cfg == nil {
			o.tls = nil
			return
		}
		o.tls = cfg.Clone()
	}
}

// WithDialTimeout bounds connecting to one endpoint: TCP, TLS and the protocol handshake.
// Default: DefaultDialTimeout (5s).
func WithDialTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.dialTimeout = d
		}
	}
}

// WithWriteTimeout bounds one write to the connection; a write blocked longer fails the
// connection (its in-flight calls get ErrConnectionLost). Default: DefaultWriteTimeout (10s).
func WithWriteTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.writeTimeout = d
		}
	}
}

// WithLogger sets the logger for connection events (connects, reconnects, redirects, stray
// frames). Default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithMaxRetries bounds the reconnect rounds (each tries every endpoint once) and the
// NOT_LEADER/SHUTTING_DOWN redirects of one call; the context bounds them too.
// Default: DefaultMaxRetries (5).
func WithMaxRetries(n int) Option {
	return func(o *options) {
		if n >= 0 {
			o.maxRetries = n
		}
	}
}

// WithBackoff sets the pause between reconnect rounds: min, doubling up to max, with jitter.
// Default: DefaultMinBackoff (50ms) to DefaultMaxBackoff (2s).
func WithBackoff(min, max time.Duration) Option {
	return func(o *options) {
		if min > 0 && max >= min {
			o.minBackoff, o.maxBackoff = min, max
		}
	}
}

// WithCleanupTimeout bounds how long a cancelled Acquire waits for its clean-up (the server's
// confirmation of the CANCEL, or the RELEASE of a lock granted meanwhile) before returning; the
// clean-up continues in the background after that. Default: DefaultCleanupTimeout (5s).
func WithCleanupTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.cleanupTimeout = d
		}
	}
}

// AcquireOption configures one Acquire.
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	wait      time.Duration // <0: forever
	keepAlive time.Duration // 0: off; >0: interval
	kaDefault bool          // keep-alive at lease/3
}

// WithWaitTimeout makes the server give up queueing after d: Acquire then returns an error
// matching ErrNotAcquired. 0 tries once (TryAcquire). Default: wait without limit (until the
// context is done).
func WithWaitTimeout(d time.Duration) AcquireOption {
	return func(o *acquireOptions) {
		if d < 0 {
			d = 0
		}
		o.wait = d
	}
}

// WithKeepAlive extends the lock in the background, every interval (default: a third of the
// lease), with the lease it was acquired with (or last extended with), until Release or until the
// lock is lost. A failed extend is retried until the local deadline; if none succeeds the lock is
// lost at that deadline. Default: off.
func WithKeepAlive(interval ...time.Duration) AcquireOption {
	return func(o *acquireOptions) {
		if len(interval) > 0 && interval[0] > 0 {
			o.keepAlive, o.kaDefault = interval[0], false
			return
		}
		o.kaDefault = true
	}
}
