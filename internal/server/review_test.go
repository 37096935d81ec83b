package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ticketing/ticketing/internal/store"
	"github.com/ticketing/ticketing/wire"
)

// Tests written in review. Each one pins a rule of PROTOCOL.md / PRODUCT.md.

// reviewConnOf returns the server's connection serving session sid (nil if none). Server.mu is taken.
func reviewConnOf(ts *testServer, sid [wire.SessionIDSize]byte) *conn {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, c := range ts.conns {
		if c.sid == sid {
			return c
		}
	}
	return nil
}

// reviewStartServerUnmanaged is startServer for tests that call Shutdown themselves (and expect it to
// report an error): the cleanup only makes sure the server is stopped.
func reviewStartServerUnmanaged(t *testing.T, mutate func(*Config)) *testServer {
	t.Helper()
	cfg := Default()
	cfg.Addr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.SessionGrace = 0
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: s, addr: ln.Addr().String(), cfg: cfg, errc: make(chan error, 1)}
	go func() { ts.errc <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ts.Shutdown(ctx)
	})
	return ts
}

// reviewWriteBlocked reports whether c's writer has been blocked in a write for the whole of d
// (its write mutex stays held).
func reviewWriteBlocked(c *conn, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if c.wmu.TryLock() {
			c.wmu.Unlock()
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// PRODUCT.md: "A waiter whose session ended leaves the queue; a grant it never received is
// revoked and passed on." PROTOCOL.md, Revocable grants: a dead waiter holds up its queue for at
// most dead-peer detection plus the session grace, "or, if the lock reached it before its death
// was detected, that lease".
//
// Here the hand-off is queued in the waiter's output buffer while its socket is full; the write
// then times out and the server drops the buffer, grant included: no byte of the grant ever left
// the server. The session then ends (grace 200 ms). The grant must be revoked and passed to the
// next waiter; instead it runs its whole lease (60 s) and the live waiter waits for it.
func TestReviewGrantDroppedFromOutputBufferIsRevoked(t *testing.T) {
	ts := startServer(t, func(c *Config) {
		c.WriteTimeout = 1500 * time.Millisecond
		c.SessionGrace = 200 * time.Millisecond
		// Above what the flood below makes the server queue: the write stays blocked until its
		// timeout instead of ending early when the slow consumer passes the output limit.
		c.MaxOutput = 256 << 20
	})
	h := connect(t, ts.addr, "")
	g := h.roundTrip(acquire(1, "k", 60000, 0))
	if g.Status != wire.StatusOK {
		t.Fatal(g.Status)
	}
	slow := connect(t, ts.addr, "")
	slow.send(acquire(1, "k", 60000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 1 })
	good := connect(t, ts.addr, "")
	good.send(acquire(1, "k", 60000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 2 })

	// The slow client floods INSPECTs and reads nothing: the server's writes to it block once the
	// answers fill both sockets' buffers (a few MB each on loopback: 1,000,000 answers are far
	// more). The client's receive buffer is left alone: shrunk after connecting, it stalled the
	// client's own writes at random (the server then had nothing to answer, and the test
	// failed waiting for a blocked write).
	var frames []byte
	for i := 0; i < 1000000; i++ {
		frames = wire.AppendRequest(frames, &wire.Request{Op: wire.OpInspect, ID: uint64(i + 2), Key: []byte("k")})
	}
	go func() {
		slow.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		slow.nc.Write(frames)
	}()
	sc := reviewConnOf(ts, slow.sid)
	if sc == nil {
		t.Fatal("no server connection for the slow session")
	}
	// Blocked for certain: the server's write is stuck (its write mutex held) and the slow
	// client's socket holds unread answers that stop growing (its receive window is full, so
	// nothing more leaves the server). A write only held up by a busy CPU looked blocked to the
	// first check alone on a loaded machine; the socket then took the grant.
	waitFor(t, 5*time.Second, "the server's write to the slow client blocks", func() bool {
		before := reviewUnread(t, slow.nc)
		return before > 0 && reviewWriteBlocked(sc, 200*time.Millisecond) && reviewUnread(t, slow.nc) == before
	})

	// The hand-off goes to the slow session's output buffer (behind the blocked write).
	released := time.Now()
	if r := h.roundTrip(release(2, "k", g.Token)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
	info, _ := ts.inspect("k")
	if !info.Held || info.Token <= g.Token {
		t.Fatalf("no hand-off to the slow waiter: %+v", info)
	}
	// The write times out (1.5 s), the buffer with the grant is dropped, the session ends 200 ms
	// later. The live waiter must then be granted: allow 5 s in all, far below the 60 s lease.
	r, err := good.recvWithin(5 * time.Second)
	if err != nil {
		info, _ := ts.inspect("k")
		ts.mu.Lock()
		_, _, _, live := ts.table.Session(slow.sid)
		ts.mu.Unlock()
		t.Fatalf("live waiter not granted %v after the release (%v); slow session live: %v; key still held by the dropped grant: %+v",
			time.Since(released).Round(time.Millisecond), err, live, info)
	}
	if r.Status != wire.StatusOK || r.ID != 1 || r.Token <= info.Token {
		t.Fatalf("live waiter: %+v", r)
	}
}

// ISSUE 8 / Server.Shutdown's contract: "Everything, final writes included, is bounded by ctx."
// With the data directory hanging (a write that does not return), Shutdown must still return
// within its context. The final restart-horizon write waits behind the hung write instead.
func TestReviewShutdownBoundedWithHungStorage(t *testing.T) {
	ts := reviewStartServerUnmanaged(t, func(c *Config) { c.TokenBlock = 2 })
	unblock := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(unblock) }) })
	ts.Store().SetPersistHook(func(st *store.State) error {
		select { // a write that hangs (bounded here, so the test always ends)
		case <-unblock:
		case <-time.After(3 * time.Second):
		}
		return nil
	})
	h := connect(t, ts.addr, "")
	h.send(acquire(1, "a", 60000, 0))
	h.send(acquire(2, "b", 60000, 0))
	h.send(acquire(3, "c", 60000, 0)) // beyond the token block: the persister writes, and hangs
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err := ts.Shutdown(ctx)
	el := time.Since(start)
	once.Do(func() { close(unblock) })
	if el > 2500*time.Millisecond {
		t.Fatalf("Shutdown with a 1 s context took %v with the disk hung (err %v)", el.Round(time.Millisecond), err)
	}
}

// A cluster leader reads requests and proposes them without waiting (the proposer merges what
// arrives while proposals are in flight). Nothing bounds what waits: maxEntry ("a proposal is
// submitted once it holds this many bytes") is computed in proposer.end and ignored, and the
// readers never stop reading. While the log is slow (here its writes block for 600 ms, less
// than the stall bound), one pipelining client makes the leader buffer everything it sends.
// PRODUCT.md, Limits: requests in flight per connection have a limit with a clear answer, and
// bad input "never leaks". A single node has a natural bound (the reader applies each batch
// before it reads the next); the cluster leader has none.
func TestReviewClusterProposalBacklogIsBounded(t *testing.T) {
	stall := filepath.Join(t.TempDir(), "stall")
	tc := startCluster(t, 1, func(c *Config) { c.Faults.StallLog = stall })
	n := tc.nodes[tc.leader()]
	c := connect(t, n.addr, "")
	go func() { // read and discard every answer (bounded by a deadline)
		buf := make([]byte, 64<<10)
		c.nc.SetReadDeadline(time.Now().Add(20 * time.Second))
		for {
			if _, err := c.nc.Read(buf); err != nil {
				return
			}
		}
	}()
	key := make([]byte, 200)
	for i := range key {
		key[i] = 'k'
	}
	var frames []byte
	for i := 0; i < 100000; i++ { // 23 MB of INSPECTs
		frames = wire.AppendRequest(frames, &wire.Request{Op: wire.OpInspect, ID: uint64(i + 1), Key: key})
	}
	if err := os.WriteFile(stall, nil, 0o600); err != nil { // the leader's log writes now block
		t.Fatal(err)
	}
	go func() {
		c.nc.SetWriteDeadline(time.Now().Add(15 * time.Second))
		c.nc.Write(frames)
	}()
	maxLen := 0
	for start := time.Now(); time.Since(start) < 600*time.Millisecond; time.Sleep(2 * time.Millisecond) {
		p := &n.cluster.prop
		p.mu.Lock()
		maxLen = max(maxLen, p.enc.Len())
		p.mu.Unlock()
	}
	os.Remove(stall)
	if maxLen > 4*maxEntry {
		t.Fatalf("the leader buffered %.1f MiB of one client's requests in its proposer (maxEntry %d KiB) while the log was slow: no backpressure, no bound",
			float64(maxLen)/(1<<20), maxEntry>>10)
	}
}

// PRODUCT.md: "A hand-off never goes to a connection the server has already given up on", and
// "a grant it never received is revoked and passed on". On a single node a closed connection
// is detached in the same critical section that forgets it, so a later hand-off to its session
// is revocable. A cluster leader forgets the connection at once (closeConn removes it from
// s.conns) but its DETACH is only proposed; a hand-off applied in between (here: a RELEASE
// proposed just before the waiter's connection died, committed just after) finds no
// connection, is dropped without an UNDELIVERED, and so is an ordinary grant: when the
// waiter's session ends the lock is not passed on, and the next live waiter waits for the
// whole 60 s lease.
func TestReviewClusterHandoffToForgottenConnectionIsRevocable(t *testing.T) {
	stall := filepath.Join(t.TempDir(), "stall")
	tc := startCluster(t, 1, func(c *Config) { c.SessionGrace, c.Faults.StallLog = 300*time.Millisecond, stall })
	n := tc.nodes[tc.leader()]
	h := connect(t, n.addr, "")
	g := h.roundTrip(acquire(1, "k", 60000, 0))
	if g.Status != wire.StatusOK {
		t.Fatal(g.Status)
	}
	dead := connect(t, n.addr, "")
	dead.send(acquire(1, "k", 60000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return n.waiters() == 1 })
	next := connect(t, n.addr, "")
	next.send(acquire(1, "k", 60000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return n.waiters() == 2 })

	if err := os.WriteFile(stall, nil, 0o600); err != nil { // commits pause (well below the stall bound)
		t.Fatal(err)
	}
	h.send(release(2, "k", g.Token)) // proposed; commits after the waiter's connection is gone
	time.Sleep(100 * time.Millisecond)
	dead.nc.Close() // the leader forgets the connection now; its DETACH is proposed after the RELEASE
	waitFor(t, 2*time.Second, "connection forgotten", func() bool { return reviewConnOf(n, dead.sid) == nil })
	time.Sleep(50 * time.Millisecond)
	os.Remove(stall)
	released := time.Now()
	if r := h.recv(); r.Status != wire.StatusOK || r.ID != 2 {
		t.Fatalf("release: %+v", r)
	}
	// The dead waiter's session ends 300 ms after its DETACH: its grant, never sent anywhere,
	// must pass to the next waiter.
	r, err := next.recvWithin(4 * time.Second)
	if err != nil {
		info, _ := n.inspect("k")
		t.Fatalf("next waiter not granted %v after the release (%v): the key is held by the grant made for a connection the leader had already dropped: %+v",
			time.Since(released).Round(time.Millisecond), err, info)
	}
	if r.Status != wire.StatusOK || r.ID != 1 || r.Token <= g.Token+1 {
		t.Fatalf("next waiter: %+v", r)
	}
}

// PROTOCOL.md, Server limits: connections (default 10,000) — "CHALLENGE BUSY/CONNECTIONS,
// close". The check reads the number of attached connections when HELLO arrives; a connection
// only counts once its attach is applied, after AUTH. Clients that send HELLO together all pass
// the check, and all are served: the limit is exceeded by up to the number of handshakes in
// progress (TICKETING_MAX_HANDSHAKES, 1,024 by default).
func TestReviewConnectionLimitHoldsForConcurrentHandshakes(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxConnections = 2 })
	var cs []*rawClient
	for i := 0; i < 6; i++ { // six clients say HELLO before any of them sends AUTH
		c := dialRaw(t, ts.addr)
		c.write(wire.AppendHello(nil, &wire.Hello{Version: wire.Version, SessionID: c.sid}))
		cs = append(cs, c)
	}
	welcomed := 0
	for _, c := range cs {
		if ch := c.readChallenge(); ch.Status != wire.StatusOK {
			continue
		}
		c.write(wire.AppendAuth(nil, &wire.Auth{}))
		var w wire.Welcome
		if err := wire.DecodeWelcome(c.readN(wire.WelcomeSize), &w); err == nil && w.Status == wire.StatusOK {
			welcomed++
		}
	}
	_, _, _, conns := ts.Stats()
	if welcomed > 2 || conns > 2 {
		t.Fatalf("TICKETING_MAX_CONNECTIONS=2, yet %d handshakes were welcomed and %d connections are served", welcomed, conns)
	}
}

// docs/operations.md, TICKETING_RAFT_RECOVER: a forced recovery gives "tokens above everything
// the old state could issue"; PRODUCT.md: tokens "never repeat and never go backwards". The
// recovering node seeds its counter at (the last token in its own log + TICKETING_TOKEN_BLOCK)
// — a guess, not a bound: a survivor that lagged (it was down, or partitioned) by more than one
// block of grants issues tokens the lost majority already issued. The block is small here (4)
// to keep the test short; with the default (1,048,576) any lag of a million grants (seconds at
// the cluster's target rate) does the same.
func TestReviewForcedRecoveryFromStaleNodeNeverReissuesTokens(t *testing.T) {
	mutate := func(c *Config) { c.TokenBlock = 4; c.MaxLease = time.Second }
	tc := startCluster(t, 3, mutate)
	li := tc.leader()
	stale := (li + 1) % 3
	c := connect(t, tc.nodes[li].addr, "")
	g := c.roundTrip(acquire(1, "k", 1000, 0))
	id := uint64(1)
	tc.converge()
	tc.nodes[stale].stop(t) // this node misses everything from here on
	last := g.Token
	for i := 0; i < 20; i++ {
		id++
		if r := c.roundTrip(release(id, "k", last)); r.Status != wire.StatusOK {
			t.Fatalf("release: %+v", r)
		}
		id++
		r := c.roundTrip(acquire(id, "k", 1000, 5000))
		if r.Status != wire.StatusOK {
			t.Fatalf("acquire: %+v", r)
		}
		last = r.Token
	}
	for i, n := range tc.nodes {
		if i != stale {
			n.stop(t)
		}
	}
	// The majority is lost for good; the operator recovers from the node that is left.
	nid := fmt.Sprintf("n%d", stale+1)
	cfg := tc.config(stale, mutate)
	cfg.Cluster.Peers = map[string]string{nid: tc.peers[nid]}
	cfg.Cluster.Recover = true
	tc.nodes = []*testServer{startServerCfg(t, cfg)}
	n := tc.nodes[tc.leader()]
	r := connect(t, n.addr, "")
	a := r.roundTrip(acquire(1, "other", 1000, 10000))
	if a.Status != wire.StatusOK {
		t.Fatalf("acquire after recovery: %+v", a)
	}
	if a.Token <= last {
		t.Fatalf("token %d after the forced recovery, but the old state already issued tokens up to %d", a.Token, last)
	}
}

// PRODUCT.md, Cluster: "The lock table is a deterministic state machine applied from the log".
// Apply reads limits from each node's own configuration (waiters per key and in total, keys,
// lock-delay, sessions, stored outcomes, queued acquires per session), and nothing replicates or
// compares them: a node configured differently (a rolling change of TICKETING_MAX_WAITERS_PER_KEY,
// say) applies the same entries to a different state. After a failover its clients' answers
// no longer match the table (a waiter refused BUSY on one node is queued, and later granted, on
// another).
func TestReviewClusterReplicasApplyTheSameState(t *testing.T) {
	tc := startCluster(t, 3, func(c *Config) {
		if c.Cluster.NodeID == "n1" {
			c.MaxWaitersPerKey = 1 // one node differs
		}
	})
	l := tc.nodes[tc.leader()]
	h := connect(t, l.addr, "")
	if r := h.roundTrip(acquire(1, "k", 30000, 0)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
	w1 := connect(t, l.addr, "")
	w1.send(acquire(1, "k", 30000, wire.WaitForever))
	// 5 s ran out once with the machine at load 17: the entry commits through the log.
	waitFor(t, 20*time.Second, "queued", func() bool { return l.waiters() == 1 })
	w2 := connect(t, l.addr, "")
	w2.send(acquire(1, "k", 30000, wire.WaitForever))
	if r, err := w2.recvWithin(500 * time.Millisecond); err == nil {
		t.Logf("second waiter answered by the leader: %v %v", r.Status, r.Detail)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		var idx []uint64
		var ws []int
		for _, n := range tc.nodes {
			idx = append(idx, n.cluster.raft.AppliedIndex())
			ws = append(ws, n.waiters())
		}
		if idx[0] == idx[1] && idx[1] == idx[2] {
			if ws[0] != ws[1] || ws[1] != ws[2] {
				t.Fatalf("replicas at the same applied index %d disagree on the queue of k: %v waiters (n1, n2, n3)", idx[0], ws)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("replicas did not reach the same applied index")
}

// PRODUCT.md: an outsider reaching a Raft port "can never inject state"; ISSUE 8's rule for the
// client port is that a flood of idle unauthenticated connections never keeps authenticated
// peers from being served (the oldest pending handshake is closed). The Raft port does the
// opposite: with 64 handshakes pending (raftnet handshakeLimit) every new connection is
// closed at once — the peers' too. Followers have no connections to each other until an
// election, so 64 idle TCP connections to each follower (no secret needed, held for under the
// 5 s handshake timeout and then renewed) leave the cluster without a leader after the
// leader dies.
func TestReviewRaftPortFloodDoesNotBlockElection(t *testing.T) {
	tc := startCluster(t, 3, nil)
	li := tc.leader()
	tc.converge()
	var idle []net.Conn
	t.Cleanup(func() {
		for _, nc := range idle {
			nc.Close()
		}
	})
	for i := range tc.nodes {
		if i == li {
			continue
		}
		for k := 0; k < 70; k++ {
			nc, err := net.DialTimeout("tcp", tc.peers[fmt.Sprintf("n%d", i+1)], time.Second)
			if err != nil {
				t.Fatal(err)
			}
			idle = append(idle, nc)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if err := tc.nodes[li].cluster.raft.Shutdown().Error(); err != nil { // the leader dies
		t.Fatal(err)
	}
	start := time.Now()
	for time.Since(start) < 4*time.Second { // election timeout here: 150 ms
		for i, n := range tc.nodes {
			if i != li && n.cluster.raft.State() == raft.Leader {
				t.Logf("new leader after %v", time.Since(start).Round(time.Millisecond))
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no new leader %v after the leader died: 70 idle connections to each follower's Raft port (no secret) shut the followers off from each other",
		time.Since(start).Round(time.Millisecond))
}
