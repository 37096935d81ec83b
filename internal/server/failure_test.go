package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/store"
	"github.com/ticketing/ticketing/wire"
)

// A connection that sent a frame the server cannot trust is doomed at once: detached in the same
// critical section, so a hand-off never goes to it while it drains.
func TestDoomedByBadFrameIsNeverGranted(t *testing.T) {
	ts := startServer(t, nil) // grace 0: the doomed session ends at its detach
	h := connect(t, ts.addr, "")
	g := h.roundTrip(acquire(1, "k", 60000, 0))
	bad := connect(t, ts.addr, "")
	bad.send(acquire(1, "k", 60000, wire.WaitForever))
	good := connect(t, ts.addr, "")
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 1 })
	good.send(acquire(1, "k", 60000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 2 })
	bad.write([]byte{0, 0, 0, 5, 1, 2, 3, 4, 5}) // a length below the header: INVALID/LENGTH, then a drain of up to 1 s
	if r := bad.recv(); r.Status != wire.StatusInvalid || r.Detail != wire.FieldLength {
		t.Fatalf("bad frame: %+v", r)
	}
	waitFor(t, time.Second, "doomed waiter dropped", func() bool { return ts.waiters() == 1 })
	start := time.Now()
	h.roundTrip(release(2, "k", g.Token))
	if r := good.recv(); r.Status != wire.StatusOK || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("live waiter: %+v after %v", r, time.Since(start))
	}
}

// A slow consumer is closed at once — its socket too — and never handed a lock.
func TestSlowConsumerClosedAtOnceAndNeverGranted(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxOutput = 64 << 10; c.WriteTimeout = time.Second })
	h := connect(t, ts.addr, "")
	g := h.roundTrip(acquire(1, "k", 60000, 0))
	slow := connect(t, ts.addr, "")
	slow.send(acquire(1, "k", 60000, wire.WaitForever))
	good := connect(t, ts.addr, "")
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 1 })
	good.send(acquire(1, "k", 60000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 2 })
	// The slow client sends INSPECTs and reads nothing: its answers pile up.
	if tc, ok := slow.nc.(*net.TCPConn); ok {
		tc.SetReadBuffer(4 << 10)
	}
	var frames []byte
	for i := 0; i < 40000; i++ {
		frames = wire.AppendRequest(frames, &wire.Request{Op: wire.OpInspect, ID: uint64(i + 2), Key: []byte("k")})
	}
	go func() {
		slow.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		slow.nc.Write(frames)
	}()
	waitFor(t, 10*time.Second, "slow consumer dropped", func() bool { return ts.waiters() == 1 })
	start := time.Now()
	h.roundTrip(release(2, "k", g.Token))
	if r := good.recv(); r.Status != wire.StatusOK || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("live waiter: %+v after %v", r, time.Since(start))
	}
	// Its socket was closed at once: what it reads ends (RST or EOF) within a second, not after
	// the write timeout.
	slow.nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1<<20)
	var err error
	for err == nil {
		_, err = slow.nc.Read(buf)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the slow consumer's socket is still open")
	}
}

// With the data directory failing, grants that need storage get BUSY/STORAGE (or wait), while
// PING, RELEASE, INSPECT and new handshakes keep working; once it works again, a stalled key is
// handed off in order; Shutdown returns within its timeout.
func TestFailingStorageKeepsServing(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.TokenBlock = 4 })
	h := connect(t, ts.addr, "")
	g := h.roundTrip(acquire(1, "held", 60000, 0))
	if g.Status != wire.StatusOK {
		t.Fatal(g.Status)
	}
	var failing atomic.Bool
	failing.Store(true)
	var attempts atomic.Int64
	ts.Store().SetPersistHook(func(st *store.State) error {
		attempts.Add(1)
		if failing.Load() {
			return errors.New("disk on fire")
		}
		return nil
	})
	// Use up the reserved block and the horizon: further grants need a write.
	id := uint64(1)
	next := func() uint64 { id++; return id }
	sawBusy := false
	for i := 0; i < 20 && !sawBusy; i++ {
		r := h.roundTrip(acquire(next(), "t"+string(rune('a'+i)), 60000, 0))
		if r.Status == wire.StatusBusy && r.Detail == wire.LimitStorage {
			sawBusy = true
		} else if r.Status != wire.StatusOK {
			t.Fatalf("try %d: %+v", i, r)
		}
	}
	if !sawBusy {
		t.Fatal("never BUSY/STORAGE with storage failing")
	}
	// A waiting ACQUIRE of a free key that needs storage waits for it (bounded by its own
	// wait), as a queued hand-off does: only a try-once acquire is refused BUSY/STORAGE.
	fw := connect(t, ts.addr, "")
	fw.send(acquire(1, "fresh", 60000, wire.WaitForever))
	waitFor(t, 5*time.Second, "the fresh key's acquire queued", func() bool { return ts.waiters() == 1 })
	if r, err := fw.recvWithin(300 * time.Millisecond); err == nil {
		t.Fatalf("a waiting acquire with storage failing: %+v, want it to wait", r)
	}
	// Everything that needs no storage works.
	if r := h.roundTrip(wire.Request{Op: wire.OpPing, ID: next()}); r.Status != wire.StatusOK {
		t.Fatal("ping")
	}
	if r := h.roundTrip(wire.Request{Op: wire.OpInspect, ID: next(), Key: []byte("held")}); r.Status != wire.StatusOK {
		t.Fatal("inspect")
	}
	w := connect(t, ts.addr, "") // a new handshake
	w.send(acquire(1, "held", 60000, wire.WaitForever))
	// Two waiters: the fresh key's (waiting for storage) and this one (behind the holder). A
	// busy machine applies them late: waiting for one was satisfied by the first alone.
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 2 })
	if r := h.roundTrip(release(next(), "held", g.Token)); r.Status != wire.StatusOK {
		t.Fatalf("release with storage failing: %v", r.Status)
	}
	// The hand-off needs a new token: the key stalls with its queue intact...
	if r, err := w.recvWithin(300 * time.Millisecond); err == nil {
		t.Fatalf("granted without durable storage: %+v", r)
	}
	if info, ok := ts.inspect("held"); !ok || info.Held {
		t.Fatalf("stalled key: %+v", info)
	}
	// ...and resumes once storage works.
	failing.Store(false)
	if r := w.recv(); r.Status != wire.StatusOK || r.ID != 1 || r.Token <= g.Token {
		t.Fatalf("after storage recovered: %+v", r)
	}
	if r := fw.recv(); r.Status != wire.StatusOK || r.ID != 1 {
		t.Fatalf("the waiting acquire of a free key after storage recovered: %+v", r)
	}
	if attempts.Load() < 2 {
		t.Fatal("no retry of the failing write")
	}
	failing.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	ts.Shutdown(ctx)
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("shutdown took %v with storage failing", el)
	}
}

// A slow disk never stalls the server: PING and handshakes are answered while a write hangs.
func TestSlowStorageDoesNotStallServer(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.TokenBlock = 2 })
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	ts.Store().SetPersistHook(func(st *store.State) error { <-release; return nil })
	h := connect(t, ts.addr, "")
	h.send(acquire(1, "a", 60000, 0))
	h.send(acquire(2, "b", 60000, 0))
	h.send(acquire(3, "c", 60000, 0)) // beyond the block: waits for the hung write
	for i := 0; i < 10; i++ {
		start := time.Now()
		p := connect(t, ts.addr, "")
		if r := p.roundTrip(wire.Request{Op: wire.OpPing, ID: 1}); r.Status != wire.StatusOK || time.Since(start) > time.Second {
			t.Fatalf("ping during a hung write: %v after %v", r.Status, time.Since(start))
		}
	}
	once.Do(func() { close(release) })
}

// The acquires that waited for a horizon write are all granted once it lands, in the order
// they came, when there are more of them than one step of the hand-off (ceilingStep): the steps
// route every answer, and ask storage for nothing more while they run.
func TestStalledBurstGrantedInSteps(t *testing.T) {
	const conns, each = 4, 2 * ceilingStep / 3 // 680 in all, more than two steps
	ts := startServer(t, nil)
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	var writes atomic.Int32
	ts.Store().SetPersistHook(func(st *store.State) error {
		writes.Add(1)
		<-release
		return nil
	})
	cs := make([]*rawClient, conns)
	for i := range cs {
		cs[i] = connect(t, ts.addr, "")
		var frames []byte
		for k := 0; k < each; k++ {
			// A lease past any horizon written at start: every grant waits for the hung write.
			frames = wire.AppendRequest(frames, &wire.Request{Op: wire.OpAcquire, ID: uint64(k + 1),
				Key: []byte(fmt.Sprintf("burst-%d-%d", i, k)), Lease: 600000, WaitMs: wire.WaitForever})
		}
		cs[i].write(frames)
	}
	waitFor(t, 5*time.Second, "every acquire waiting for storage", func() bool { return ts.waiters() == conns*each })
	if _, err := cs[0].recvWithin(50 * time.Millisecond); err == nil {
		t.Fatal("an answer before the horizon write landed")
	}
	before := writes.Load()
	once.Do(func() { close(release) })
	tokens := map[uint64]bool{}
	for i, c := range cs {
		for k := 0; k < each; k++ {
			r := c.recv()
			if r.Op != wire.OpAcquire || r.Status != wire.StatusOK || r.ID != uint64(k+1) {
				t.Fatalf("connection %d, answer %d: %+v, want the grant of request %d", i, k, r, k+1)
			}
			if tokens[r.Token] {
				t.Fatalf("token %d granted twice", r.Token)
			}
			tokens[r.Token] = true
		}
	}
	// One write for the burst (a second may follow for the lease horizon ahead, not one per step).
	if extra := writes.Load() - before; extra > 2 {
		t.Errorf("%d writes after the burst's: the steps asked storage for more", extra)
	}
}

// Shutdown is bounded by its context even when a client reads nothing.
func TestShutdownBoundedWithStuckClient(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.WriteTimeout = time.Minute })
	stuck := connect(t, ts.addr, "")
	if tc, ok := stuck.nc.(*net.TCPConn); ok {
		tc.SetReadBuffer(4 << 10)
	}
	var frames []byte
	for i := 0; i < 20000; i++ {
		frames = wire.AppendRequest(frames, &wire.Request{Op: wire.OpInspect, ID: uint64(i + 1), Key: []byte("k")})
	}
	go stuck.nc.Write(frames)
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	ts.Shutdown(ctx)
	if el := time.Since(start); el > 2500*time.Millisecond {
		t.Fatalf("shutdown took %v (bound 1s)", el)
	}
}

// Output to a doomed connection is dropped: the cap is hard.
func TestOutputCapIsHard(t *testing.T) {
	ts := startServer(t, nil)
	c := connect(t, ts.addr, "")
	var cn *conn
	ts.mu.Lock()
	for _, x := range ts.conns {
		cn = x
	}
	ts.mu.Unlock()
	cn.mu.Lock()
	cn.state = outFailed
	cn.mu.Unlock()
	ts.mu.Lock()
	queued := cn.push(&wire.Response{Op: wire.OpExpired, Token: 1, Data: []byte("k")}, false)
	ts.mu.Unlock()
	if queued {
		t.Fatal("a push was queued on a failed connection")
	}
	cn.mu.Lock()
	n := len(cn.out)
	cn.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d bytes queued on a failed connection", n)
	}
	_ = c
}

// Wrong-token handshakes from one address slow down; a legitimate client from the same address
// is not slowed.
func TestAuthFailureBackoff(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.Tokens = []string{"right"} })
	stop := time.Now().Add(2 * time.Second)
	var attempts atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				nc, err := net.DialTimeout("tcp", ts.addr, time.Second)
				if err != nil {
					continue
				}
				nc.SetDeadline(stop.Add(3 * time.Second))
				handshakeQuiet(nc, "wrong")
				nc.Close()
				attempts.Add(1)
			}
		}()
	}
	// Meanwhile a legitimate client connects again and again, quickly.
	var worst time.Duration
	for time.Now().Before(stop) {
		start := time.Now()
		c := connect(t, ts.addr, "right")
		worst = max(worst, time.Since(start))
		c.nc.Close()
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	rate := float64(attempts.Load()) / 2
	t.Logf("wrong-token handshakes: %.0f/s with 8 parallel attackers; legitimate handshake worst %v", rate, worst)
	if rate > 100 {
		t.Fatalf("%.0f wrong-token handshakes per second: no back-off", rate)
	}
	if worst > 500*time.Millisecond {
		t.Fatalf("a legitimate handshake took %v during the attack", worst)
	}
}
