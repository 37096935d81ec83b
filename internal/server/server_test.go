package server

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/wire"
)

func TestAcquireReleaseExtendPing(t *testing.T) {
	ts := startServer(t, nil)
	c := connect(t, ts.addr, "")
	r := c.roundTrip(acquire(1, "order-1234", 30000, 0))
	if r.Status != wire.StatusOK || r.Token == 0 || r.Lease != 30000 || r.Op != wire.OpAcquire {
		t.Fatalf("acquire: %+v", r)
	}
	if r2 := c.roundTrip(acquire(2, "order-1234", 30000, 0)); r2.Status != wire.StatusTimedOut {
		t.Fatalf("second acquire with wait 0: %v", r2.Status)
	}
	if e := c.roundTrip(wire.Request{Op: wire.OpExtend, ID: 3, Key: []byte("order-1234"), Token: r.Token, Lease: 60000}); e.Status != wire.StatusOK || e.Lease != 60000 || e.Token != r.Token {
		t.Fatalf("extend: %+v", e)
	}
	if e := c.roundTrip(wire.Request{Op: wire.OpExtend, ID: 4, Key: []byte("order-1234"), Token: r.Token + 1, Lease: 60000}); e.Status != wire.StatusNotHeld {
		t.Fatalf("extend with wrong token: %+v", e)
	}
	if p := c.roundTrip(wire.Request{Op: wire.OpPing, ID: 5}); p.Status != wire.StatusOK || p.Op != wire.OpPing {
		t.Fatalf("ping: %+v", p)
	}
	// Release does not need the connection that acquired.
	other := connect(t, ts.addr, "")
	if rel := other.roundTrip(release(1, "order-1234", r.Token)); rel.Status != wire.StatusOK {
		t.Fatalf("release: %v", rel.Status)
	}
	if rel := c.roundTrip(release(6, "order-1234", r.Token)); rel.Status != wire.StatusNotHeld {
		t.Fatalf("second release: %v", rel.Status)
	}
	if keys, held, waiters, _ := ts.Stats(); keys != 0 || held != 0 || waiters != 0 {
		t.Fatalf("table not empty: %d %d %d", keys, held, waiters)
	}
}

// 50 waiters on one key are granted in arrival order, each token larger than the one before.
func TestFIFOFiftyWaiters(t *testing.T) {
	ts := startServer(t, nil)
	holder := connect(t, ts.addr, "")
	first := holder.roundTrip(acquire(1, "k", 60000, 0))
	const n = 50
	clients := make([]*rawClient, n)
	for i := range clients {
		clients[i] = connect(t, ts.addr, "")
		clients[i].send(acquire(uint64(i+1), "k", 60000, wire.WaitForever))
		// Arrival order is the order in which the server queued them.
		waitFor(t, 5*time.Second, "waiter queued", func() bool { return ts.waiters() == i+1 })
	}
	last := first.Token
	if r := holder.roundTrip(release(2, "k", first.Token)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
	for i, c := range clients {
		r := c.recv()
		if r.Status != wire.StatusOK || r.ID != uint64(i+1) {
			t.Fatalf("waiter %d: %+v", i, r)
		}
		if r.Token <= last {
			t.Fatalf("waiter %d token %d not above %d", i, r.Token, last)
		}
		last = r.Token
		// Nobody else may have been granted before this one releases.
		if i+1 < n {
			if _, err := clients[i+1].recvWithin(10 * time.Millisecond); err == nil {
				t.Fatalf("waiter %d granted while %d holds", i+1, i)
			}
		}
		if rel := c.roundTrip(release(1000, "k", r.Token)); rel.Status != wire.StatusOK {
			t.Fatal(rel.Status)
		}
	}
}

// A holder's connection closes: the lock stays until its lease ends, then passes to the next live
// waiter; a waiter whose connection closed is skipped.
func TestHolderDisconnectLeaseThenNextLiveWaiter(t *testing.T) {
	const lease = 1000 * time.Millisecond
	ts := startServer(t, nil)
	holder := connect(t, ts.addr, "")
	sentAt := time.Now() // the lease counts from the server's receipt: no earlier than this
	g := holder.roundTrip(acquire(1, "k", uint32(lease.Milliseconds()), 0))
	dead := connect(t, ts.addr, "")
	dead.send(acquire(1, "k", 5000, wire.WaitForever))
	waitFor(t, 5*time.Second, "dead waiter queued", func() bool { return ts.waiters() == 1 })
	live := connect(t, ts.addr, "")
	live.send(acquire(7, "k", 5000, wire.WaitForever))
	waitFor(t, 5*time.Second, "live waiter queued", func() bool { return ts.waiters() == 2 })
	queuedBy := time.Now() // the live waiter queued before this

	holder.nc.Close()
	dead.nc.Close()
	waitFor(t, 5*time.Second, "dead waiter dropped", func() bool { return ts.waiters() <= 1 })
	// Still held by the closed connection's lock until the lease ends (when this machine was
	// quick enough to look before it ends: the setup above has no bound on a loaded machine).
	info, ok := ts.inspect("k")
	if time.Since(sentAt) < lease-100*time.Millisecond && (!ok || !info.Held || info.Token != g.Token) {
		t.Fatalf("lock not held after holder disconnect: %+v", info)
	}
	r := live.recv()
	if r.Status != wire.StatusOK || r.ID != 7 || r.Token <= g.Token {
		t.Fatalf("live waiter: %+v", r)
	}
	if el := time.Since(sentAt); el < lease {
		t.Fatalf("granted %v after the holder's acquire was sent; the lease was %v", el, lease)
	}
	// It queued from before queuedBy until the lease ended, no earlier than sentAt + lease.
	if want := (lease - queuedBy.Sub(sentAt)).Milliseconds() - 20; int64(r.Detail) < want {
		t.Fatalf("queued ms %d, want >= %d", r.Detail, want)
	}
}

// Release with a stale token after a lease expiry answers NOT_HELD and the new holder's lock is intact.
func TestStaleReleaseAfterExpiry(t *testing.T) {
	ts := startServer(t, nil)
	a := connect(t, ts.addr, "")
	b := connect(t, ts.addr, "")
	ga := a.roundTrip(acquire(1, "k", 50, 0))
	b.send(acquire(1, "k", 60000, wire.WaitForever))
	// a is told its lease expired, then b is granted.
	exp := a.recv()
	if exp.Op != wire.OpExpired || exp.Token != ga.Token || string(exp.Data) != "k" || exp.ID != 0 {
		t.Fatalf("expiry notice: %+v", exp)
	}
	gb := b.recv()
	if gb.Status != wire.StatusOK || gb.Token <= ga.Token {
		t.Fatalf("b: %+v", gb)
	}
	if r := a.roundTrip(release(2, "k", ga.Token)); r.Status != wire.StatusNotHeld {
		t.Fatalf("stale release: %v", r.Status)
	}
	if r := a.roundTrip(wire.Request{Op: wire.OpExtend, ID: 3, Key: []byte("k"), Token: ga.Token, Lease: 1000}); r.Status != wire.StatusNotHeld {
		t.Fatalf("stale extend: %v", r.Status)
	}
	if info, ok := ts.inspect("k"); !ok || info.Token != gb.Token || !info.Held {
		t.Fatalf("new holder disturbed: %+v", info)
	}
	if r := b.roundTrip(release(2, "k", gb.Token)); r.Status != wire.StatusOK {
		t.Fatalf("new holder release: %v", r.Status)
	}
}

// After a restart on the same data directory the next token is larger than every token before.
func TestTokensGrowAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	var maxToken uint64
	for round := 0; round < 3; round++ {
		cfg := Default()
		cfg.Addr = "127.0.0.1:0"
		cfg.DataDir = dir
		cfg.TokenBlock = 8      // several durable reservations per round
		cfg.StartupAuto = false // the locks of the round before are still within their lease
		ts := startServerCfg(t, cfg)
		c := connect(t, ts.addr, "")
		for i := 0; i < 20; i++ {
			r := c.roundTrip(acquire(uint64(i+1), "k"+string(rune('a'+i)), 1000, 0))
			if r.Status != wire.StatusOK || r.Token <= maxToken {
				t.Fatalf("round %d: token %d not above %d", round, r.Token, maxToken)
			}
			maxToken = r.Token
		}
		ts.stop(t)
	}
}

func TestAuth(t *testing.T) {
	const token = "s3cret-token-value"
	ts := startServer(t, func(c *Config) { c.Tokens = []string{token} })

	// Right token: works.
	c := connect(t, ts.addr, token)
	if r := c.roundTrip(acquire(1, "k", 1000, 0)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}

	// Wrong token: AUTH_FAILED, then the connection closes.
	bad := dialRaw(t, ts.addr)
	if st := bad.handshake("wrong"); st != wire.StatusAuthFailed {
		t.Fatalf("wrong token: %v", st)
	}
	bad.expectClosed(2 * time.Second)

	// No operation is possible before auth: a request in place of AUTH closes the connection
	// without an answer, and the request is not applied.
	early := dialRaw(t, ts.addr)
	h := wire.Hello{Version: wire.Version}
	early.write(wire.AppendHello(nil, &h))
	early.readN(wire.ChallengeSize)
	early.send(acquire(1, "early", 1000, 0))
	early.expectClosed(2 * time.Second)
	if _, ok := ts.inspect("early"); ok {
		t.Fatal("a request before auth was applied")
	}
}

// recorder captures every byte a client writes.
type recorder struct {
	net.Conn
	mu    sync.Mutex
	bytes bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	r.bytes.Write(b)
	r.mu.Unlock()
	return r.Conn.Write(b)
}

// The token never crosses the wire: capture the whole handshake in both directions.
func TestTokenNotOnTheWire(t *testing.T) {
	const token = "correct horse battery staple"
	ts := startServer(t, func(c *Config) { c.Tokens = []string{token} })
	c := dialRaw(t, ts.addr)
	rec := &recorder{Conn: c.nc}
	c.nc = rec
	if st := c.handshake(token); st != wire.StatusOK {
		t.Fatal(st)
	}
	sent := rec.bytes.Bytes()
	if len(sent) != wire.HelloSize+wire.AuthSize {
		t.Fatalf("client sent %d bytes, want %d", len(sent), wire.HelloSize+wire.AuthSize)
	}
	// What the client received is exactly CHALLENGE+WELCOME, read by the handshake; re-encode the
	// server side from a fresh handshake's raw bytes to check it too.
	raw := dialRaw(t, ts.addr)
	h := wire.Hello{Version: wire.Version}
	raw.write(wire.AppendHello(nil, &h))
	received := raw.readN(wire.ChallengeSize)
	for _, b := range [][]byte{sent, received} {
		if bytes.Contains(b, []byte(token)) || bytes.Contains(b, []byte(token[:8])) {
			t.Fatal("the token appears on the wire")
		}
	}
}

func TestWaitTimeoutAndCancel(t *testing.T) {
	ts := startServer(t, nil)
	h := connect(t, ts.addr, "")
	h.roundTrip(acquire(1, "k", 60000, 0))
	c := connect(t, ts.addr, "")
	start := time.Now()
	if r := c.roundTrip(acquire(1, "k", 1000, 100)); r.Status != wire.StatusTimedOut {
		t.Fatalf("timeout: %v", r.Status)
	}
	if el := time.Since(start); el < 90*time.Millisecond {
		t.Fatalf("timed out after %v", el)
	}
	// Cancel a pending acquire: CANCELLED for the acquire, then CANCEL OK detail 1.
	c.send(acquire(2, "k", 1000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 1 })
	c.send(wire.Request{Op: wire.OpCancel, ID: 3, Token: 2})
	if r := c.recv(); r.ID != 2 || r.Status != wire.StatusCancelled || r.Op != wire.OpAcquire {
		t.Fatalf("cancelled acquire: %+v", r)
	}
	if r := c.recv(); r.ID != 3 || r.Status != wire.StatusOK || r.Detail != 1 {
		t.Fatalf("cancel: %+v", r)
	}
	// Nothing pending: detail 0.
	if r := c.roundTrip(wire.Request{Op: wire.OpCancel, ID: 4, Token: 2}); r.Status != wire.StatusOK || r.Detail != 0 {
		t.Fatalf("cancel nothing: %+v", r)
	}
	if ts.waiters() != 0 {
		t.Fatal("waiter left behind")
	}
}

// Pipelining: a waiting acquire does not hold back later answers on its connection, and many
// requests written at once are all answered.
func TestPipelining(t *testing.T) {
	ts := startServer(t, nil)
	h := connect(t, ts.addr, "")
	g := h.roundTrip(acquire(1, "busy", 60000, 0))
	c := connect(t, ts.addr, "")
	var batch []byte
	batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpAcquire, ID: 1, Key: []byte("busy"), Lease: 1000, WaitMs: wire.WaitForever})
	const n = 500
	for i := 0; i < n; i++ {
		batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpPing, ID: uint64(i + 2)})
	}
	c.write(batch)
	for i := 0; i < n; i++ {
		if r := c.recv(); r.ID != uint64(i+2) || r.Op != wire.OpPing {
			t.Fatalf("answer %d: %+v", i, r)
		}
	}
	h.roundTrip(release(2, "busy", g.Token))
	if r := c.recv(); r.ID != 1 || r.Status != wire.StatusOK {
		t.Fatalf("waiting acquire: %+v", r)
	}
}

// Graceful shutdown: waiters get SHUTTING_DOWN; the token counter stays ahead of every token.
func TestShutdownAnswersWaiters(t *testing.T) {
	ts := startServer(t, nil)
	h := connect(t, ts.addr, "")
	h.roundTrip(acquire(1, "k", 60000, 0))
	w := connect(t, ts.addr, "")
	w.send(acquire(9, "k", 1000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 1 })
	go ts.stop(t)
	r := w.recv()
	if r.ID != 9 || r.Status != wire.StatusShuttingDown {
		t.Fatalf("%+v", r)
	}
	w.expectClosed(5 * time.Second)
}

// Times are bounded from the expiring acquire's send: its lease, its expiry and so the delay
// start later, so the lower bound holds however late this goroutine runs; the check that an
// acquire during the delay times out is made only while that is sure (a loaded machine can run
// this goroutine after the whole delay).
func TestLockDelayAfterExpiryOnly(t *testing.T) {
	const delay, lease = time.Second, 20 * time.Millisecond
	ts := startServer(t, func(c *Config) { c.LockDelay = delay })
	c := connect(t, ts.addr, "")
	g := c.roundTrip(acquire(1, "released", 10000, 0))
	c.roundTrip(release(2, "released", g.Token))
	if r := c.roundTrip(acquire(3, "released", 60000, 0)); r.Status != wire.StatusOK {
		t.Fatalf("no delay after release expected: %v", r.Status)
	}
	sent := time.Now()
	c.roundTrip(acquire(4, "expiring", uint32(lease/time.Millisecond), 0))
	if r := c.recv(); r.Op != wire.OpExpired {
		t.Fatalf("want expiry notice, got %+v", r)
	}
	if time.Since(sent) < delay/2 {
		if r := c.roundTrip(acquire(5, "expiring", 1000, 0)); r.Status != wire.StatusTimedOut {
			t.Fatalf("during lock-delay: %v", r.Status)
		}
	}
	if r := c.roundTrip(acquire(6, "expiring", 1000, 5000)); r.Status != wire.StatusOK {
		t.Fatalf("after lock-delay: %v", r.Status)
	}
	if el := time.Since(sent); el < lease+delay {
		t.Fatalf("granted %v after the expiring acquire, inside the lock-delay", el)
	}
}

func (ts *testServer) inspect(key string) (info inspectInfo, ok bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	i, ok := ts.table.Inspect([]byte(key))
	return inspectInfo{Held: i.Held, Token: i.Token, Waiters: i.Waiters}, ok
}

type inspectInfo struct {
	Held    bool
	Token   uint64
	Waiters int
}

func TestTLS(t *testing.T) {
	files, err := testserver.GenerateTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, func(c *Config) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		c.Tokens = []string{"tls-and-token"}
	})
	pem, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	nc, err := tls.Dial("tcp", ts.addr, &tls.Config{RootCAs: pool, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawClient{t: t, nc: nc, sid: [wire.SessionIDSize]byte{7}}
	if st := c.handshake("tls-and-token"); st != wire.StatusOK {
		t.Fatal(st)
	}
	if r := c.roundTrip(acquire(1, "k", 1000, 0)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
	// A plain-TCP client gets nothing useful from a TLS port.
	plain := dialRaw(t, ts.addr)
	plain.write(wire.AppendHello(nil, &wire.Hello{Version: wire.Version}))
	plain.expectClosed(3 * time.Second)
}

func TestInspect(t *testing.T) {
	ts := startServer(t, nil)
	c := connect(t, ts.addr, "")
	if r := c.roundTrip(wire.Request{Op: wire.OpInspect, ID: 1, Key: []byte("k")}); r.Status != wire.StatusOK || r.Token != 0 || r.Detail != 0 || len(r.Data) != wire.InspectDataSize {
		t.Fatalf("free key: %+v", r)
	}
	g := c.roundTrip(acquire(2, "k", 60000, 0))
	w := connect(t, ts.addr, "")
	w.send(acquire(1, "k", 1000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 1 })
	r := c.roundTrip(wire.Request{Op: wire.OpInspect, ID: 3, Key: []byte("k")})
	if r.Status != wire.StatusOK || r.Token != g.Token || r.Detail != 1 || r.Lease == 0 || r.Lease > 60000 {
		t.Fatalf("held key: %+v", r)
	}
	if r := c.roundTrip(wire.Request{Op: wire.OpInspect, ID: 4}); r.Status != wire.StatusInvalid || r.Detail != wire.FieldKey {
		t.Fatalf("no key: %+v", r)
	}
}

func TestStartupGrace(t *testing.T) {
	const grace = time.Second
	start := time.Now() // the server's wait starts later: the bounds below hold under any load
	ts := startServer(t, func(c *Config) { c.StartupGrace = grace })
	c := connect(t, ts.addr, "")
	if time.Since(start) > grace/2 {
		// So loaded a machine that the wait may be over before the first request: only the
		// lower bound below can be checked.
		r := c.roundTrip(acquire(3, "k", 1000, 5000))
		if r.Status != wire.StatusOK || time.Since(start) < grace {
			t.Fatalf("after grace: %+v after %v", r, time.Since(start))
		}
		return
	}
	// The start-up wait shows: INSPECT of any key says STARTUP with the time left, and a timed
	// out acquire says why (before, a key nobody held answered all zeros and timed out unexplained).
	in := c.roundTrip(wire.Request{Op: wire.OpInspect, ID: 1, Key: []byte("other")})
	if flags := binary.BigEndian.Uint32(in.Data[8:]); flags&wire.InspectStartup == 0 || binary.BigEndian.Uint32(in.Data[4:]) == 0 {
		t.Fatalf("INSPECT during the start-up wait: %+v", in)
	}
	if r := c.roundTrip(acquire(2, "k", 1000, 0)); r.Status != wire.StatusTimedOut || !strings.Contains(string(r.Data), "start-up wait") {
		t.Fatalf("during grace: %+v", r)
	}
	r := c.roundTrip(acquire(3, "k", 1000, 5000))
	if r.Status != wire.StatusOK {
		t.Fatalf("after grace: %v", r.Status)
	}
	if time.Since(start) < grace {
		t.Fatal("granted inside the start-up grace")
	}
}
