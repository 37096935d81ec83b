package ticketing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
)

// Lock is a held lock: a key, its fencing token, and a lease that ends at Deadline unless it is
// extended. Pass Token to the resource you protect, and have it reject tokens lower than the
// highest it has seen (fencing).
//
// Lost is closed at the first of: the server's EXPIRED notice for the token, the local deadline
// (never later than the server's), or an Extend answered NOT_HELD. Once Lost is closed the lock
// is gone for good: stop the work that needed it.
//
// Methods are safe for concurrent use.
type Lock struct {
	c   *Client
	key string

	mu       sync.Mutex
	token    uint64
	lease    time.Duration // lease last granted (acquire or extend); keep-alive asks for it again
	deadline time.Time     // local deadline
	timer    *time.Timer   // fires markLost at deadline
	lost     chan struct{}
	lostErr  error // why it was lost (matches ErrLockLost); nil while not lost
	lostAt   time.Time
	released bool  // a RELEASE was answered OK (or the lock was known gone)
	relErr   error // final result of Release, once released
	stopKA   chan struct{}
	kaDone   chan struct{} // closed when the keep-alive goroutine exits; nil without keep-alive
	extends  int           // successful extends (for tests)
}

// Key returns the lock's key.
func (l *Lock) Key() string { return l.key }

// Token returns the fencing token: larger than every token granted before it, on any key.
func (l *Lock) Token() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.token
}

// Lease returns the lease last granted (by Acquire or the last successful Extend).
func (l *Lock) Lease() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lease
}

// Deadline returns the local deadline: the lease's end as measured from when the request was
// sent, never later than the server's. A successful Extend moves it.
func (l *Lock) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Lost returns a channel closed when the lock is lost (see Lock). For the local deadline it
// closes a few milliseconds early (5ms, or a tenth of a shorter lease), so that timer latency
// cannot make it close after the server hands the lock on. It is not closed by Release.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err returns nil while the lock is not lost, then an error matching ErrLockLost that says why.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr
}

// Acquire takes the lock on key for lease, waiting in the server's FIFO queue until it is granted
// or ctx is done (or the WithWaitTimeout passes: ErrNotAcquired). The lease starts when the lock
// is granted.
//
// If ctx is done while waiting, Acquire withdraws the request (CANCEL) and returns ctx.Err(); if
// the lock was granted meanwhile it releases it first, so a cancelled Acquire never leaves a lock
// held. It waits for that clean-up up to WithCleanupTimeout, then finishes it in the background.
//
// An Acquire is not retried when its connection fails (error matching ErrConnectionLost): the
// grant may have happened just before, and such a lock stays held until its lease ends.
func (c *Client) Acquire(ctx context.Context, key string, lease time.Duration, opts ...AcquireOption) (*Lock, error) {
	ao := acquireOptions{wait: -1}
	for _, o := range opts {
		o(&ao)
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	ms, err := leaseMs(lease)
	if err != nil {
		return nil, err
	}
	wait := wire.WaitForever
	if ao.wait >= 0 {
		w := ao.wait / time.Millisecond
		if w >= time.Duration(wire.WaitForever) {
			w = time.Duration(wire.WaitForever - 1)
		}
		wait = uint32(w)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	req := wire.Request{Op: wire.OpAcquire, ID: c.nextID.Add(1), Lease: ms, WaitMs: wait, Key: []byte(key)}
	for attempt := 0; ; attempt++ {
		cn, err := c.getConn(ctx)
		if err != nil {
			return nil, err
		}
		lk := &Lock{c: c, key: key, lost: make(chan struct{})}
		cl := getCall()
		cl.lk = lk
		if err := cn.send(&req, cl); err != nil {
			// The connection had failed before anything was queued: safe to send elsewhere.
			putCall(cl)
			if attempt < c.opts.maxRetries && errors.Is(err, ErrConnectionLost) {
				continue
			}
			return nil, err
		}
		var res result
		select {
		case res = <-cl.ch:
			putCall(cl)
		case <-ctx.Done():
			c.cancelAcquire(cn, cl, &req)
			return nil, ctx.Err()
		}
		if res.err != nil {
			return nil, res.err
		}
		if res.status == wire.StatusOK {
			if ao.kaDefault || ao.keepAlive > 0 {
				lk.startKeepAlive(ao.keepAlive)
			}
			return lk, nil
		}
		serr := statusError(wire.OpAcquire, &res)
		if c.redirect(cn, &res) && attempt < c.opts.maxRetries {
			if err := c.sleepBackoff(ctx, attempt); err != nil {
				return nil, err
			}
			continue // same request id: the retry is the same request (cluster idempotence)
		}
		return nil, serr
	}
}

// TryAcquire takes the lock on key if it is free and nobody is queued, without waiting;
// otherwise it returns an error matching ErrNotAcquired.
func (c *Client) TryAcquire(ctx context.Context, key string, lease time.Duration, opts ...AcquireOption) (*Lock, error) {
	return c.Acquire(ctx, key, lease, append(opts, WithWaitTimeout(0))...)
}

// cancelAcquire withdraws a waiting ACQUIRE whose caller gave up: it sends CANCEL and waits
// (bounded) for the ACQUIRE's answer; if that is OK after all, it releases the lock.
func (c *Client) cancelAcquire(cn *conn, cl *call, req *wire.Request) {
	_ = cn.send(&wire.Request{Op: wire.OpCancel, ID: c.nextID.Add(1), Token: req.ID}, nil)
	finish := func(res result) {
		lk := cl.lk
		putCall(cl)
		if res.err == nil && res.status == wire.StatusOK {
			ctx, cancel := context.WithTimeout(context.Background(), c.opts.cleanupTimeout)
			defer cancel()
			if err := lk.Release(ctx); err != nil && !errors.Is(err, ErrLockLost) {
				c.opts.logger.Warn("ticketing: could not release a lock granted after its Acquire was cancelled; it is held until its lease ends",
					"key", lk.key, "token", lk.Token(), "err", err)
			}
		}
	}
	t := time.NewTimer(c.opts.cleanupTimeout)
	defer t.Stop()
	select {
	case res := <-cl.ch:
		finish(res)
	case <-t.C:
		go func() { finish(<-cl.ch) }()
	}
}

// granted is called by the reader when the ACQUIRE is answered OK, before the answer is handed
// to the waiter: it sets the token and the local deadline (t_send + queued ms + lease), arms the
// deadline timer and registers the lock for EXPIRED notices.
func (l *Lock) granted(token uint64, leaseMs, queuedMs uint32, tSend time.Time) {
	l.mu.Lock()
	l.token = token
	l.lease = time.Duration(leaseMs) * time.Millisecond
	l.deadline = tSend.Add(time.Duration(queuedMs)*time.Millisecond + l.lease)
	l.timer = time.AfterFunc(l.untilLostLocked(), l.onDeadline)
	l.mu.Unlock()
	l.c.register(l)
}

// lostMargin is how much earlier than the local deadline the deadline timer fires: timers fire
// late by up to about a millisecond (more under load), and Lost must be closed by the time the
// server, whose deadline is only a one-way trip later, can hand the lock on. It is capped at a
// tenth of the lease for very short leases.
const lostMargin = 5 * time.Millisecond

// untilLostLocked is the time left until the deadline timer should fire. l.mu must be held.
func (l *Lock) untilLostLocked() time.Duration {
	return time.Until(l.deadline) - min(lostMargin, l.lease/10)
}

func (l *Lock) onDeadline() {
	l.mu.Lock()
	if d := l.untilLostLocked(); d > 0 && l.lostErr == nil && !l.released {
		// Extended after this timer fired but before it ran.
		l.timer.Reset(d)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.markLost(fmt.Errorf("%w: its local deadline passed without a successful extend", ErrLockLost))
}

// markLost closes Lost (once) unless the lock was released.
func (l *Lock) markLost(why error) {
	l.mu.Lock()
	if l.lostErr != nil || l.released {
		l.mu.Unlock()
		return
	}
	l.lostErr = why
	l.lostAt = time.Now()
	close(l.lost)
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	l.c.unregister(l)
}

// Release releases the lock; the next waiter is granted it at once. Keep-alive stops first.
// Release is safe to call more than once (and from a defer after an explicit Release): once it
// has succeeded, later calls return the same result without a round trip.
//
// It returns nil when the lock was held until this call released it. If the lock was lost before
// (Lost closed), it still tells the server (which may not have expired it yet, so the next waiter
// need not wait for the lease) and returns an error matching ErrLockLost: the work done under
// the lock may not have been protected. If the server answers NOT_HELD, the error matches both
// ErrLockLost and ErrNotHeld. A connection failure is retried within ctx.
func (l *Lock) Release(ctx context.Context) error {
	l.stopKeepAlive()
	l.mu.Lock()
	if l.released {
		err := l.relErr
		l.mu.Unlock()
		return err
	}
	lostErr := l.lostErr
	token := l.token
	l.mu.Unlock()

	var err error
	uncertain := false
	for attempt := 0; ; attempt++ {
		_, _, err = l.c.roundTrip(ctx, &wire.Request{Op: wire.OpRelease, Token: token, Key: []byte(l.key)}, false)
		if errors.Is(err, ErrConnectionLost) && attempt < l.c.opts.maxRetries && ctx.Err() == nil {
			uncertain = true // the attempt may or may not have reached the server
			continue
		}
		// NOT_HELD after an attempt of unknown outcome, while the lock was not lost (the server
		// never expires a lock before the local deadline): that attempt released it.
		if uncertain && errors.Is(err, ErrNotHeld) && lostErr == nil && l.Err() == nil && time.Now().Before(l.Deadline()) {
			err = nil
		}
		break
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil && l.lostErr == nil:
		// Held until now.
	case err == nil:
		err = l.lostErr
	case errors.Is(err, ErrNotHeld):
		if l.lostErr == nil {
			l.lostErr = fmt.Errorf("%w: %w", ErrLockLost, err)
			l.lostAt = time.Now()
			close(l.lost)
		}
		err = fmt.Errorf("%w: %w", ErrLockLost, err)
	default:
		return err // transient: the lock may still be held; Release may be called again
	}
	l.released = true
	l.relErr = err
	if l.timer != nil {
		l.timer.Stop()
	}
	l.c.unregister(l) // Lock.mu before Client.lmu
	return err
}

// Extend sets the lease to lease from now (it may shorten it) and moves Deadline to the time
// the request was sent plus lease. Keep-alive then asks for this lease too. After the lock is
// lost or released it returns an error matching ErrLockLost (or ErrNotHeld after Release)
// without a round trip; an answer NOT_HELD marks the lock lost and matches both ErrLockLost and
// ErrNotHeld. Other errors (a lost connection) leave the lock as it was: it is lost at its
// deadline unless a later Extend succeeds.
func (l *Lock) Extend(ctx context.Context, lease time.Duration) error {
	ms, err := leaseMs(lease)
	if err != nil {
		return err
	}
	return l.extend(ctx, ms)
}

func (l *Lock) extend(ctx context.Context, ms uint32) error {
	l.mu.Lock()
	switch {
	case l.lostErr != nil:
		err := l.lostErr
		l.mu.Unlock()
		return err
	case l.released:
		l.mu.Unlock()
		return fmt.Errorf("%w: the lock was released", ErrNotHeld)
	}
	token := l.token
	l.mu.Unlock()

	res, tSend, err := l.c.roundTrip(ctx, &wire.Request{Op: wire.OpExtend, Token: token, Lease: ms, Key: []byte(l.key)}, true)
	if errors.Is(err, ErrNotHeld) {
		lost := fmt.Errorf("%w: %w", ErrLockLost, err)
		l.markLost(lost)
		return lost
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr != nil {
		// The local deadline passed before the answer arrived: the lock counts as lost.
		return l.lostErr
	}
	if l.released {
		return nil
	}
	l.lease = time.Duration(res.lease) * time.Millisecond
	l.deadline = tSend.Add(l.lease)
	l.timer.Reset(l.untilLostLocked())
	l.extends++
	return nil
}

// startKeepAlive runs the keep-alive goroutine (interval 0: a third of the lease).
func (l *Lock) startKeepAlive(interval time.Duration) {
	c := l.c
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.keepAlive.Add(1) // under c.mu, so never concurrently with Close's Wait
	c.mu.Unlock()
	l.mu.Lock()
	l.stopKA = make(chan struct{})
	l.kaDone = make(chan struct{})
	stop, done := l.stopKA, l.kaDone
	l.mu.Unlock()
	go func() {
		defer l.c.keepAlive.Done()
		defer close(done)
		l.keepAlive(interval, stop)
	}()
}

func (l *Lock) keepAlive(fixed time.Duration, stop chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
		case <-l.c.closedCh:
		case <-ctx.Done():
		}
		cancel()
	}()
	interval := func() time.Duration {
		if fixed > 0 {
			return fixed
		}
		return max(l.Lease()/3, time.Millisecond)
	}
	t := time.NewTimer(interval())
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		case <-l.lost:
			return
		}
		iv := interval()
		remaining := time.Until(l.Deadline())
		if remaining <= 0 {
			return // lost at the deadline; the timer reports it
		}
		// One attempt may take at most one interval (and never past the deadline); a stalled
		// connection is then dropped so that the next attempt reconnects.
		actx, acancel := context.WithTimeout(ctx, min(iv, remaining))
		l.mu.Lock()
		ms := uint32(l.lease / time.Millisecond)
		l.mu.Unlock()
		cn := l.c.currentConn()
		err := l.extend(actx, ms)
		stalled := errors.Is(err, context.DeadlineExceeded) && actx.Err() != nil && ctx.Err() == nil
		acancel()
		switch {
		case err == nil:
			t.Reset(iv)
		case ctx.Err() != nil, errors.Is(err, ErrLockLost), errors.Is(err, ErrNotHeld), errors.Is(err, ErrClosed):
			return
		default:
			if stalled && cn != nil && cn == l.c.currentConn() {
				l.c.dropConn(cn, "keep-alive extend stalled")
			}
			l.c.opts.logger.Warn("ticketing: keep-alive extend failed; retrying", "key", l.key, "err", err, "deadline_in", time.Until(l.Deadline()))
			t.Reset(max(min(iv/4, time.Until(l.Deadline())/4), time.Millisecond))
		}
	}
}

// stopKeepAlive stops the keep-alive goroutine and waits until it has exited, so that no extend
// is sent after it returns.
func (l *Lock) stopKeepAlive() {
	l.mu.Lock()
	stop, done := l.stopKA, l.kaDone
	if stop != nil {
		select {
		case <-stop:
		default:
			close(stop)
		}
	}
	l.mu.Unlock()
	if done != nil {
		<-done
	}
}
