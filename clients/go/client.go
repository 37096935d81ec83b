package ticketing

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// Client is a session with a Ticketing server (or cluster), safe for concurrent use by any number
// of goroutines. All calls share one connection: requests are pipelined and answers are matched
// by request id, so a waiting Acquire never holds back other calls.
//
// The session outlives its connection. If the connection drops, the client reconnects in the
// background and resumes the session: the requests in flight are sent again with their original
// ids (the server answers a retry without running it twice, and a queued Acquire keeps its place
// in the queue), and calls made meanwhile wait for the connection, bounded by their request
// timeout. If the session cannot be resumed, the calls in flight fail with ErrConnectionLost; if
// the server has restarted (a new state id), they fail with ErrServerRestarted and every held
// lock is lost (ReasonServerRestarted). Held locks otherwise survive a reconnect: the server keeps
// them until their lease ends, and keep-alive continues on the new connection.
//
// Close the Client when done. Closing does not release the locks it holds unless
// WithReleaseOnClose was given: the server keeps them until their lease ends.
//
// Lock ordering: Lock.mu before Client.mu. No mutex is held during network I/O.
type Client struct {
	opts     options
	closedCh chan struct{}   // closed by Close
	closeCtx context.Context // done when Close starts; bounds dials and background work
	cancel   context.CancelFunc
	wake     chan struct{}  // capacity 1: wakes the connection manager
	bg       sync.WaitGroup // the connection manager, keep-alives and clean-ups

	mu         sync.Mutex // guards everything below
	closed     bool
	session    [wire.SessionIDSize]byte
	stateID    [wire.StateIDSize]byte
	haveState  bool
	graceMs    uint32    // session grace announced by the last WELCOME
	nextID     uint64    // the last request id used
	pending    callTable // requests sent and not answered, by id
	waiting    []*call   // requests waiting for a connection; they get their id when sent
	live       *conn     // the connection requests go to; nil while (re)connecting
	wbuf       []byte    // frames for live, not yet taken by its writer
	delivered  int       // answers the reader handed over since the writer last took wbuf (its hint)
	hint       string    // a leader address (NOT_LEADER, GOAWAY), tried first
	next       int       // index of the endpoint to try first
	silent     string    // the node whose connection the heartbeat found silent last...
	silentTill time.Time // ...which is not dialled, nor followed as a hint, until then
	redialNow  bool      // reconnect without a backoff (restart, GOAWAY)
	connErr    error     // the last failed connect round's error; nil after a success
	drops      uint64    // connections dropped so far (names a grace timer's drop)
	graceTimer *time.Timer
	answers    int    // answers received since the last ACK was sent
	ack        *call  // the ACK in flight, if any
	ackFrom    uint64 // where sendAckLocked's walk starts: the last ACK's point
	locks      map[uint64]*Lock
	heldKeys   map[string]int // locks held by key; nil until WithRefuseHeld is first used (holds)

	epoch        time.Time           // the origin of the request timeouts (Client.mono)
	timeouts     deadlineHeap[*call] // calls whose waiters wait with a request timeout
	timeoutAlarm alarm               // runs expireCalls
	clk          *suspendClock       // the lock deadlines' clock: it counts suspend time
	lostHeap     deadlineHeap[*Lock] // held locks, by when their lost signal is due (on clk)
	lostAlarm    alarm               // runs fireLost
}

// Dial connects to the first endpoint that completes the handshake (see WithEndpoints) and
// returns a Client. An invalid option fails with ErrInvalid; a wrong token with ErrAuthFailed;
// a server speaking another protocol version with ErrUnsupportedVersion; a TLS failure with
// ErrTLS; and no endpoint reachable within one round (each bounded by the dial timeout and ctx)
// with ErrUnavailable. A round in which a node answered "not the leader" (a cluster electing a
// leader) is not a failure yet: Dial tries again, at the shortest backoff, until the request
// timeout has passed since it began or ctx ends (see WithRequestTimeout).
func Dial(ctx context.Context, opts ...Option) (*Client, error) {
	c := &Client{
		opts:     defaultOptions(),
		closedCh: make(chan struct{}),
		wake:     make(chan struct{}, 1),
		locks:    make(map[uint64]*Lock),
	}
	for _, o := range opts {
		o(&c.opts)
	}
	if c.opts.err != nil {
		return nil, c.opts.err
	}
	c.closeCtx, c.cancel = context.WithCancel(context.Background())
	c.epoch = time.Now()
	c.clk = newSuspendClock()
	c.timeoutAlarm = newAlarm(c.monoNow, c.expireCalls)
	c.lostAlarm = newAlarm(c.clk.now, c.fireLost)
	newSessionID(&c.session)
	if err := c.firstConnect(ctx); err != nil {
		c.cancel()
		return nil, err
	}
	c.bg.Add(1)
	go c.manage()
	return c, nil
}

func newSessionID(s *[wire.SessionIDSize]byte) {
	for *s == ([wire.SessionIDSize]byte{}) {
		rand.Read(s[:])
	}
}

// Close closes the connection and ends the Client: calls in flight and later calls fail with
// ErrClosed, keep-alive stops. Acquires still waiting in a queue are withdrawn from the server
// (CANCEL; a grant that races the withdrawal is released), waiting at most the cleanup timeout:
// a closed client is never granted a lock it would hold until its session ends. Locks still
// held are not released (the server keeps them until their lease ends) unless
// WithReleaseOnClose was given; then Close first releases them, each bounded by the request
// timeout. Close returns promptly even if the server is frozen, and is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	var held []*Lock
	if c.opts.releaseOnClose {
		for _, lk := range c.locks {
			held = append(held, lk)
		}
	}
	settles := c.withdrawAcquiresLocked()
	c.mu.Unlock()
	if len(settles) > 0 {
		t := time.NewTimer(c.opts.cleanupTimeout)
		for _, ch := range settles {
			select {
			case <-ch:
			case <-t.C:
			}
		}
		t.Stop()
	}
	if len(held) > 0 {
		var wg sync.WaitGroup
		for _, lk := range held {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := lk.Release(context.Background()); err != nil {
					c.opts.logger.Warn("ticketing: release on close failed; the lock runs out its lease", "key", FormatKey(lk.key), "err", err)
				}
			}()
		}
		wg.Wait()
	}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closedCh)
	c.cancel()
	live := c.live
	c.live = nil
	if c.graceTimer != nil {
		c.graceTimer.Stop()
	}
	c.timeoutAlarm.stop()
	after := c.dropAllLocked(func(cl *call) error { return callErr(cl, ErrClosed, "the client was closed", nil) })
	after = append(after, c.failWaitingLocked(func(cl *call) error { return callErr(cl, ErrClosed, "the client was closed", nil) })...)
	c.mu.Unlock()
	runAll(after)
	if live != nil {
		live.close()
		live.wg.Wait()
	}
	c.bg.Wait()
	return nil
}

// withdrawAcquiresLocked withdraws every ACQUIRE sent and not answered (Close): its waiter gets
// ErrClosed now, and CANCEL goes to the server; it returns the channels closed once each
// outcome is known (and a raced grant released). Without a connection nothing can be withdrawn:
// the server drops the waits when the session's grace ends. c.mu must be held.
func (c *Client) withdrawAcquiresLocked() []chan struct{} {
	if c.live == nil {
		return nil
	}
	var settles []chan struct{}
	for _, cl := range c.pending.calls(nil) {
		if cl.req.Op != wire.OpAcquire || cl.abandoned || cl.internal != nil {
			continue
		}
		c.timeouts.remove(&cl.timeoutPos)
		cl.abandoned = true
		settles = append(settles, c.cancelAcquireLocked(cl))
		cl.ch <- result{err: callErr(cl, ErrClosed, "the client was closed; the queued acquire was withdrawn", nil)}
		c.interruptLocked(cl)
	}
	return settles
}

// SessionID returns the client's 16-byte session id: random, kept across reconnects, replaced
// after the server restarted (a new state id).
func (c *Client) SessionID() [16]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session
}

// Ping sends PING and waits for its answer (bounded by the request timeout).
func (c *Client) Ping(ctx context.Context) error {
	cl := getCall()
	cl.req = wire.Request{Op: wire.OpPing}
	res, err := c.do(ctx, cl, c.opts.requestTimeout)
	if err != nil {
		return err
	}
	putCall(cl)
	return res.statusError(wire.OpPing, "", 0)
}

// Release releases the lock on key held with token, from any client: the token is the owner.
// It returns nil when the token held the key (the next waiter is granted it at once), or an
// error matching ErrNotHeld when it did not (expired, already released, wrong token): nothing
// changed. Prefer Lock.Release when you have the *Lock. The token must be positive.
func (c *Client) Release(ctx context.Context, key string, token uint64) error {
	if err := checkKey("release", key); err != nil {
		return err
	}
	if token == 0 {
		return &opError{kind: ErrInvalid, op: "release", key: key, hasK: true, msg: "the token must be positive"}
	}
	return c.release(ctx, key, token)
}

func (c *Client) release(ctx context.Context, key string, token uint64) error {
	cl := getCall()
	cl.req = wire.Request{Op: wire.OpRelease, Token: token}
	cl.key = key
	res, err := c.do(ctx, cl, c.opts.requestTimeout)
	if err != nil {
		return err
	}
	putCall(cl)
	return res.statusError(wire.OpRelease, key, token)
}

// Extend sets the lease of the lock on key held with token to lease from now (it may shorten
// it), from any client. It returns the local deadline (the lease's end, never later than the
// server's) or an error matching ErrNotHeld. Prefer Lock.Extend when you have the *Lock (it also
// moves the Lock's deadline).
func (c *Client) Extend(ctx context.Context, key string, token uint64, lease time.Duration) (time.Time, error) {
	if err := checkKey("extend", key); err != nil {
		return time.Time{}, err
	}
	if token == 0 {
		return time.Time{}, &opError{kind: ErrInvalid, op: "extend", key: key, hasK: true, msg: "the token must be positive"}
	}
	ms, err := leaseMs("extend", key, lease)
	if err != nil {
		return time.Time{}, err
	}
	res, err := c.extend(ctx, key, token, ms)
	if err != nil {
		return time.Time{}, err
	}
	return c.clk.toTime(res.first + int64(shrink(durationMs(int64(res.lease))))), nil
}

// extend sends EXTEND; the result carries its request id and first send (result.id, first).
func (c *Client) extend(ctx context.Context, key string, token uint64, ms uint32) (result, error) {
	cl := getCall()
	cl.req = wire.Request{Op: wire.OpExtend, Token: token, Lease: ms}
	cl.key = key
	res, err := c.do(ctx, cl, c.opts.requestTimeout)
	if err != nil {
		return res, err
	}
	res.id, res.first = cl.req.ID, cl.tFirst
	putCall(cl)
	return res, res.statusError(wire.OpExtend, key, token)
}

// shrink applies the clock-rate bound to a span measured by the server: a server clock running
// fast by the bound, and a client clock running slow by it, end the span this much earlier as
// the client measures it (PROTOCOL.md, "The lost signal").
func shrink(d time.Duration) time.Duration {
	return d - time.Duration(float64(d)*2*wire.ClockRateBoundPPM/1e6)
}

// holds reports whether this client holds a lock on key.
func (c *Client) holds(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.heldKeys == nil {
		// First use: count the locks by key from now on (most clients never ask, and the count
		// costs two map operations on a string per lock).
		c.heldKeys = make(map[string]int, len(c.locks))
		for _, lk := range c.locks {
			c.heldKeys[lk.key]++
		}
	}
	return c.heldKeys[key] > 0
}

// registerLocked records a lock just granted, so that EXPIRED notices, a restart and
// WithRefuseHeld find it, sets its lease and deadline (Lock.setGrant) and arms its lost signal.
// c.mu must be held, and lk not yet handed to anyone: its fields are written without lk.mu.
func (c *Client) registerLocked(lk *Lock, token uint64, leaseMs, detailMs uint32, tFirst int64) {
	lk.token = token
	lk.setGrant(leaseMs, detailMs, tFirst)
	c.locks[token] = lk
	if c.heldKeys != nil {
		c.heldKeys[lk.key]++
	}
	c.armLostLocked(lk, lk.lostDueLocked())
}

// unregister forgets a lock released or lost.
func (c *Client) unregister(lk *Lock, token uint64) {
	c.mu.Lock()
	c.lostHeap.remove(&lk.lostPos)
	if c.locks[token] == lk {
		delete(c.locks, token)
		if c.heldKeys != nil {
			if n := c.heldKeys[lk.key]; n > 1 {
				c.heldKeys[lk.key] = n - 1
			} else {
				delete(c.heldKeys, lk.key)
			}
		}
	}
	c.mu.Unlock()
}

// goBackground runs f in a goroutine that Close waits for; it reports false (and does not run f)
// once the client is closed.
func (c *Client) goBackground(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		f()
	}()
	return true
}

// pendingCount is the number of requests sent and not yet answered (for tests).
func (c *Client) pendingCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending.len()
}

func (c *Client) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	addr := "(disconnected)"
	if c.live != nil {
		addr = c.live.addr
	}
	return fmt.Sprintf("ticketing.Client{%s, session %x}", addr, c.session[:4])
}
