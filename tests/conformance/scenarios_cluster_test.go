package conformance

import (
	"slices"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// The cluster variants of the scenarios that stop, kill or restart the server (SCENARIOS.md,
// "On a cluster"). On one node those end the lock state; on a cluster they are a leader
// failover, and the failover must be invisible to the application: locks stay held and their
// holders are not told lost, waiters keep their places, retried requests are answered from
// the replicated state, and GOAWAY takes a client to the new leader.

// converged waits until every running node of a cluster target has applied the same state.
func (s *S) converged(t *target) {
	if c, ok := t.Target.(*clusterTarget); ok {
		if err := c.Converged(10 * time.Second); err != nil {
			s.Fatalf("%v", err)
		}
		s.Step("every node has the same state hash at the same applied index")
	}
}

// expectHeldBy checks, through R, that token holds key with waiters queued.
func (s *S) expectHeldBy(r *rawClient, key string, token uint64, waiters uint32) {
	in, err := r.inspect(key, token)
	if err != nil {
		s.Fatalf("%v", err)
	}
	s.log.add(time.Now(), "R INSPECT %q token %d: %s", key, token, in)
	if !in.tokenMatch() || in.Waiters != waiters {
		s.Fatalf("INSPECT %q with token %d: %s; want held by that token with %d waiters", key, token, in, waiters)
	}
}

// scLostOnRestartCluster: the leader is killed; nothing is lost, and a client whose only
// endpoint was the killed node waits for it to come back.
func scLostOnRestartCluster(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	old := t.leader()
	a := s.connect(s.d, t, connectOpts{})
	waiters := []*client{s.connect(s.d, t, connectOpts{}), s.connect(s.d, t, connectOpts{})} // B, C
	d := s.connect(s.d, t, connectOpts{endpoints: []string{old}})
	hA := a.mustAcquire("k", 10*time.Second, acquireArgs{keepalive: s.d.features["keepalive"]}, prompt)
	hD := d.mustAcquire("k3", 10*time.Second, acquireArgs{}, prompt)
	tokR := s.rAcquire(r, "k2", 30*time.Second)
	calls, locks := s.queueInOrder(r, "k2", waiters, 10*time.Second)
	s.Step("D was given only the leader's address %s", old)
	s.Step("SIGKILL the leader %s", old)
	t.kill()
	killed := time.Now()
	// A call made while the client looks for the new leader waits for it (docs/clients.md,
	// rule 1: calls wait for the connection, bounded by their own timeouts).
	ping := a.ping()
	time.Sleep(time.Until(killed.Add(300 * time.Millisecond)))
	s.Step("D pings: its only endpoint has been down for 300 ms")
	pingD := d.ping()
	r2 := t.R()
	s.Step("a new leader serves, %v after the kill", time.Since(killed).Round(time.Millisecond))
	s.ok(ping, 5*time.Second, "A's ping, sent as soon as the leader was killed")
	s.expectHeldBy(r2, "k", hA.token, 0)
	s.expectHeldBy(r2, "k2", tokR, 2)
	s.expectHeldBy(r2, "k3", hD.token, 0)
	for i, c := range calls {
		if c.isDone() {
			s.Fatalf("waiter #%d's acquire finished across the failover: %s; want it still queued", i+1, clip(c.reply.raw, 200))
		}
	}
	time.Sleep(time.Until(killed.Add(1500 * time.Millisecond)))
	if pingD.isDone() {
		s.Fatalf("D's ping replied while D's only endpoint was down: %s; a call made while the client reconnects waits for the connection (docs/clients.md, rule 1)", clip(pingD.reply.raw, 300))
	}
	s.Step("restart the killed node (it rejoins as a follower and hints at the new leader)")
	if err := t.Restart(); err != nil {
		s.Fatalf("restart: %v", err)
	}
	s.ok(pingD, 5*time.Second, "D's ping, made while its only endpoint was down")
	s.Step("R releases k2 on the new leader")
	s.rRelease(r2, "k2", tokR)
	hs := s.grantInOrder(waiters, calls, locks, "k2", tokR)
	s.expectNotLost(hA)
	s.expectNotLost(hD)
	if s.d.features["verify"] {
		s.expectVerify(hA, true)
	}
	s.ok(hA.release(), prompt, "A's release after the failover")
	s.ok(hD.release(), prompt, "D's release after the failover")
	for _, k := range []string{"k", "k2", "k3"} {
		s.expectInspect(r2, k, false, 0)
	}
	s.expectNoEvent(hA)
	s.expectNoEvent(hD)
	for _, h := range hs {
		s.expectNoEvent(h)
	}
	s.converged(t)
}

// stopLeader stops the leader gracefully (in the background) and checks R's side: a GOAWAY
// with reason STOPPING whose data is the client address of another node, within 2 s (pushes
// R got before the stop, such as a GOAWAY of a leader change under load, do not count). It
// returns the stopped leader's address and a channel closed once Stop returned.
func (s *S) stopLeader(t *target, r *rawClient) (string, <-chan struct{}) {
	before := len(r.pushesNow())
	old := t.leader()
	stopped := s.stopInBackground(t)
	f, ok := r.waitPushAfter(before, func(f rawFrame) bool {
		return f.Op == wire.OpGoaway && f.Detail == wire.GoawayStopping
	}, prompt)
	if !ok {
		s.Fatalf("R (connected to the leader %s) got no GOAWAY reason STOPPING within %v of the SIGTERM", old, prompt)
	}
	if !slices.Contains(t.others(old), string(f.Data)) {
		s.Fatalf("GOAWAY: %s; want the client address of another node (%v) as data: the stopping leader hands leadership over first, so it knows the next one", describeFrame(f.Response), t.others(old))
	}
	return old, stopped
}

// scStoppingCluster: the leader stops gracefully; its clients get GOAWAY naming the new leader,
// no lost notice, and keep their locks.
func scStoppingCluster(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	old := t.leader()
	// A knows only the leader's address: the GOAWAY's address is its only way to the next one.
	a := s.connect(s.d, t, connectOpts{endpoints: []string{old}})
	hA := a.mustAcquire("k", 10*time.Second, acquireArgs{}, prompt)
	tokR := s.rAcquire(r, "k2", 10*time.Second)
	s.Step("A was given only the leader's address %s", old)
	_, stopped := s.stopLeader(t, r)
	s.waitStopped(stopped)
	for _, f := range r.pushesNow() {
		if f.Op == wire.OpExpired {
			s.Errorf("R got %s: a cluster node's graceful stop sends GOAWAY, never EXPIRED", describeFrame(f.Response))
		}
	}
	r2 := t.R()
	s.expectHeldBy(r2, "k", hA.token, 0)
	s.expectHeldBy(r2, "k2", tokR, 0)
	s.expectNotLost(hA)
	if s.d.features["verify"] {
		s.expectVerify(hA, true)
	}
	s.ok(hA.release(), prompt, "A's release on the new leader (A followed the GOAWAY)")
	s.expectInspect(r2, "k", false, 0)
	s.expectNoEvent(hA)
}

// scShuttingDownCluster: the leader stops gracefully while A waits in the queue; A's acquire
// does not fail, A keeps its place and is granted by the new leader.
func scShuttingDownCluster(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	tokR := s.rAcquire(r, "k", 30*time.Second)
	c, lock := a.acquire("k", 10*time.Second, acquireArgs{})
	s.waitInspect(r, "k", true, 1, 5*time.Second)
	_, stopped := s.stopLeader(t, r)
	s.waitStopped(stopped)
	r2 := t.R()
	s.expectHeldBy(r2, "k", tokR, 1)
	if c.isDone() {
		s.Fatalf("A's queued acquire finished when the leader stopped: %s; want it still queued", clip(c.reply.raw, 200))
	}
	s.Step("R releases k on the new leader")
	s.rRelease(r2, "k", tokR)
	h := s.granted(a, c, lock, 5*time.Second, "A's queued acquire, after the leader stopped")
	if h.token <= tokR {
		s.Fatalf("A's token %d not above R's %d", h.token, tokR)
	}
	s.expectHeldBy(r2, "k", h.token, 0)
	s.releaseAny(h, "k", prompt)
	s.expectInspect(r2, "k", false, 0)
}

// scRetryIdempotentCluster: the leader commits A's grant and dies before A reads the answer; A
// retries on the new leader and gets the same token, never a second grant.
func scRetryIdempotentCluster(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	after := s.probeToken(r)
	old := t.leader()
	p := s.proxyTo(old)
	// A reaches the leader through the proxy, and the other nodes directly.
	a := s.connect(s.d, t, connectOpts{endpoints: append(p.addrs(), t.others(old)...)})
	pc := s.proxiedConn(p, a)
	s.Step("hold back server->client bytes on A's connection to the leader")
	pc.HoldServerBytes()
	c, lock := a.acquire("k", 10*time.Second, acquireArgs{})
	s.waitInspect(r, "k", true, 0, 5*time.Second)
	tok := s.holderToken(r, "k", after)
	s.logFrames(pc, "A")
	s.Step("SIGKILL the leader %s with A's grant committed and %d bytes of its answer held back", old, pc.HeldBytes())
	p.refuse(true)
	t.kill()
	h := s.granted(a, c, lock, 5*time.Second, "A's acquire across the failover")
	if h.token != tok {
		s.Fatalf("A's acquire returned token %d; the old leader granted %d (a second grant?)", h.token, tok)
	}
	r2 := t.R()
	s.expectHeldBy(r2, "k", tok, 0)
	s.ok(h.release(), prompt, "A's release")
	s.expectInspect(r2, "k", false, 0)
	tokR := s.rAcquire(r2, "k", 10*time.Second)
	if tokR != tok+1 {
		s.Fatalf("R's acquire got token %d; want %d (no grant between A's and R's)", tokR, tok+1)
	}
	s.expectNoEvent(h)
}

// scReleaseRetryCluster: the leader commits A's release and dies before A reads the answer; A's
// retried RELEASE on the new leader replays the stored outcome.
func scReleaseRetryCluster(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	old := t.leader()
	p := s.proxyTo(old)
	a := s.connect(s.d, t, connectOpts{endpoints: append(p.addrs(), t.others(old)...)})
	h := a.mustAcquire("k", 10*time.Second, acquireArgs{}, prompt)
	pc := s.proxiedConn(p, a)
	s.Step("hold back server->client bytes on A's connection to the leader")
	pc.HoldServerBytes()
	c := h.release()
	s.waitInspect(r, "k", false, 0, 5*time.Second)
	s.logFrames(pc, "A")
	s.Step("SIGKILL the leader %s with A's release committed and %d bytes of its answer held back", old, pc.HeldBytes())
	p.refuse(true)
	t.kill()
	s.ok(c, 5*time.Second, "A's release across the failover")
	observe(200 * time.Millisecond)
	s.expectNotLost(h)
	r2 := t.R()
	s.expectInspect(r2, "k", false, 0)
}
