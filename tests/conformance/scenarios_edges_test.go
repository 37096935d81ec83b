package conformance

import (
	"strings"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// The edges every client must agree on (issue "Clients, second pass"): each scenario failed with
// at least one client before.

// scReleaseLostAtOnce: a release of a lock the client already knows is lost answers at once
// (lock_lost with the reason), also when the server cannot be reached: it never waits out the
// request timeout. (Go took 10 s, Python raised a timeout after 10 s, JS 10 s.)
func scReleaseLostAtOnce(s *S) {
	t := s.server(targetConfig{})
	p := s.proxy(t)
	a := s.connect(s.d, t, connectOpts{endpoints: p.addrs()})
	lease := t.minLease(400 * time.Millisecond)
	h := a.mustAcquire("k", lease, acquireArgs{}, prompt)
	s.expectLostEvent(h, "expired", lease+3*time.Second)
	s.Step("cut A off from the server: nothing is relayed any more, and the sockets stay open")
	for _, px := range p {
		px.Cut()
	}
	s.lockLost(h.release(), time.Second, "A's release of a lock lost at its deadline, the server unreachable", "expired")
	if s.onCluster() {
		return // a cluster node's stop is not the service's: no "server stopping" lost
	}
	s.Step("part 2: a lock lost because the server stopped, released after it exited")
	b := s.connect(s.d, t, connectOpts{})
	hB := b.mustAcquire("k2", 10*time.Second, acquireArgs{}, prompt)
	stopped := s.stopInBackground(t)
	s.expectLostEvent(hB, "server_stopping", prompt)
	s.waitStopped(stopped)
	s.lockLost(hB.release(), time.Second, "B's release of a lock lost to the server's stop, the server gone", "server_stopping")
}

// scCloseWithdrawsWaiters: closing a client ends its session's waits on the server too: a
// queued acquire is withdrawn, never granted to a closed client (where it would block the key
// for the session grace). (Go and Python left it queued: the next acquirer waited 3.5-4.5 s.)
func scCloseWithdrawsWaiters(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	tokR := s.rAcquire(r, "k", 30*time.Second)
	c, _ := a.acquire("k", 10*time.Second, acquireArgs{})
	s.waitInspect(r, "k", true, 1, 5*time.Second)
	s.ok(a.close(), 5*time.Second, "A's close with an acquire queued")
	s.fails(c, prompt, "A's queued acquire when A closes", "closed", "cancelled")
	s.waitInspect(r, "k", true, 0, prompt)
	s.rRelease(r, "k", tokR)
	s.expectInspect(r, "k", false, 0)
	b := s.connect(s.d, t, connectOpts{})
	hB := b.mustAcquire("k", 5*time.Second, acquireArgs{wait: waitFor(0)}, prompt)
	s.releaseAny(hB, "k", prompt)
}

// scFirstCallAfterRestart: a call made after the server restarted never reached the old server:
// it goes to the new one as a new request (only locks and waits of the old state are lost).
// (C++, Java and C# failed it with server_restarted.)
func scFirstCallAfterRestart(s *S) {
	t := s.server(targetConfig{})
	a := s.connect(s.d, t, connectOpts{})
	s.ok(a.ping(), prompt, "A's ping before the restart")
	s.Step("SIGKILL the server and start it again (a new state id)")
	t.kill()
	if err := t.Restart(); err != nil {
		s.Fatalf("restart: %v", err)
	}
	s.ok(a.ping(), 5*time.Second, "A's first call after the restart (a ping)")
	h := a.mustAcquire("k", 5*time.Second, acquireArgs{wait: waitFor(0)}, 5*time.Second)
	s.releaseAny(h, "k", prompt)
}

// scTimeoutWhileReconnecting: docs/clients.md rule 1: a call whose own timeout passes while the
// client reconnects fails timeout (Rust said unavailable).
func scTimeoutWhileReconnecting(s *S) {
	t := s.server(targetConfig{})
	a := s.connect(s.d, t, connectOpts{requestTimeout: 500 * time.Millisecond})
	s.ok(a.ping(), prompt, "A's ping")
	s.Step("SIGKILL the server (it stays down)")
	t.kill()
	s.fails(a.ping(), 3*time.Second, "A's ping with the server down (request timeout 500 ms)", "timeout")
}

// scErrorMessages: the server's limits come back with their numbers, a long key is not echoed
// whole, and no message says the same thing twice.
func scErrorMessages(s *S) {
	t := s.server(targetConfig{})
	a := s.connect(s.d, t, connectOpts{})
	key := strings.Repeat("k", 300)
	c, _ := a.acquireRaw(map[string]any{"key": key, "lease_ms": 1000, "wait_ms": 0})
	e := s.fails(c, prompt, "acquire of a 300-byte key (the server's limit is 256)", "invalid_argument")
	s.checkMessage(e.Message, "256", key)
	c, _ = a.acquireRaw(map[string]any{"key": "k", "lease_ms": 3600001, "wait_ms": 0})
	e = s.fails(c, prompt, "acquire with a lease of 1 h + 1 ms (the server's maximum is 1 h)", "invalid_argument")
	s.checkMessage(e.Message, "1 h", "")
}

// checkMessage: msg names want, does not contain notWhole (when given), and repeats no phrase.
func (s *S) checkMessage(msg, want, notWhole string) {
	if !strings.Contains(msg, want) {
		s.Errorf("message %q does not name %q", msg, want)
	}
	if notWhole != "" && strings.Contains(msg, notWhole) {
		s.Errorf("message of %d bytes echoes the whole %d-byte key; a message shows at most a prefix of it", len(msg), len(notWhole))
	}
	if p := repeatedPhrase(msg, 16); p != "" {
		s.Errorf("message %q says %q twice", msg, p)
	}
}

// repeatedPhrase returns a run of at least n bytes that occurs twice in msg without overlapping
// ("" if none), outside runs of one repeated byte (a key of "kkkk...").
func repeatedPhrase(msg string, n int) string {
	for i := 0; i+n <= len(msg); i++ {
		p := msg[i : i+n]
		if strings.Count(p, p[:1]) == n {
			continue
		}
		if strings.Contains(msg[i+n:], p) {
			return p
		}
	}
	return ""
}

// scStartupWaitVisible: during the server's start-up wait (here a fixed 3 s) a timed-out
// acquire says why, and INSPECT shows the wait (it showed a free key, unexplained).
func scStartupWaitVisible(s *S) {
	t := s.server(targetConfig{Env: []string{"TICKETING_STARTUP_GRACE=3s"}})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	in := s.inspect(r, "k")
	if in.Flags&wire.InspectStartup == 0 || in.LockDelay == 0 {
		s.Errorf("R's INSPECT during the start-up wait: flags %#x, lock-delay %d ms; want STARTUP and the time left", in.Flags, in.LockDelay)
	}
	c, _ := a.acquire("k", 5*time.Second, acquireArgs{wait: waitFor(300 * time.Millisecond)})
	e := s.fails(c, prompt, "acquire with wait 300 ms during the start-up wait", "not_acquired")
	if !strings.Contains(e.Message, "start-up wait") {
		s.Errorf("the not_acquired message %q does not say that the server is in its start-up wait", e.Message)
	}
}

// scFrozenLeader: a leader frozen with SIGSTOP (its kernel still accepts connections) is left
// as fast as a dead one: a connected client's next acquire is served by the new leader well
// within the session grace (5 s), with default settings. (Clients waited out the whole freeze:
// median 3.9 s for a 2-5 s freeze.) make bench measures the time by fault kind.
func scFrozenLeader(s *S) {
	t := s.server(targetConfig{})
	a := s.connect(s.d, t, connectOpts{})
	h := a.mustAcquire("k1", 10*time.Second, acquireArgs{}, prompt)
	ct, ok := t.Target.(*clusterTarget)
	if !ok {
		s.Fatalf("frozen_leader needs a cluster target")
	}
	s.Step("SIGSTOP the leader")
	thaw, err := ct.FreezeLeader()
	if err != nil {
		s.Fatalf("freeze: %v", err)
	}
	defer func() {
		s.Step("SIGCONT the old leader")
		if err := thaw(); err != nil {
			s.Errorf("thaw: %v", err)
		}
	}()
	start := time.Now()
	c, lock := a.acquire("k2", 10*time.Second, acquireArgs{wait: waitFor(10 * time.Second)})
	h2 := s.granted(a, c, lock, 3*time.Second, "A's acquire with the leader frozen")
	s.Step("served by the new leader after %v", time.Since(start).Round(time.Millisecond))
	s.expectNotLost(h)
	s.releaseAny(h2, "k2", prompt)
	s.releaseAny(h, "k1", prompt)
}
