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

// Integration tests against the real server on 127.0.0.1: the shared one from TestMain, or one
// of their own when they need a configuration or restart it. TICKETING_BIN names the server
// binary (default: built from this checkout). Every wait is bounded.

// startServer starts a server of the test's own.
func startServer(t *testing.T, cfg testserver.Config) *testserver.Server {
	t.Helper()
	cfg.Bin = os.Getenv("TICKETING_BIN")
	return testserver.Start(t, cfg)
}

func dialT(t *testing.T, opts ...Option) *Client {
	t.Helper()
	c, err := Dial(ctxT(t), append([]Option{WithEndpoints(sharedAddr)}, opts...)...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
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

// waitFor polls cond every millisecond until it holds, failing the test after bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waiters is INSPECT's count of acquires queued on k.
func waiters(t *testing.T, c *Client, k string) int {
	t.Helper()
	info, err := c.Inspect(ctxT(t), k)
	if err != nil {
		t.Fatal(err)
	}
	return info.Waiters
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

func TestAuth(t *testing.T) {
	srv := startServer(t, testserver.Config{Token: "s3cret"})
	ctx := ctxT(t)
	c, err := Dial(ctx, WithEndpoints(srv.Addr), WithToken("s3cret"))
	if err != nil {
		t.Fatalf("right token: %v", err)
	}
	defer c.Close()
	lk := mustAcquire(t, c, "k", time.Minute)
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
		{"server without auth", sharedAddr, []Option{WithToken("s3cret")}, "does not require a token"},
	} {
		start := time.Now()
		_, err := Dial(ctx, append([]Option{WithEndpoints(tc.addr, tc.addr)}, tc.opts...)...)
		if !errors.Is(err, ErrAuthFailed) || IsRetryable(err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v", tc.name, err)
		}
		checkMessage(t, err)
		if time.Since(start) > 2*time.Second {
			t.Errorf("%s: auth failure took %v (retried?)", tc.name, time.Since(start))
		}
	}
}

func tlsConfig(t *testing.T, caFile, certFile, keyFile string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("no CA certificate")
	}
	cfg := &tls.Config{RootCAs: pool}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// TestTLS: TLS with the server verified by a CA; the mismatches (TLS to a plaintext server and
// back, an untrusted server) fail promptly with a message that says what is wrong; mutual TLS
// accepts only a client certificate from the server's client CA.
func TestTLS(t *testing.T) {
	files, err := testserver.GenerateTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, testserver.Config{TLSCert: files.ServerCert, TLSKey: files.ServerKey, Token: "tls-token"})
	ctx := ctxT(t)
	c, err := Dial(ctx, WithEndpoints(srv.Addr), WithTLS(tlsConfig(t, files.CA, "", "")), WithToken("tls-token"))
	if err != nil {
		t.Fatalf("TLS dial: %v", err)
	}
	defer c.Close()
	lk := mustAcquire(t, c, "k", time.Minute)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		addr string
		opts []Option
		kind error
		msg  string
	}{
		{"untrusted server", srv.Addr, []Option{WithTLS(&tls.Config{RootCAs: x509.NewCertPool()})}, ErrTLS, "unknown authority"},
		{"TLS to a plaintext server", sharedAddr, []Option{WithTLS(tlsConfig(t, files.CA, "", ""))}, ErrTLS, "is the server using TLS?"},
		{"plaintext to a TLS server", srv.Addr, nil, ErrUnavailable, "is the server using TLS?"},
	} {
		start := time.Now()
		_, err := Dial(ctx, append([]Option{WithEndpoints(tc.addr), WithToken("tls-token"), WithDialTimeout(2 * time.Second)}, tc.opts...)...)
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) || time.Since(start) > 3*time.Second {
			t.Errorf("%s: %v after %v", tc.name, err, time.Since(start))
		}
		checkMessage(t, err)
	}

	mtls := startServer(t, testserver.Config{TLSCert: files.ServerCert, TLSKey: files.ServerKey, TLSClientCA: files.ClientCA})
	m, err := Dial(ctx, WithEndpoints(mtls.Addr), WithTLS(tlsConfig(t, files.CA, files.ClientCert, files.ClientKey)))
	if err != nil {
		t.Fatalf("mutual TLS with the client certificate: %v", err)
	}
	if err := m.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	m.Close()
	for name, cfg := range map[string]*tls.Config{
		"no client certificate":            tlsConfig(t, files.CA, "", ""),
		"certificate from another CA":      tlsConfig(t, files.CA, files.OtherClientCert, files.OtherClientKey),
		"plaintext to a mutual TLS server": nil,
	} {
		start := time.Now()
		_, err := Dial(ctx, WithEndpoints(mtls.Addr), WithTLS(cfg), WithDialTimeout(2*time.Second))
		if err == nil || time.Since(start) > 3*time.Second || (cfg != nil && !errors.Is(err, ErrTLS)) {
			t.Errorf("%s: %v after %v", name, err, time.Since(start))
		}
		checkMessage(t, err)
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
	if got, err := b.TryAcquire(ctx, k, time.Minute); got != nil || err != nil {
		t.Fatalf("TryAcquire of a held key: %v %v", got, err)
	}
	if _, err := b.Acquire(ctx, k, time.Minute, WithWaitTimeout(0)); !errors.Is(err, ErrNotAcquired) || !strings.Contains(err.Error(), "the key is taken") {
		t.Fatalf("Acquire with wait 0: %v", err)
	}
	start := time.Now()
	_, err := b.Acquire(ctx, k, time.Minute, WithWaitTimeout(300*time.Millisecond))
	if !errors.Is(err, ErrNotAcquired) || time.Since(start) < 300*time.Millisecond || !strings.Contains(err.Error(), "within 300ms") {
		t.Fatalf("Acquire with a wait timeout: %v after %v", err, time.Since(start))
	}
	checkMessage(t, err)
	if n := waiters(t, a, k); n != 0 {
		t.Fatalf("%d waiters after the wait timeout", n)
	}
	if err := lk.Extend(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := time.Until(lk.Deadline()); d < 110*time.Second || lk.Lease() != 2*time.Minute {
		t.Errorf("deadline after Extend in %v, lease %v", d, lk.Lease())
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
	if err != nil || lk2 == nil || lk2.Token() <= lk.Token() {
		t.Fatalf("TryAcquire after release: %v %v", lk2, err)
	}
	// The token is the owner: another client releases it; the owner's Release then reports
	// the lock lost (not held), and Lost fires once.
	if err := a.Release(ctx, k, lk2.Token()); err != nil {
		t.Fatal(err)
	}
	var le *LockLostError
	if err := lk2.Release(ctx); !errors.As(err, &le) || le.Reason != ReasonNotHeld || !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Release of a lock released by its token elsewhere: %v", err)
	}
	waitLost(t, lk2, ReasonNotHeld)
	select {
	case <-lk.Lost():
		t.Error("Release closed Lost")
	default:
	}
}

// TestInspectAndVerify: the holder's token is shown to the holding session only; Verify asks
// with the token.
func TestInspectAndVerify(t *testing.T) {
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
	waitFor(t, "the waiter is queued", func() bool { return waiters(t, a, k) == 1 })
	mine, err := a.Inspect(ctx, k)
	if err != nil || !mine.Held || !mine.Mine || mine.Token != lk.Token() || mine.LeaseLeft > time.Minute || mine.LeaseLeft < 50*time.Second || mine.Waiters != 1 {
		t.Fatalf("holder's view: %+v %v", mine, err)
	}
	other, err := b.Inspect(ctx, k)
	if err != nil || !other.Held || other.Mine || other.Token != 0 || other.Waiters != 1 {
		t.Fatalf("another session's view: %+v %v (the token must be hidden)", other, err)
	}
	if ok, err := b.Verify(ctx, k, lk.Token()); !ok || err != nil {
		t.Fatalf("Verify with the holder's token: %v %v", ok, err)
	}
	if ok, err := lk.Verify(ctx); !ok || err != nil {
		t.Fatalf("Lock.Verify: %v %v", ok, err)
	}
	cancel()
	if err := waitErr(t, waiting); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := b.Release(ctx, k, lk.Token()); err != nil {
		t.Fatal(err)
	}
	if ok, err := lk.Verify(ctx); ok || err != nil {
		t.Fatalf("Verify after a release by token: %v %v", ok, err)
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

// TestFIFO: 30 waiters on one key, queued in a known order, are granted in that order, each
// with a larger token.
func TestFIFO(t *testing.T) {
	holderC, c := dialT(t), dialT(t)
	ctx := ctxT(t)
	k := key(t)
	holder := mustAcquire(t, holderC, k, time.Minute)
	const n = 30
	tokens := make([]uint64, n)
	grants := make(chan int, n)
	errs := make(chan error, n)
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
		// Wait until this one is queued before starting the next.
		waitFor(t, fmt.Sprintf("waiter %d queued", i), func() bool { return waiters(t, holderC, k) == i+1 })
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

// TestCancelWhileWaiting: a cancelled Acquire leaves no lock held and no waiter queued, also when
// the cancel races the grant.
func TestCancelWhileWaiting(t *testing.T) {
	a, b, c := dialT(t), dialT(t), dialT(t)
	k := key(t)
	holder := mustAcquire(t, a, k, time.Minute)
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*time.Millisecond+time.Millisecond)
		_, err := b.Acquire(ctx, k, time.Minute)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrCancelled) {
			t.Fatalf("cancelled Acquire: %v", err)
		}
	}
	if n := waiters(t, c, k); n != 0 {
		t.Fatalf("%d waiters left by cancelled acquires", n)
	}
	for i := range 20 {
		// A lease shorter than the cancel delay: the grant races the cancel.
		ctx, cancel := context.WithCancel(context.Background())
		var got *Lock
		done := async(func() (err error) { got, err = b.Acquire(ctx, k, time.Minute); return })
		if i == 0 {
			if err := holder.Release(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		} else {
			h := mustAcquire(t, a, key(t, "other"), time.Minute) // some traffic in between
			h.Release(ctxT(t))
		}
		time.Sleep(time.Duration(i%4) * time.Millisecond)
		cancel()
		if err := waitErr(t, done); err == nil {
			got.Release(ctxT(t)) // granted before the cancel: the caller owns it
		} else if !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		lk, err := c.TryAcquire(ctxT(t), k, time.Minute)
		if err != nil || lk == nil {
			t.Fatalf("round %d: key not free after a cancelled acquire: %v", i, err)
		}
		lk.Release(ctxT(t))
	}
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
			t.Fatalf("the next waiter was granted the lock %v before the holder's local deadline, and Lost is open", holder.Deadline().Sub(grantedAt))
		}
		if dl := holder.Deadline(); dl.After(grantedAt) {
			t.Fatalf("local deadline %v after the next grant", dl.Sub(grantedAt))
		}
		var le *LockLostError
		if !errors.As(holder.Err(), &le) || le.Reason != ReasonExpired || le.Token != holder.Token() || le.Key != k {
			t.Errorf("Err = %v", holder.Err())
		}
		if err := holder.Release(ctxT(t)); !errors.Is(err, ErrLockLost) {
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
	// 1 s: a 400 ms lease left a loaded machine (two CPU hogs beside the race detector) too little
	// room for a stalled extend (see TestKeepAliveAndMaxHold).
	const lease = time.Second
	lk := mustAcquire(t, a, k, lease, WithKeepAlive())
	end := time.Now().Add(3 * lease)
	for time.Now().Before(end) {
		select {
		case <-lk.Lost():
			t.Fatalf("lost with keep-alive: %v", lk.Err())
		case <-time.After(lease / 2):
		}
		if got, err := b.TryAcquire(ctxT(t), k, time.Second); got != nil || err != nil {
			t.Fatalf("TryAcquire while kept alive: %v %v", got, err)
		}
	}
	lk.mu.Lock()
	extends, done := lk.extends, lk.kaDone
	lk.mu.Unlock()
	if extends < 3 {
		t.Errorf("%d extends in 3 leases", extends)
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
	if err != nil || lk2 == nil {
		t.Fatalf("TryAcquire after Release: %v", err)
	}
	lk2.Release(ctxT(t))
}

// TestWithLock: the scoped helper releases after the body, and reports a lock lost during it
// (the body's context is cancelled with the loss).
func TestWithLock(t *testing.T) {
	c := dialT(t)
	k := key(t)
	var token uint64
	err := c.WithLock(ctxT(t), k, 2*time.Second, func(ctx context.Context, lk *Lock) error {
		token = lk.Token()
		return nil
	})
	if err != nil || token == 0 {
		t.Fatalf("WithLock: %v", err)
	}
	if info, _ := c.Inspect(ctxT(t), k); info.Held {
		t.Fatal("not released after the body")
	}
	start := time.Now()
	err = c.WithLock(ctxT(t), k, 300*time.Millisecond, func(ctx context.Context, lk *Lock) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(900 * time.Millisecond):
			return nil
		}
	})
	var le *LockLostError
	if !errors.As(err, &le) || le.Reason != ReasonExpired || time.Since(start) > 800*time.Millisecond {
		t.Fatalf("WithLock losing its lease: %v after %v", err, time.Since(start))
	}
	checkMessage(t, err)
	// A body error is returned as is.
	boom := errors.New("boom")
	if err := c.WithLock(ctxT(t), k, time.Second, func(context.Context, *Lock) error { return boom }); err != boom {
		t.Fatalf("WithLock with a failing body: %v", err)
	}
}

// TestConcurrentReleaseReal: racing Release calls all succeed and Lost stays open.
func TestConcurrentReleaseReal(t *testing.T) {
	c := dialT(t)
	for i := range 20 {
		lk := mustAcquire(t, c, key(t, fmt.Sprint(i)), time.Minute)
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- lk.Release(ctxT(t)) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
		select {
		case <-lk.Lost():
			t.Fatalf("round %d: Lost closed after a successful release: %v", i, lk.Err())
		default:
		}
	}
}

// TestRefuseHeldReal: a second acquire of a held key by the same client queues behind it by
// default, and is refused at once with WithRefuseHeld.
func TestRefuseHeldReal(t *testing.T) {
	c := dialT(t)
	k := key(t)
	lk := mustAcquire(t, c, k, time.Minute)
	if _, err := c.Acquire(ctxT(t), k, time.Minute, WithRefuseHeld()); !errors.Is(err, ErrAlreadyHeld) {
		t.Fatalf("refuse held: %v", err)
	}
	if n := waiters(t, c, k); n != 0 {
		t.Fatalf("%d queued after a refused acquire", n)
	}
	if _, err := c.Acquire(ctxT(t), k, time.Minute, WithWaitTimeout(50*time.Millisecond)); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("self-acquire without refuse: %v", err)
	}
	lk.Release(ctxT(t))
}

// TestResumeKeepsQueuePlace: a waiter whose connection is cut resumes its session and keeps its
// place in the queue; a held lock is not lost.
func TestResumeKeepsQueuePlace(t *testing.T) {
	proxy := testserver.NewProxy(t, sharedAddr)
	direct := dialT(t)
	k := key(t)
	holder := mustAcquire(t, direct, k, time.Minute)
	var clients []*Client
	for range 3 {
		clients = append(clients, dialT(t, WithEndpoints(proxy.Addr), WithBackoff(5*time.Millisecond, 50*time.Millisecond)))
	}
	kept := mustAcquire(t, clients[2], key(t, "kept"), 2*time.Second, WithKeepAlive())
	order := make(chan int, len(clients))
	errs := make(chan error, len(clients))
	for i, c := range clients {
		go func() {
			lk, err := c.Acquire(ctxT(t), k, time.Minute)
			if err != nil {
				errs <- err
				return
			}
			order <- i
			lk.Release(ctxT(t))
		}()
		waitFor(t, "queued", func() bool { return waiters(t, direct, k) == i+1 })
	}
	proxy.DropConns()
	// Every client reconnects and resumes; the queue is unchanged.
	waitFor(t, "reconnected", func() bool { return len(proxy.Open()) == len(clients) && len(proxy.Conns()) == 2*len(clients) })
	if n := waiters(t, direct, k); n != len(clients) {
		t.Fatalf("%d waiters after the reconnect", n)
	}
	if err := holder.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for want := range clients {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("grant %d went to waiter %d", want, got)
			}
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(bound):
			t.Fatal("waiter never granted")
		}
	}
	select {
	case <-kept.Lost():
		t.Fatalf("kept-alive lock lost across a reconnect: %v", kept.Err())
	default:
	}
	if err := kept.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestRetriedAcquireIsIdempotent: an ACQUIRE whose answer is lost with the connection is retried
// on the next one and answered from the lock table: the same token, no second grant.
func TestRetriedAcquireIsIdempotent(t *testing.T) {
	proxy := testserver.NewProxy(t, sharedAddr)
	direct := dialT(t)
	c := dialT(t, WithEndpoints(proxy.Addr), WithBackoff(5*time.Millisecond, 50*time.Millisecond))
	k := key(t)
	conns := proxy.Open()
	if len(conns) != 1 {
		t.Fatalf("%d proxied connections", len(conns))
	}
	conns[0].HoldServerBytes()
	var lk *Lock
	acq := async(func() (err error) { lk, err = c.Acquire(ctxT(t), k, time.Minute); return })
	waitFor(t, "granted on the server", func() bool {
		info, err := direct.Inspect(ctxT(t), k)
		return err == nil && info.Held
	})
	conns[0].Reset()
	if err := waitErr(t, acq); err != nil {
		t.Fatalf("Acquire across a lost answer: %v", err)
	}
	if ok, err := direct.Verify(ctxT(t), k, lk.Token()); !ok || err != nil {
		t.Fatalf("the token the retry returned does not hold the key: %v %v", ok, err)
	}
	if err := lk.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	next := mustAcquire(t, direct, k, time.Minute)
	if next.Token() != lk.Token()+1 {
		t.Errorf("token %d after %d: a grant happened in between", next.Token(), lk.Token())
	}
	next.Release(ctxT(t))
}

// TestRestartFiresLost is issue 7's must-show for Go: with TICKETING_STARTUP_GRACE=0, after a
// restart the client reports its lock lost with reason "server restarted" on reconnect; a queued
// acquire fails and is not re-queued; no operation on the old lock succeeds.
func TestRestartFiresLost(t *testing.T) {
	for _, how := range []string{"SIGKILL", "SIGTERM"} {
		t.Run(how, func(t *testing.T) {
			srv := startServer(t, testserver.Config{Env: []string{"TICKETING_STARTUP_GRACE=0"}})
			opts := []Option{WithEndpoints(srv.Addr), WithBackoff(10*time.Millisecond, 100*time.Millisecond)}
			a, err := Dial(ctxT(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := Dial(ctxT(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			held := mustAcquire(t, a, "k", 10*time.Second, WithKeepAlive())
			holder2 := mustAcquire(t, a, "k2", time.Minute)
			var got *Lock
			queued := async(func() (err error) { got, err = b.Acquire(context.Background(), "k2", time.Minute); return })
			waitFor(t, "queued", func() bool { return waiters(t, a, "k2") == 1 })
			session := a.SessionID()

			if how == "SIGKILL" {
				srv.Kill()
			} else if err := srv.Stop(); err != nil {
				t.Logf("stop: %v", err)
			}
			if err := srv.Respawn(); err != nil {
				t.Fatal(err)
			}
			want := ReasonServerRestarted
			if how == "SIGTERM" {
				want = ReasonServerStopping // told before the stop
			}
			start := time.Now()
			waitLost(t, held, want)
			waitLost(t, holder2, want)
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("lost %v after the restart", d)
			}
			err = waitErr(t, queued)
			if got != nil || (!errors.Is(err, ErrServerRestarted) && !(how == "SIGTERM" && errors.Is(err, ErrShuttingDown))) {
				t.Fatalf("queued acquire across the restart: %v", err)
			}
			c, err := Dial(ctxT(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if n := waiters(t, c, "k2"); n != 0 {
				t.Fatalf("the queued acquire was re-queued on the new server (%d waiters)", n)
			}
			// No operation on the old lock succeeds.
			if err := held.Extend(ctxT(t), time.Minute); !errors.Is(err, ErrLockLost) {
				t.Errorf("Extend: %v", err)
			}
			if err := held.Release(ctxT(t)); !errors.Is(err, ErrLockLost) {
				t.Errorf("Release: %v", err)
			}
			if ok, err := held.Verify(ctxT(t)); ok || err != nil {
				t.Errorf("Verify: %v %v", ok, err)
			}
			// The key is free at once for a new client; the old one works on with a new session.
			lk, err := c.TryAcquire(ctxT(t), "k", time.Minute)
			if err != nil || lk == nil || lk.Token() <= held.Token() {
				t.Fatalf("a new client on the restarted server: %v %v", lk, err)
			}
			waitFor(t, "a new session after the restart", func() bool { return a.SessionID() != session })
			if err := a.Ping(ctxT(t)); err != nil {
				t.Fatalf("the old client after the restart: %v", err)
			}
		})
	}
}

// TestFrozenServer: with the server frozen (SIGSTOP), every call fails with ErrTimeout within
// the request timeout (an acquire: its wait plus the request timeout), and Close is prompt.
func TestFrozenServer(t *testing.T) {
	srv := startServer(t, testserver.Config{})
	c, err := Dial(ctxT(t), WithEndpoints(srv.Addr), WithRequestTimeout(500*time.Millisecond), WithHeartbeat(200*time.Millisecond), WithDialTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer srv.Thaw()
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"ping":    func() error { return c.Ping(ctx) },
		"inspect": func() error { _, err := c.Inspect(ctx, "k"); return err },
		"release": func() error { return c.Release(ctx, "k", 1) },
		"acquire": func() error {
			_, err := c.Acquire(ctx, "k", time.Second, WithWaitTimeout(100*time.Millisecond))
			return err
		},
	} {
		start := time.Now()
		err := waitErr(t, async(call))
		if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrConnectionLost) && !errors.Is(err, ErrUnavailable) || time.Since(start) > 3*time.Second {
			t.Errorf("%s on a frozen server: %v after %v", name, err, time.Since(start))
		}
		checkMessage(t, err)
	}
	start := time.Now()
	c.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v", d)
	}
}

// TestBusy: a server limit surfaces as ErrBusy naming the limit; the connection stays usable.
func TestBusy(t *testing.T) {
	srv := startServer(t, testserver.Config{Env: []string{"TICKETING_MAX_WAITERS_PER_KEY=1"}})
	c, err := Dial(ctxT(t), WithEndpoints(srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	holder := mustAcquire(t, c, "k", time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := async(func() error { _, err := c.Acquire(ctx, "k", time.Minute); return err })
	waitFor(t, "queued", func() bool { return waiters(t, c, "k") == 1 })
	_, err = c.Acquire(ctxT(t), "k", time.Minute)
	var se *StatusError
	if !errors.Is(err, ErrBusy) || !IsRetryable(err) || !errors.As(err, &se) || se.DetailName() != "WAITERS_PER_KEY" {
		t.Fatalf("second waiter: %v", err)
	}
	checkMessage(t, err)
	cancel()
	if err := waitErr(t, waiting); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := holder.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// A key above the server's limit is the server's INVALID/KEY.
	if _, err := c.Acquire(ctxT(t), strings.Repeat("k", 300), time.Second); !errors.As(err, &se) || se.DetailName() != "KEY" {
		t.Errorf("key above the server's limit: %v", err)
	}
}

// TestReleaseOnCloseReal: WithReleaseOnClose releases what the client holds; the default leaves
// it held.
func TestReleaseOnCloseReal(t *testing.T) {
	observer := dialT(t)
	k1, k2 := key(t, "1"), key(t, "2")
	c1, err := Dial(ctxT(t), WithEndpoints(sharedAddr), WithReleaseOnClose())
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, c1, k1, time.Minute)
	c1.Close()
	if info, _ := observer.Inspect(ctxT(t), k1); info.Held {
		t.Error("WithReleaseOnClose: still held after Close")
	}
	c2, err := Dial(ctxT(t), WithEndpoints(sharedAddr))
	if err != nil {
		t.Fatal(err)
	}
	lk := mustAcquire(t, c2, k2, time.Minute)
	c2.Close()
	if info, _ := observer.Inspect(ctxT(t), k2); !info.Held {
		t.Error("default Close released the lock")
	}
	observer.Release(ctxT(t), k2, lk.Token())
}
