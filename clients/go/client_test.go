package ticketing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
)

// Integration tests against a real server on 127.0.0.1 (the shared one from TestMain unless a
// test needs its own configuration). Every wait is bounded.

const bound = 10 * time.Second // upper bound on anything that should happen "soon"

func dialT(t *testing.T, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c, err := Dial(ctx, append([]Option{WithEndpoints(sharedAddr)}, opts...)...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

var (
	runIDs  sync.Map // *testing.T -> int64
	lastRun atomic.Int64
)

// key returns a key unique to the test and the run (the shared server outlives every test, and
// -count=N runs them again).
func key(t *testing.T, suffix ...string) string {
	id, _ := runIDs.LoadOrStore(t, lastRun.Add(1))
	return fmt.Sprintf("%s/%d/%s", t.Name(), id, strings.Join(suffix, "/"))
}

func mustAcquire(t *testing.T, c *Client, k string, lease time.Duration, opts ...AcquireOption) *Lock {
	t.Helper()
	lk, err := c.Acquire(ctxT(t), k, lease, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", k, err)
	}
	return lk
}

func TestDialPing(t *testing.T) {
	c := dialT(t)
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if c.SessionID() == ([16]byte{}) {
		t.Error("zero session id")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctxT(t)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

func TestDialUnavailable(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{})
	a := srv.Addr
	srv.Stop()
	_, err := Dial(ctxT(t), WithEndpoints(a), WithDialTimeout(time.Second))
	if !errors.Is(err, ErrUnavailable) || !IsRetryable(err) {
		t.Fatalf("Dial to a stopped server: %v", err)
	}
}

func TestAuth(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{Token: "s3cret"})
	ctx := ctxT(t)
	c, err := Dial(ctx, WithEndpoints(srv.Addr), WithToken("s3cret"))
	if err != nil {
		t.Fatalf("right token: %v", err)
	}
	defer c.Close()
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	lk := mustAcquire(t, c, key(t), time.Minute)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		addr string
		opts []Option
		msg  string
	}{
		{"wrong token", srv.Addr, []Option{WithToken("wrong")}, "rejected the token"},
		{"no token", srv.Addr, nil, "requires a token"},
		{"server without auth", sharedAddr, []Option{WithToken("s3cret")}, "does not require auth"},
	} {
		start := time.Now()
		_, err := Dial(ctx, append([]Option{WithEndpoints(tc.addr, tc.addr)}, tc.opts...)...)
		if !errors.Is(err, ErrAuthFailed) || IsRetryable(err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if time.Since(start) > 2*time.Second {
			t.Errorf("%s: auth failure took %v (retried?)", tc.name, time.Since(start))
		}
	}
}

func TestTLS(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{TLS: true, Token: "tls-token"})
	pem, err := os.ReadFile(testserver.TLSCA())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	ctx := ctxT(t)
	c, err := Dial(ctx, WithEndpoints(srv.Addr), WithTLS(&tls.Config{RootCAs: pool}), WithToken("tls-token"))
	if err != nil {
		t.Fatalf("TLS dial: %v", err)
	}
	defer c.Close()
	lk := mustAcquire(t, c, key(t), time.Minute)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// An untrusted server certificate fails the dial.
	if _, err := Dial(ctx, WithEndpoints(srv.Addr), WithTLS(&tls.Config{}), WithToken("tls-token"), WithDialTimeout(2*time.Second)); err == nil {
		t.Fatal("dial trusting no CA succeeded")
	}
}

func TestAcquireRelease(t *testing.T) {
	a, b := dialT(t), dialT(t)
	ctx := ctxT(t)
	k := key(t)
	lk := mustAcquire(t, a, k, time.Minute)
	if lk.Token() == 0 || lk.Key() != k || time.Until(lk.Deadline()) > time.Minute || time.Until(lk.Deadline()) < 50*time.Second {
		t.Fatalf("lock %d %q deadline in %v", lk.Token(), lk.Key(), time.Until(lk.Deadline()))
	}
	if _, err := b.TryAcquire(ctx, k, time.Minute); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	if _, err := b.Acquire(ctx, k, time.Minute, WithWaitTimeout(50*time.Millisecond)); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("Acquire with a wait timeout: %v", err)
	}
	if err := lk.Extend(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := time.Until(lk.Deadline()); d < 110*time.Second {
		t.Errorf("deadline after Extend in %v", d)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if err := lk.Extend(ctx, time.Minute); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Extend after Release: %v", err)
	}
	if err := a.Release(ctx, k, lk.Token()); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("release of a released token: %v", err)
	}
	lk2, err := b.TryAcquire(ctx, k, time.Minute)
	if err != nil || lk2.Token() <= lk.Token() {
		t.Fatalf("TryAcquire after release: %v (token %d after %d)", err, lk2.Token(), lk.Token())
	}
	// The token is the owner: another client releases it.
	if err := a.Release(ctx, k, lk2.Token()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
		t.Error("Release closed Lost")
	default:
	}
}

func TestInvalidArguments(t *testing.T) {
	c := dialT(t)
	ctx := ctxT(t)
	var se *StatusError
	if _, err := c.Acquire(ctx, "", time.Second); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty key: %v", err)
	}
	if _, err := c.Acquire(ctx, "k", 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero lease: %v", err)
	}
	if _, err := c.Acquire(ctx, strings.Repeat("k", 300), time.Second); !errors.As(err, &se) || se.Status != StatusInvalid || se.DetailName() != "KEY" {
		t.Errorf("key above the server's limit: %v", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Errorf("connection unusable after INVALID: %v", err)
	}
}

// TestConcurrency: hundreds of goroutines on one client, on a few keys: mutual exclusion holds,
// every call completes.
func TestConcurrency(t *testing.T) {
	c := dialT(t)
	ctx := ctxT(t)
	const goroutines, keys, rounds = 300, 8, 3
	var inUse [keys]atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				i := (g + r) % keys
				lk, err := c.Acquire(ctx, key(t, fmt.Sprint(i)), 5*time.Second)
				if err != nil {
					errs <- err
					return
				}
				if n := inUse[i].Add(1); n != 1 {
					errs <- fmt.Errorf("key %d held %d times at once", i, n)
				}
				if g%10 == 0 {
					if err := c.Ping(ctx); err != nil {
						errs <- err
					}
				}
				inUse[i].Add(-1)
				if err := lk.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestFIFO: 50 waiters on one key, queued in a known order, are granted in that order, each with
// a larger token.
func TestFIFO(t *testing.T) {
	holderC, c := dialT(t), dialT(t)
	ctx := ctxT(t)
	k := key(t)
	holder := mustAcquire(t, holderC, k, time.Minute)
	const n = 50
	tokens := make([]uint64, n)
	grants := make(chan int, n)
	errs := make(chan error, n)
	cn := c.currentConn()
	for i := range n {
		go func() {
			lk, err := c.Acquire(ctx, k, time.Minute)
			if err != nil {
				errs <- err
				return
			}
			tokens[i] = lk.Token()
			grants <- i
			if err := lk.Release(ctx); err != nil {
				errs <- err
			}
		}()
		// Requests leave one connection in the order they were queued: wait until this one is
		// queued before starting the next.
		deadline := time.Now().Add(bound)
		for cn.pendingCount() != i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d not queued", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	prev := holder.Token()
	for want := range n {
		select {
		case got := <-grants:
			if got != want {
				t.Fatalf("grant %d went to waiter %d", want, got)
			}
			if tokens[got] <= prev {
				t.Fatalf("waiter %d token %d not above %d", got, tokens[got], prev)
			}
			prev = tokens[got]
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(bound):
			t.Fatalf("waiter %d never granted", want)
		}
	}
}

// TestCancelWhileWaiting: a cancelled Acquire leaves no lock held and no waiter queued: once the
// holder releases, another client's TryAcquire succeeds at once.
func TestCancelWhileWaiting(t *testing.T) {
	a, b, c := dialT(t), dialT(t), dialT(t)
	k := key(t)
	holder := mustAcquire(t, a, k, time.Minute)
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*time.Millisecond+time.Millisecond)
		_, err := b.Acquire(ctx, k, time.Minute)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("cancelled Acquire: %v", err)
		}
	}
	// A cancel racing the grant: release the holder while waiters are being cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	var got *Lock
	done := async(func() (err error) { got, err = b.Acquire(ctx, k, time.Minute); return })
	if err := holder.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := waitErr(t, done); err == nil {
		got.Release(ctxT(t)) // granted before the cancel: the caller owns it
	} else if !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	// Acquire either returned the lock (released above) or context.Canceled after releasing
	// anything it got: the key is free.
	lk, err := c.TryAcquire(ctxT(t), k, time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire after cancelled waiters: %v", err)
	}
	lk.Release(ctxT(t))
}

// TestLostBeforeHandoff: a holder without keep-alive sees Lost no later than the moment the
// server hands the lock to the next waiter.
func TestLostBeforeHandoff(t *testing.T) {
	a, b := dialT(t), dialT(t)
	k := key(t)
	for range 3 {
		holder := mustAcquire(t, a, k, 200*time.Millisecond)
		lk, err := b.Acquire(ctxT(t), k, time.Minute)
		grantedAt := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-holder.Lost():
		default:
			holder.mu.Lock()
			dl := holder.deadline
			holder.mu.Unlock()
			t.Fatalf("the next waiter was granted the lock (%v before the holder's local deadline, after %d ms queued) before the holder's Lost closed",
				dl.Sub(grantedAt), lk.Token())
		}
		holder.mu.Lock()
		lostAt, dl := holder.lostAt, holder.deadline
		holder.mu.Unlock()
		if lostAt.After(grantedAt) || dl.After(grantedAt) {
			t.Fatalf("lost at %v, local deadline %v, next waiter granted at %v", lostAt, dl, grantedAt)
		}
		if !errors.Is(holder.Err(), ErrLockLost) {
			t.Errorf("Err = %v", holder.Err())
		}
		if err := holder.Release(ctxT(t)); !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotHeld) {
			t.Errorf("Release after lost: %v", err)
		}
		if err := holder.Extend(ctxT(t), time.Second); !errors.Is(err, ErrLockLost) {
			t.Errorf("Extend after lost: %v", err)
		}
		if err := lk.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKeepAlive: a short lease stays held across several lease periods, and keep-alive stops at
// Release.
func TestKeepAlive(t *testing.T) {
	a, b := dialT(t), dialT(t)
	k := key(t)
	const lease = 400 * time.Millisecond
	lk := mustAcquire(t, a, k, lease, WithKeepAlive())
	end := time.Now().Add(4 * lease)
	for time.Now().Before(end) {
		select {
		case <-lk.Lost():
			t.Fatalf("lost with keep-alive: %v", lk.Err())
		case <-time.After(lease / 2):
		}
		if _, err := b.TryAcquire(ctxT(t), k, time.Second); !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("TryAcquire while kept alive: %v", err)
		}
	}
	lk.mu.Lock()
	extends, done := lk.extends, lk.kaDone
	lk.mu.Unlock()
	if extends < 3 {
		t.Errorf("%d extends in 4 leases", extends)
	}
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Fatal("keep-alive still running after Release returned")
	}
	lk2, err := b.TryAcquire(ctxT(t), k, time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after Release: %v", err)
	}
	lk2.Release(ctxT(t))
}

// TestKeepAliveFixedInterval: WithKeepAlive(interval) extends at that interval.
func TestKeepAliveFixedInterval(t *testing.T) {
	c := dialT(t)
	lk := mustAcquire(t, c, key(t), time.Minute, WithKeepAlive(20*time.Millisecond))
	deadline := time.Now().Add(bound)
	for {
		lk.mu.Lock()
		n := lk.extends
		lk.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d extends", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestConnectionDrop: calls in flight fail with a retryable ErrConnectionLost; the next call
// reconnects; a held lock with keep-alive survives the reconnects.
func TestConnectionDrop(t *testing.T) {
	proxy := testserver.NewProxy(t, sharedAddr)
	c := dialT(t, WithEndpoints(proxy.Addr), WithBackoff(5*time.Millisecond, 50*time.Millisecond))
	direct := dialT(t)
	k := key(t)
	const lease = 600 * time.Millisecond
	lk := mustAcquire(t, c, k, lease, WithKeepAlive())

	// A waiter in flight when the connection drops.
	waiting := async(func() error {
		_, err := c.Acquire(context.Background(), key(t, "other"), time.Second, WithWaitTimeout(time.Hour))
		return err
	})
	other := mustAcquire(t, direct, key(t, "other"), time.Minute) // may run before or after the waiter queues
	_ = other
	for range 4 {
		proxy.DropConns()
		select {
		case <-lk.Lost():
			t.Fatalf("lost across a reconnect: %v", lk.Err())
		case <-time.After(lease / 2):
		}
	}
	if err := waitErr(t, waiting); err != nil && (!errors.Is(err, ErrConnectionLost) || !IsRetryable(err)) {
		t.Fatalf("waiter on a dropped connection: %v", err)
	}
	if _, err := direct.TryAcquire(ctxT(t), k, time.Second); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("the lock was not kept across reconnects: %v", err)
	}
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	other.Release(ctxT(t))
}

// TestReconnectAfterRestart: the client reconnects to a restarted server (same address and data
// directory); tokens keep growing; the lock held before the restart is gone.
func TestReconnectAfterRestart(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{})
	c, err := Dial(ctxT(t), WithEndpoints(srv.Addr), WithBackoff(10*time.Millisecond, 200*time.Millisecond), WithMaxRetries(20))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	session := c.SessionID()
	lk := mustAcquire(t, c, "restart", time.Minute)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatalf("Ping after restart: %v", err)
	}
	if c.SessionID() != session {
		t.Error("session id changed across a reconnect")
	}
	lk2 := mustAcquire(t, c, "restart", time.Minute)
	if lk2.Token() <= lk.Token() {
		t.Fatalf("token %d after restart, %d before", lk2.Token(), lk.Token())
	}
	if err := lk.Release(ctxT(t)); !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Release of a lock lost in the restart: %v", err)
	}
	if err := lk2.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestCloseFailsWaiters: Close fails calls in flight with ErrClosed and stops keep-alive.
func TestCloseFailsWaiters(t *testing.T) {
	a, b := dialT(t), dialT(t)
	k := key(t)
	holder := mustAcquire(t, a, k, time.Minute)
	kept := mustAcquire(t, b, key(t, "kept"), time.Minute, WithKeepAlive(10*time.Millisecond))
	waiting := async(func() error { _, err := b.Acquire(context.Background(), k, time.Minute); return err })
	deadline := time.Now().Add(bound)
	for b.currentConn().pendingCount() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b.Close()
	if err := waitErr(t, waiting); !errors.Is(err, ErrClosed) {
		t.Fatalf("waiter after Close: %v", err)
	}
	holder.Release(ctxT(t))
	if err := a.Release(ctxT(t), kept.Key(), kept.Token()); err != nil {
		t.Errorf("release of the closed client's lock by token: %v", err)
	}
}

// TestShutdownRetry: a waiter queued when the server shuts down is answered SHUTTING_DOWN; the
// client moves on (here: to the same endpoint, restarted) and retries the request there. A lock
// kept alive across the restart is reported lost (the restarted server does not know it).
func TestShutdownRetry(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{})
	a := func() *Client {
		c, err := Dial(ctxT(t), WithEndpoints(srv.Addr), WithBackoff(20*time.Millisecond, 200*time.Millisecond), WithMaxRetries(30))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	holderC, waiterC := a(), a()
	holder := mustAcquire(t, holderC, "k", time.Minute)
	kept := mustAcquire(t, holderC, "kept", time.Second, WithKeepAlive())
	var got *Lock
	waiting := async(func() (err error) { got, err = waiterC.Acquire(ctxT(t), "k", time.Minute); return })
	deadline := time.Now().Add(bound)
	for waiterC.currentConn().pendingCount() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("waiter not queued")
		}
		time.Sleep(time.Millisecond)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, waiting); err != nil {
		t.Fatalf("waiter across a server restart: %v", err)
	}
	if got.Token() <= holder.Token() {
		t.Errorf("token %d after the restart, %d before", got.Token(), holder.Token())
	}
	select {
	case <-kept.Lost():
		if !errors.Is(kept.Err(), ErrLockLost) {
			t.Errorf("Err = %v", kept.Err())
		}
	case <-time.After(bound):
		t.Fatal("a kept-alive lock unknown to the restarted server was never reported lost")
	}
	got.Release(ctxT(t))
}

// TestBusy: a server limit surfaces as ErrBusy naming the limit; the connection stays usable.
func TestBusy(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{Env: []string{"TICKETING_MAX_WAITERS_PER_KEY=1"}})
	c, err := Dial(ctxT(t), WithEndpoints(srv.Addr), WithMaxRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	holder := mustAcquire(t, c, "k", time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := async(func() error { _, err := c.Acquire(ctx, "k", time.Minute); return err })
	deadline := time.Now().Add(bound)
	for c.currentConn().pendingCount() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("waiter not queued")
		}
		time.Sleep(time.Millisecond)
	}
	_, err = c.Acquire(ctxT(t), "k", time.Minute)
	var se *StatusError
	if !errors.Is(err, ErrBusy) || !IsRetryable(err) || !errors.As(err, &se) || se.DetailName() != "WAITERS_PER_KEY" {
		t.Fatalf("second waiter: %v", err)
	}
	cancel()
	if err := waitErr(t, waiting); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := holder.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestInspect: INSPECT reports the holder's token, the lease left, the time held and the waiters.
func TestInspect(t *testing.T) {
	a, b := dialT(t), dialT(t)
	ctx := ctxT(t)
	k := key(t)
	if info, err := a.Inspect(ctx, k); err != nil || info != (KeyInfo{Key: k}) {
		t.Fatalf("free key: %v %+v", err, info)
	}
	lk := mustAcquire(t, a, k, time.Minute)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waiting := async(func() error { _, err := b.Acquire(wctx, k, time.Minute); return err })
	deadline := time.Now().Add(bound)
	for {
		info, err := a.Inspect(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Held || info.Token != lk.Token() || info.LeaseLeft > time.Minute || info.LeaseLeft < 50*time.Second || info.HeldFor > 10*time.Second {
			t.Fatalf("held key: %+v (token %d)", info, lk.Token())
		}
		if info.Waiters == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiter never reported: %+v", info)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := waitErr(t, waiting); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	lk.Release(ctx)
}
