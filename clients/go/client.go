package ticketing

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
)

// Client is a connection to a Ticketing server (or cluster), safe for concurrent use by any
// number of goroutines. All calls share one connection: requests are pipelined and answers are
// matched by request id, so a waiting Acquire never holds back other calls. If the connection
// drops, the calls in flight fail with an error matching ErrConnectionLost and the next call
// reconnects, trying the endpoints in order with backoff. Locks held survive a reconnect: the
// server keeps them until their lease ends, and keep-alive continues on the new connection.
//
// Lock ordering: Lock.mu before Client.lmu. Client.mu and conn.mu are never held while taking
// another of these mutexes, and no mutex is held during network I/O.
type Client struct {
	opts    options
	session [wire.SessionIDSize]byte
	nextID  atomic.Uint64 // request ids: a per-client counter starting at 1

	mu        sync.Mutex
	conn      *conn         // current connection; nil when none
	dialing   chan struct{} // non-nil while one goroutine dials; closed when it is done
	closed    bool
	next      int            // endpoint index to try first
	hint      string         // leader address from a NOT_LEADER answer, tried first
	closedCh  chan struct{}  // closed by Close; cancels dials and backoffs in progress
	keepAlive sync.WaitGroup // keep-alive goroutines
	closedCtx context.Context
	closeCtx  context.CancelFunc

	lmu   sync.Mutex
	locks map[uint64]*Lock // token -> lock held through this client (for EXPIRED notices)
}

// Dial connects to the first endpoint that completes the handshake (see WithEndpoints) and
// returns a Client. It fails with an error matching ErrAuthFailed or ErrUnsupportedVersion at
// once, and with one matching ErrUnavailable when no endpoint answers.
func Dial(ctx context.Context, opts ...Option) (*Client, error) {
	c := newClient(opts)
	cn, err := c.dialRound(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.conn = cn
	c.mu.Unlock()
	return c, nil
}

func newClient(opts []Option) *Client {
	c := &Client{opts: defaultOptions(), locks: make(map[uint64]*Lock), closedCh: make(chan struct{})}
	c.closedCtx, c.closeCtx = context.WithCancel(context.Background())
	for _, o := range opts {
		o(&c.opts)
	}
	rand.Read(c.session[:])
	return c
}

// Close closes the connection. Calls in flight fail with ErrClosed, keep-alive stops, and every
// later call returns ErrClosed. Locks still held are not released: the server keeps them until
// their lease ends (release them first). Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closedCh)
	c.closeCtx()
	cn := c.conn
	c.conn = nil
	dialing := c.dialing
	c.mu.Unlock()
	if dialing != nil {
		<-dialing
		c.mu.Lock()
		cn2 := c.conn
		c.conn = nil
		c.mu.Unlock()
		if cn2 != nil && cn2 != cn {
			cn2.fail(ErrClosed)
			cn2.wg.Wait()
		}
	}
	if cn != nil {
		cn.fail(ErrClosed)
		cn.wg.Wait()
	}
	c.keepAlive.Wait()
	return nil
}

// SessionID returns the client's 16-byte session id (random per Client, kept across reconnects).
func (c *Client) SessionID() [16]byte { return c.session }

// Ping sends PING and waits for its answer.
func (c *Client) Ping(ctx context.Context) error {
	_, _, err := c.roundTrip(ctx, &wire.Request{Op: wire.OpPing}, true)
	return err
}

// Release releases the lock on key held with token, from any client: the token is the owner.
// It returns nil when the token held the key (the next waiter is granted at once), or an error
// matching ErrNotHeld when it did not (expired, already released, wrong token): nothing changed.
// Prefer Lock.Release when you have the *Lock.
func (c *Client) Release(ctx context.Context, key string, token uint64) error {
	if err := checkKey(key); err != nil {
		return err
	}
	_, _, err := c.roundTrip(ctx, &wire.Request{Op: wire.OpRelease, Token: token, Key: []byte(key)}, false)
	return err
}

// Extend sets the lease of the lock on key held with token to lease from now, from any client.
// It returns the local deadline (no later than the server's) or an error matching ErrNotHeld.
// Prefer Lock.Extend when you have the *Lock (it also moves the Lock's deadline).
func (c *Client) Extend(ctx context.Context, key string, token uint64, lease time.Duration) (time.Time, error) {
	if err := checkKey(key); err != nil {
		return time.Time{}, err
	}
	ms, err := leaseMs(lease)
	if err != nil {
		return time.Time{}, err
	}
	res, tSend, err := c.roundTrip(ctx, &wire.Request{Op: wire.OpExtend, Token: token, Lease: ms, Key: []byte(key)}, true)
	if err != nil {
		return time.Time{}, err
	}
	return tSend.Add(time.Duration(res.lease) * time.Millisecond), nil
}

func checkKey(key string) error {
	if len(key) == 0 || len(key) > wire.MaxKeyLen {
		return &StatusError{Op: "CLIENT", Status: StatusInvalid, Detail: wire.FieldKey, Message: fmt.Sprintf("key length %d outside 1..%d", len(key), wire.MaxKeyLen)}
	}
	return nil
}

func leaseMs(d time.Duration) (uint32, error) {
	ms := (d + time.Millisecond - 1) / time.Millisecond // round up: never ask for less than d
	if d <= 0 || ms >= time.Duration(wire.WaitForever) {
		return 0, &StatusError{Op: "CLIENT", Status: StatusInvalid, Detail: wire.FieldLease, Message: fmt.Sprintf("lease %v outside 1ms..%v", d, time.Duration(wire.WaitForever-1)*time.Millisecond)}
	}
	return uint32(ms), nil
}

// roundTrip sends req (with a fresh request id) and waits for its answer. NOT_LEADER and
// SHUTTING_DOWN answers move the client to the hinted leader or the next endpoint and the request
// is sent again with the same id; with retryLost (idempotent requests) so is a request whose
// connection failed. A non-OK status is returned as a *StatusError.
func (c *Client) roundTrip(ctx context.Context, req *wire.Request, retryLost bool) (result, time.Time, error) {
	req.ID = c.nextID.Add(1)
	for attempt := 0; ; attempt++ {
		cn, err := c.getConn(ctx)
		if err != nil {
			return result{}, time.Time{}, err
		}
		cl := getCall()
		if err := cn.send(req, cl); err != nil {
			// The connection had failed before anything was queued: safe to send elsewhere.
			putCall(cl)
			if attempt < c.opts.maxRetries && errors.Is(err, ErrConnectionLost) {
				continue
			}
			return result{}, time.Time{}, err
		}
		var res result
		select {
		case res = <-cl.ch:
		case <-ctx.Done():
			cn.forget(req.ID)
			return result{}, time.Time{}, ctx.Err()
		}
		tSend := cl.tSend
		putCall(cl)
		if res.err != nil {
			if retryLost && attempt < c.opts.maxRetries && errors.Is(res.err, ErrConnectionLost) {
				continue
			}
			return res, tSend, res.err
		}
		if res.status == wire.StatusOK {
			return res, tSend, nil
		}
		serr := statusError(req.Op, &res)
		if c.redirect(cn, &res) && attempt < c.opts.maxRetries {
			if err := c.sleepBackoff(ctx, attempt); err != nil {
				return res, tSend, serr
			}
			continue
		}
		return res, tSend, serr
	}
}

func statusError(op wire.Op, r *result) *StatusError {
	return &StatusError{Op: opName(op), Status: Status(r.status), Detail: r.detail, Message: string(r.data)}
}

// redirect handles NOT_LEADER and SHUTTING_DOWN: cn is retired and the next connection goes to
// the hinted leader or the next endpoint. It reports whether the request should be retried.
func (c *Client) redirect(cn *conn, r *result) bool {
	if r.status != wire.StatusNotLeader && r.status != wire.StatusShuttingDown {
		return false
	}
	c.mu.Lock()
	if c.conn == cn {
		c.conn = nil
	}
	if r.status == wire.StatusNotLeader && len(r.data) > 0 {
		c.hint = string(r.data)
	}
	if cn.idx >= 0 {
		c.next = (cn.idx + 1) % len(c.opts.endpoints)
	}
	c.mu.Unlock()
	c.opts.logger.Info("ticketing: moving to another endpoint", "from", cn.addr, "status", r.status.String(), "leader", string(r.data))
	cn.detach()
	return true
}

// connFailed is called once when cn fails: the client forgets it (the next call reconnects,
// starting with the same endpoint, which may be back).
func (c *Client) connFailed(cn *conn, err error) {
	c.mu.Lock()
	if c.conn == cn {
		c.conn = nil
		if cn.idx >= 0 {
			c.next = cn.idx
		}
	}
	closed := c.closed
	c.mu.Unlock()
	if !closed {
		c.opts.logger.Warn("ticketing: connection lost", "addr", cn.addr, "err", err)
	}
}

// dropConn closes cn if it is still the current connection (a request on it stalled).
func (c *Client) dropConn(cn *conn, why string) {
	if cn == nil {
		return
	}
	cn.fail(fmt.Errorf("%w (%s): %s", ErrConnectionLost, cn.addr, why))
}

// getConn returns the current connection, connecting first when there is none. Only one
// goroutine dials at a time; the others wait for it. Failed rounds are retried with backoff up
// to MaxRetries times, within ctx.
func (c *Client) getConn(ctx context.Context) (*conn, error) {
	var lastErr error
	for round := 0; ; round++ {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if cn := c.conn; cn != nil {
			c.mu.Unlock()
			if cn.usable() {
				return cn, nil
			}
			c.mu.Lock()
			if c.conn == cn {
				c.conn = nil
			}
			c.mu.Unlock()
			continue
		}
		if ch := c.dialing; ch != nil {
			c.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		ch := make(chan struct{})
		c.dialing = ch
		c.mu.Unlock()

		if round > 0 {
			if err := c.sleepBackoff(ctx, round-1); err != nil {
				c.finishDial(ch, nil)
				return nil, errors.Join(lastErr, err)
			}
		}
		dctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(c.closedCtx, cancel) // Close cancels the dial
		cn, err := c.dialRound(dctx)
		stop()
		cancel()
		c.finishDial(ch, cn)
		if err == nil {
			continue // picks up cn (or a closed client) at the top
		}
		lastErr = err
		var he *handshakeError
		if errors.As(err, &he) || ctx.Err() != nil || round >= c.opts.maxRetries {
			return nil, err
		}
	}
}

func (c *Client) finishDial(ch chan struct{}, cn *conn) {
	c.mu.Lock()
	c.dialing = nil
	closed := c.closed
	if cn != nil && !closed {
		c.conn = cn
	}
	c.mu.Unlock()
	close(ch)
	if cn != nil && closed {
		cn.fail(ErrClosed)
	}
}

// dialRound tries the leader hint (if any), then every endpoint once, starting at c.next.
func (c *Client) dialRound(ctx context.Context) (*conn, error) {
	c.mu.Lock()
	hint, start := c.hint, c.next
	c.hint = ""
	c.mu.Unlock()
	eps := c.opts.endpoints
	type target struct {
		addr string
		idx  int
	}
	targets := make([]target, 0, len(eps)+1)
	if hint != "" {
		idx := -1
		for i, e := range eps {
			if e == hint {
				idx = i
			}
		}
		targets = append(targets, target{hint, idx})
	}
	for i := range eps {
		j := (start + i) % len(eps)
		if eps[j] != hint {
			targets = append(targets, target{eps[j], j})
		}
	}
	var errs []error
	for _, t := range targets {
		nc, err := c.dialEndpoint(ctx, t.addr)
		if err == nil {
			c.opts.logger.Debug("ticketing: connected", "addr", t.addr)
			c.mu.Lock()
			c.next = max(t.idx, 0)
			c.mu.Unlock()
			return newConn(c, nc, t.addr, t.idx), nil
		}
		c.opts.logger.Debug("ticketing: connect failed", "addr", t.addr, "err", err)
		var he *handshakeError
		if errors.As(err, &he) {
			return nil, fmt.Errorf("ticketing: %s: %w", t.addr, he.err)
		}
		errs = append(errs, fmt.Errorf("%s: %w", t.addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, errors.Join(errs...))
}

// sleepBackoff waits min*2^attempt (capped at max), with up to 50% jitter, or until ctx is done.
func (c *Client) sleepBackoff(ctx context.Context, attempt int) error {
	d := c.opts.minBackoff
	for i := 0; i < attempt && d < c.opts.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, c.opts.maxBackoff)
	d = d/2 + mrand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.closedCh:
		return ErrClosed
	}
}

// expired handles an EXPIRED notice: the lock with token is lost at once.
func (c *Client) expired(token uint64, key []byte) {
	c.lmu.Lock()
	lk := c.locks[token]
	c.lmu.Unlock()
	if lk == nil {
		c.opts.logger.Debug("ticketing: EXPIRED notice for no held lock", "token", token, "key", string(key))
		return
	}
	lk.markLost(fmt.Errorf("%w: the server reports its lease expired", ErrLockLost))
}

func (c *Client) register(lk *Lock) {
	c.lmu.Lock()
	c.locks[lk.token] = lk
	c.lmu.Unlock()
}

func (c *Client) unregister(lk *Lock) {
	c.lmu.Lock()
	if c.locks[lk.token] == lk {
		delete(c.locks, lk.token)
	}
	c.lmu.Unlock()
}

// currentConn returns the connection in use, or nil (for tests).
func (c *Client) currentConn() *conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}
