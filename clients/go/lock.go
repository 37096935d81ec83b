package ticketing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// Lock is a held lock: a key, its fencing token, and a lease that ends at Deadline unless it is
// extended. Pass Token to the resource you protect, and have it reject tokens lower than the
// highest it has seen (fencing).
//
// Lost is closed, once, at the first of: the local deadline (never later than the server's), the
// server's EXPIRED notice, a NOT_HELD answer to Extend or Release, or a reconnect to a restarted
// server; Err then says why (a *LockLostError with its LostReason). Once Lost is closed the lock
// is gone for good: stop the work that needed it. Lost is never closed after a successful
// Release.
//
// Methods are safe for concurrent use; the token is the owner, so any goroutine may release.
type Lock struct {
	c   *Client
	key string

	// (The fields are ordered to fit the 128-byte size class: a Lock is the one allocation of an
	// acquire+release pair.)
	mu       sync.Mutex
	token    uint64        // set (under Client.mu) when granted, before anyone else sees the Lock
	lease    time.Duration // lease last granted (acquire or extend); keep-alive asks for it again
	deadline int64         // local deadline, on Client.clk (it counts suspend time)
	extendID uint64        // the request id of the EXTEND whose answer set deadline (0: the grant's)
	lost     chan struct{} // made when first asked for (lostChan); closedChan if lost before
	lostErr  *LockLostError
	relDone  chan struct{} // made by a Release that waits for the one in flight; closed when it ends
	stopKA   chan struct{}
	kaDone   chan struct{} // closed when the keep-alive goroutine exits; nil without keep-alive
	lostPos  int32         // guarded by Client.mu: its place in Client.lostHeap (armLost)
	extends  int32         // successful extends (for tests)
	// released: Release has finished: the lock is no longer this client's concern. Its result is
	// then lostErr (nil: released while held), which no longer changes.
	released  bool
	releasing bool // a Release is in flight
	uncertain bool // an earlier Release may have reached the server (its answer was lost)
}

// closedChan is the Lost channel of a lock lost before anyone asked for it.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

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

// Deadline returns the local deadline: when the request was first sent, plus the time the server
// says passed since it first arrived, plus the lease, less the clock-rate allowance (0.2%), so it
// is never later than the server's. A successful Extend moves it. It is measured on a clock that
// counts the time the host is suspended, as the server's leases do; the time.Time returned is
// that instant as the wall clock sees it now.
func (l *Lock) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.clk.toTime(l.deadline)
}

// remaining is the time left until the local deadline.
func (l *Lock) remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Duration(l.deadline - l.c.clk.now())
}

// Lost returns a channel closed when the lock is lost (see Lock). For the local deadline it
// closes a little early (5ms, or a tenth of a shorter lease), so that ordinary timer latency
// does not make it close after the server hands the lock on; and Lost, Err and the other methods
// check the deadline themselves when called, so a caller that looks never sees an expired lock
// as held, however late the timer runs.
func (l *Lock) Lost() <-chan struct{} {
	l.checkDeadline()
	return l.lostChan()
}

// lostChan is the Lost channel, made on first use (most locks are released without anyone
// asking for it).
func (l *Lock) lostChan() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil {
		if l.lostErr != nil {
			l.lost = closedChan
		} else {
			l.lost = make(chan struct{})
		}
	}
	return l.lost
}

// Err returns nil while the lock is not lost, then a *LockLostError (matching ErrLockLost) that
// names the reason.
func (l *Lock) Err() error {
	l.checkDeadline()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errLocked()
}

// errLocked is Err's answer: l.lostErr, as an error. l.mu must be held.
func (l *Lock) errLocked() error {
	if l.lostErr == nil {
		return nil
	}
	return l.lostErr
}

// checkDeadline fires the lost signal now if the deadline timer is due but has not run yet.
func (l *Lock) checkDeadline() {
	l.mu.Lock()
	due := l.deadlineDueLocked()
	l.mu.Unlock()
	if due {
		l.markLost(ReasonExpired, "its local deadline passed without a successful extend", nil)
	}
}

// deadlineDueLocked reports whether the lost signal is due but has not fired. l.mu must be held.
func (l *Lock) deadlineDueLocked() bool {
	return l.lostErr == nil && !l.released && l.deadline != 0 && l.untilLostLocked() <= 0
}

// Acquire takes the lock on key for lease, waiting in the key's FIFO queue until it is granted,
// until the wait timeout passes (WithWaitTimeout: ErrNotAcquired), or until ctx is done. The
// lease starts when the lock is granted; it must be at least 1ms (it is a time.Duration:
// Acquire(ctx, k, 30) is 30ns, and is refused).
//
// The request timeout (WithRequestTimeout) bounds Acquire beyond the wait timeout; a wait without
// limit is bounded only by ctx and the heartbeat. If ctx is done (or the request timeout passes)
// while waiting, Acquire withdraws the request (CANCEL) and, if the lock was granted meanwhile,
// releases it, so a cancelled Acquire never leaves a lock held; it waits for that clean-up up to
// WithCleanupTimeout. If the connection drops, Acquire keeps waiting: the session is resumed on
// the next connection and the request keeps its place in the queue.
func (c *Client) Acquire(ctx context.Context, key string, lease time.Duration, opts ...AcquireOption) (*Lock, error) {
	lk, err := c.acquire(ctx, "acquire", key, lease, -1, opts)
	if err != nil {
		return nil, err
	}
	return lk, nil
}

// TryAcquire takes the lock on key if it is free and nobody is queued, without waiting. It
// returns a nil *Lock and a nil error when the key is taken ("not acquired" is an answer, not a
// failure), and an error only when the call itself failed.
func (c *Client) TryAcquire(ctx context.Context, key string, lease time.Duration, opts ...AcquireOption) (*Lock, error) {
	lk, err := c.acquire(ctx, "try-acquire", key, lease, 0, opts)
	if errors.Is(err, ErrNotAcquired) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return lk, nil
}

func (c *Client) acquire(ctx context.Context, op, key string, lease time.Duration, wait time.Duration, opts []AcquireOption) (*Lock, error) {
	if err := checkKey(op, key); err != nil {
		return nil, err
	}
	ao := acquireOptions{wait: -1}
	if len(opts) > 0 {
		ao = applyAcquireOptions(opts) // (out of line: without options, ao stays on the stack)
	}
	if wait >= 0 {
		ao.wait = wait
	}
	ms, err := leaseMs(op, key, lease)
	if err == nil && ao.err == "" {
		switch {
		case ao.keepAlive && ao.kaInterval >= lease:
			ao.invalid("WithKeepAlive: interval %v is not below the lease %v", ao.kaInterval, lease)
		case ao.maxHold > 0 && !ao.keepAlive:
			ao.invalid("WithMaxHold caps keep-alive: it needs WithKeepAlive")
		}
	}
	if err == nil && ao.err != "" {
		err = &opError{kind: ErrInvalid, op: op, key: key, hasK: true, msg: ao.err}
	}
	if err != nil {
		return nil, err
	}
	if ao.refuseHeld && c.holds(key) {
		return nil, &opError{kind: ErrAlreadyHeld, op: op, key: key, hasK: true, msg: "this client already holds the key (WithRefuseHeld)"}
	}
	waitMs, timeout := wire.WaitForever, time.Duration(0)
	if ao.wait >= 0 {
		waitMs = uint32(ao.wait / time.Millisecond)
		timeout = ao.wait + c.opts.requestTimeout
	}
	lk := &Lock{c: c, key: key}
	cl := getCall()
	cl.req = wire.Request{Op: wire.OpAcquire, Lease: ms, WaitMs: waitMs}
	cl.key = key
	cl.lk = lk
	cl.wait = ao.wait
	res, err := c.do(ctx, cl, timeout)
	if err != nil {
		return nil, err
	}
	retried, tGrant := cl.retried, cl.tGrant
	putCall(cl)
	if res.status != wire.StatusOK {
		if res.status == wire.StatusNotHeld && retried {
			// A retried ACQUIRE holds nothing: granted and since ended, or unknown to the server.
			return nil, &opError{kind: ErrConnectionLost, op: op, key: key, hasK: true,
				msg: "the answer was lost with the connection, and the server holds nothing for the request now"}
		}
		serr := res.statusError(wire.OpAcquire, key, 0).(*StatusError)
		serr.Wait = int64(ao.wait / time.Millisecond)
		if ao.wait < 0 {
			serr.Wait = -1
		}
		return nil, serr
	}
	if ao.keepAlive {
		lk.startKeepAlive(ao.kaInterval, ao.maxHold, tGrant)
	}
	return lk, nil
}

func applyAcquireOptions(opts []AcquireOption) acquireOptions {
	ao := acquireOptions{wait: -1}
	for _, o := range opts {
		o(&ao)
	}
	return ao
}

// WithLock acquires key, runs fn while holding it, and releases it, like a scoped lock. fn's
// context is cancelled when the lock is lost (its cause is the *LockLostError). WithLock returns
// fn's error; or, when the lock was lost while fn ran, a *LockLostError naming the reason
// (matching ErrLockLost, and fn's error too when fn failed for another reason) even if fn
// returned nil: the work may not have been protected. To accept a lock lost after the work
// (the one opt-out), check errors.Is(err, ErrLockLost) and go on. The release at the end is
// bounded by the request timeout and is not cancelled by ctx.
func (c *Client) WithLock(ctx context.Context, key string, lease time.Duration, fn func(ctx context.Context, lock *Lock) error, opts ...AcquireOption) error {
	lk, err := c.Acquire(ctx, key, lease, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-lk.Lost():
			cancel(lk.Err())
		case <-stop:
		}
	}()
	ferr := fn(fctx, lk)
	close(stop)
	<-watched
	cancel(nil)
	rerr := lk.Release(context.WithoutCancel(ctx))
	if lerr := lk.Err(); lerr != nil {
		le := *lk.lostErrCopy()
		if ferr != nil && !errors.Is(ferr, context.Canceled) && !errors.Is(ferr, ErrLockLost) {
			le.Err = ferr
			le.Detail += "; the work failed: " + causeText(ferr)
		}
		return &le
	}
	if ferr != nil {
		return ferr
	}
	return rerr
}

func (l *Lock) lostErrCopy() *LockLostError {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := *l.lostErr
	return &e
}

// setGrant sets the lease and the local deadline of a lock just granted (PROTOCOL.md, "The lost
// signal"): deadline = t_first + (detail + lease)·(1 − 2ρ), whichever transmission the answer
// was for: t_first is the request's first send, and detail the time since it first reached the
// server (for a retry answered from the server's table, lease_ms is what is left). Only
// Client.registerLocked calls it, before anyone else can see l (so without l.mu).
func (l *Lock) setGrant(leaseMs, detailMs uint32, tFirst int64) {
	l.lease = durationMs(int64(leaseMs))
	l.deadline = tFirst + int64(shrink(durationMs(int64(leaseMs)+int64(detailMs))))
}

// lostDueLocked is when the lost signal should fire, on Client.clk: the deadline less a margin
// for timer latency (5ms, or a tenth of a shorter lease). l.mu must be held.
func (l *Lock) lostDueLocked() int64 {
	return l.deadline - int64(min(wire.LostMarginMs*time.Millisecond, l.lease/10))
}

// untilLostLocked is the time left until the lost signal should fire. l.mu must be held.
func (l *Lock) untilLostLocked() time.Duration {
	return time.Duration(l.lostDueLocked() - l.c.clk.now())
}

// onDeadline runs when the lost signal is due (fireLost).
func (l *Lock) onDeadline() {
	l.mu.Lock()
	if d := l.untilLostLocked(); d > 0 && l.lostErr == nil && !l.released {
		// Extended after its deadline was taken from the heap but before this ran.
		l.c.armLost(l, l.lostDueLocked())
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.markLost(ReasonExpired, "its local deadline passed without a successful extend", nil)
}

// markLost fires the lost signal (once), unless the lock was released.
func (l *Lock) markLost(reason LostReason, detail string, cause error) {
	l.mu.Lock()
	if l.lostErr != nil || l.released {
		l.mu.Unlock()
		return
	}
	l.setLostLocked(reason, detail, cause)
	token := l.token
	l.mu.Unlock()
	l.c.unregister(l, token)
}

// setLostLocked records the loss and closes Lost. l.mu must be held.
func (l *Lock) setLostLocked(reason LostReason, detail string, cause error) {
	l.lostErr = &LockLostError{Key: l.key, Token: l.token, Reason: reason, Detail: detail, Err: cause}
	if l.lost == nil {
		l.lost = closedChan
	} else {
		close(l.lost)
	}
	// (Its caller then unregisters it, which disarms armLost.)
}

// armLostLocked has fireLost run l.onDeadline at (or soon after) at (on Client.clk), instead of
// at the time set before, if any, until l is unregistered. c.mu must be held.
func (c *Client) armLostLocked(l *Lock, at int64) {
	c.lostHeap.set(l, &l.lostPos, at)
	c.wantLostLocked(at)
}

// wantLostLocked sets the lost alarm for at, or for wire.LostCheckMs from now if that is
// sooner: a runtime timer stops while the host is suspended, and Client.clk does not, so the
// alarm looks again that often while a lock is held (after a resume, lost fires within it).
// c.mu must be held.
func (c *Client) wantLostLocked(at int64) {
	if a := &c.lostAlarm; a.set && at >= a.armed {
		// Set (here) for min(at', now'+LostCheckMs) with now' <= now: no later than
		// now+LostCheckMs, nor than at. Nothing to move, and no clock to read (the acquire path).
		return
	}
	c.lostAlarm.want(min(at, c.clk.now()+int64(wire.LostCheckMs*time.Millisecond)))
}

// armLost is armLostLocked without c.mu held. l.mu may be held (Lock.mu before Client.mu).
func (c *Client) armLost(l *Lock, at int64) {
	c.mu.Lock()
	c.armLostLocked(l, at)
	c.mu.Unlock()
}

// fireLost runs at the earliest lost-signal time, and every wire.LostCheckMs while a lock is
// held: it fires every lock's that is due.
func (c *Client) fireLost() {
	var due []*Lock
	c.mu.Lock()
	c.lostAlarm.fired()
	now := c.clk.now()
	for {
		l, at, ok := c.lostHeap.first()
		if !ok {
			break
		}
		if at > now {
			c.wantLostLocked(at)
			break
		}
		c.lostHeap.remove(&l.lostPos)
		due = append(due, l)
	}
	c.mu.Unlock()
	for _, l := range due {
		l.onDeadline()
	}
}

// Release releases the lock; the next waiter is granted it at once. Keep-alive stops first: no
// extend is sent after Release returns. The call is bounded by ctx and the request timeout, so
// `defer lock.Release(context.Background())` cannot hang.
//
// It returns nil when the lock was held until this call released it. If the lock was lost before
// (Lost closed), it returns the *LockLostError at once, without waiting for the server: the
// work done under the lock may not have been protected. It still tells the server, in the
// background (the server may not have reclaimed the lock yet, so the next waiter need not wait
// for the lease), unless the lock was lost to a restarted server or a NOT_HELD answer. A NOT_HELD answer marks the lock lost (ReasonNotHeld); the
// error then matches both ErrLockLost and ErrNotHeld. Other errors (ErrTimeout,
// ErrConnectionLost, ErrClosed) leave the lock as it was: call Release again, or let the lease
// end. Concurrent and repeated calls are safe: once a Release has finished, later calls return
// its result without a round trip.
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.stopKA != nil {
		l.mu.Unlock()
		l.stopKeepAlive()
		l.mu.Lock()
	}
	if l.deadlineDueLocked() { // (checkDeadline, without locking again)
		l.mu.Unlock()
		l.markLost(ReasonExpired, "its local deadline passed without a successful extend", nil)
		l.mu.Lock()
	}
	for {
		if l.released {
			err := l.errLocked()
			l.mu.Unlock()
			return err
		}
		if l.lostErr != nil && !l.releasing {
			l.released = true
			err, token := l.lostErr, l.token
			l.mu.Unlock()
			if err.Reason != ReasonServerRestarted && err.Reason != ReasonNotHeld {
				l.c.goBackground(func() {
					ctx, cancel := context.WithTimeout(l.c.closeCtx, l.c.opts.requestTimeout)
					defer cancel()
					l.c.release(ctx, l.key, token) // best effort: the answer changes nothing here
				})
			}
			return err
		}
		if l.releasing {
			if l.relDone == nil {
				l.relDone = make(chan struct{})
			}
			ch := l.relDone
			l.mu.Unlock()
			select {
			case <-ch:
				l.mu.Lock()
				continue
			case <-ctx.Done():
				return &opError{kind: ErrCancelled, op: "release", key: l.key, hasK: true, token: l.Token(), msg: "cancelled while another Release of the lock was in flight", cause: ctx.Err()}
			}
		}
		l.releasing = true
		token, uncertain := l.token, l.uncertain
		l.mu.Unlock()

		done, err := l.release(ctx, token, uncertain)
		if done != nil {
			close(done) // the Releases waiting for this one look again
		}
		return err
	}
}

// release sends RELEASE for Release and records the outcome; it returns Release's result and,
// if other Releases wait for this one, the channel to close once the lock is unregistered.
func (l *Lock) release(ctx context.Context, token uint64, uncertain bool) (chan struct{}, error) {
	err := l.c.release(ctx, l.key, token)

	l.mu.Lock()
	done := l.relDone
	l.releasing, l.relDone = false, nil
	if err != nil && uncertain && isNotHeld(err) && l.lostErr == nil && l.c.clk.now() < l.deadline {
		// An earlier attempt whose answer was lost released it: the server never reclaims a
		// lock before the local deadline, and NOT_HELD says nobody holds this token now.
		err = nil
	}
	switch {
	case err == nil:
		if l.lostErr != nil {
			err = l.lostErr
		}
	case isNotHeld(err):
		if l.lostErr == nil {
			l.setLostLocked(ReasonNotHeld, "the server answered NOT_HELD to its release", err)
		}
		err = l.lostErr
	default:
		if errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrTimeout) || errors.Is(err, ErrCancelled) {
			l.uncertain = true // the request may have reached the server
		}
		if l.lostErr != nil {
			// Lost before: that is the answer, whether or not the server could be told
			// (a later Release tries again).
			err = l.lostErr
		}
		l.mu.Unlock()
		return done, err
	}
	l.released = true // (and err is l.errLocked())
	l.mu.Unlock()
	l.c.unregister(l, token)
	return done, err
}

// Extend sets the lease to lease from now (it may shorten it) and moves Deadline to the time the
// request was first sent plus lease, unless the answer to a later Extend of the lock (keep-alive's,
// another goroutine's) came first: the server applies extends in the order they were sent, so the
// deadline follows the last one sent. Keep-alive then asks for this lease too. After the lock was lost
// it returns the *LockLostError without a round trip; after Release, an error matching
// ErrNotHeld. A NOT_HELD answer marks the lock lost (ReasonNotHeld). Other errors (a timeout, a
// lost connection) leave the lock as it was: it is lost at its deadline unless a later Extend
// succeeds.
func (l *Lock) Extend(ctx context.Context, lease time.Duration) error {
	ms, err := leaseMs("extend", l.key, lease)
	if err != nil {
		return err
	}
	return l.extend(ctx, ms)
}

func (l *Lock) extend(ctx context.Context, ms uint32) error {
	l.checkDeadline()
	l.mu.Lock()
	switch {
	case l.lostErr != nil:
		err := l.lostErr
		l.mu.Unlock()
		return err
	case l.released:
		l.mu.Unlock()
		return &opError{kind: ErrNotHeld, op: "extend", key: l.key, hasK: true, token: l.token, msg: "the lock was released"}
	}
	token := l.token
	l.mu.Unlock()

	res, err := l.c.extend(ctx, l.key, token, ms)
	if isNotHeld(err) {
		l.markLost(ReasonNotHeld, "the server answered NOT_HELD to its extend", err)
		return l.Err()
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
	l.extends++
	if res.id < l.extendID {
		return nil // a later extend was answered first: the server applied this one before it
	}
	l.extendID = res.id
	l.lease = durationMs(int64(res.lease))
	l.deadline = res.first + int64(shrink(l.lease))
	l.c.armLost(l, l.lostDueLocked())
	return nil
}

// Verify asks the server whether this lock still holds its key (INSPECT with the token). It
// changes nothing, and does not fire the lost signal: a false answer means someone released
// the lock by its token, or its lease ended.
func (l *Lock) Verify(ctx context.Context) (bool, error) {
	return l.c.Verify(ctx, l.key, l.Token())
}

// startKeepAlive runs the keep-alive goroutine (interval 0: a third of the lease).
func (l *Lock) startKeepAlive(interval, maxHold time.Duration, granted time.Time) {
	l.mu.Lock()
	l.stopKA = make(chan struct{})
	l.kaDone = make(chan struct{})
	stop, done := l.stopKA, l.kaDone
	l.mu.Unlock()
	if !l.c.goBackground(func() {
		defer close(done)
		l.keepAlive(interval, maxHold, granted, stop)
	}) {
		close(done)
	}
}

func (l *Lock) keepAlive(fixed, maxHold time.Duration, granted time.Time, stop chan struct{}) {
	ctx, cancel := context.WithCancel(l.c.closeCtx)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	lost := l.lostChan()
	var holdEnd <-chan time.Time
	if maxHold > 0 {
		ht := time.NewTimer(maxHold - time.Since(granted))
		defer ht.Stop()
		holdEnd = ht.C
	}
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
		case <-lost:
			return
		case <-holdEnd:
			l.c.opts.logger.Info("ticketing: keep-alive reached its max hold; the lock runs out its lease", "key", FormatKey(l.key), "deadline_in", l.remaining())
			return
		}
		iv := interval()
		remaining := l.remaining()
		if remaining <= 0 {
			return // lost at the deadline; the timer reports it
		}
		// One attempt may take at most until the deadline.
		actx, acancel := context.WithTimeout(ctx, remaining)
		l.mu.Lock()
		ms := uint32((l.lease + time.Millisecond - 1) / time.Millisecond)
		l.mu.Unlock()
		err := l.extend(actx, ms)
		acancel()
		switch {
		case err == nil:
			t.Reset(iv)
		case ctx.Err() != nil, errors.Is(err, ErrLockLost), errors.Is(err, ErrNotHeld), errors.Is(err, ErrClosed):
			return
		default:
			l.c.opts.logger.Warn("ticketing: keep-alive extend failed; retrying", "key", FormatKey(l.key), "err", err, "deadline_in", l.remaining())
			t.Reset(max(min(iv/4, l.remaining()/4), time.Millisecond))
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

func (l *Lock) String() string {
	return fmt.Sprintf("ticketing.Lock{%s token %d}", FormatKey(l.key), l.Token())
}
