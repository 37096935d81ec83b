package conformance

import (
	"fmt"
	"time"
)

// The scenarios, in SCENARIOS.md's order. Each function implements its paragraph there.
var scenarios = []scenario{
	{name: "basic", run: scBasic},
	{name: "try_acquire", run: scTryAcquire},
	{name: "wait_timeout", run: scWaitTimeout},
	{name: "fifo", run: scFifo},
	{name: "fifo_cross", cross: true, needs: []string{"locks"}, run: scFifoCross},
	{name: "owner_is_token", needs: []string{"locks"}, run: scOwnerIsToken},
	{name: "extend", needs: []string{"locks"}, exclusive: true, run: scExtend},
	{name: "verify", needs: []string{"locks", "verify"}, run: scVerify},
	{name: "refuse_held", needs: []string{"locks", "refuse_held"}, run: scRefuseHeld},
	{name: "cancel_waiting", needs: []string{"cancel"}, run: scCancelWaiting},
	{name: "cancel_race", needs: []string{"cancel"}, run: scCancelRace},
	{name: "lost_on_expiry", needs: []string{"locks", "lost_events"}, exclusive: true, run: scLostOnExpiry},
	{name: "keepalive", needs: []string{"locks", "keepalive"}, exclusive: true, run: scKeepalive},
	{name: "with_lock_lost", needs: []string{"with_lock"}, run: scWithLockLost},
	{name: "lost_on_restart", needs: []string{"locks", "lost_events"}, run: scLostOnRestart, cluster: scLostOnRestartCluster},
	{name: "stopping", needs: []string{"locks", "lost_events"}, run: scStopping, cluster: scStoppingCluster},
	{name: "resume_queue_place", needs: []string{"locks"}, run: scResumeQueuePlace},
	{name: "retry_idempotent", needs: []string{"locks"}, run: scRetryIdempotent, cluster: scRetryIdempotentCluster},
	{name: "release_retry", needs: []string{"locks"}, run: scReleaseRetry, cluster: scReleaseRetryCluster},
	{name: "deadline_after_resume", needs: []string{"locks"}, run: scDeadlineAfterResume},
	{name: "ack_outcomes", needs: []string{"locks"}, run: scAckOutcomes},
	{name: "unreachable", run: scUnreachable},
	{name: "connect_election", needs: []string{"connect_election"}, run: scConnectElection},
	{name: "half_open", run: scHalfOpen},
	{name: "frozen_server", needs: []string{"request_timeout"}, run: scFrozenServer},
	{name: "wrong_token", run: scWrongToken},
	{name: "auth_downgrade", run: scAuthDowngrade},
	{name: "tls", needs: []string{"tls"}, run: scTLS},
	{name: "mtls", needs: []string{"mtls"}, run: scMTLS},
	{name: "bad_arguments", run: scBadArguments},
	{name: "shutting_down", run: scShuttingDown, cluster: scShuttingDownCluster},
	{name: "release_lost_at_once", needs: []string{"locks", "lost_events"}, run: scReleaseLostAtOnce},
	{name: "close_withdraws_waiters", needs: []string{"locks"}, run: scCloseWithdrawsWaiters},
	{name: "first_call_after_restart", single: true, run: scFirstCallAfterRestart},
	{name: "timeout_while_reconnecting", needs: []string{"locks", "request_timeout"}, single: true, run: scTimeoutWhileReconnecting},
	{name: "error_messages", run: scErrorMessages},
	{name: "startup_wait_visible", single: true, run: scStartupWaitVisible},
	{name: "frozen_leader", needs: []string{"locks"}, clusterOnly: true, run: scFrozenLeader},
}

func scBasic(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	h := a.mustAcquire("k", 5*time.Second, acquireArgs{}, prompt)
	s.expectInspect(r, "k", true, 0)
	s.releaseAny(h, "k", prompt)
	s.expectInspect(r, "k", false, 0)
	s.expectNotLost(h)
}

func scTryAcquire(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	b := s.connect(s.d, t, connectOpts{})
	tokR := s.rAcquire(r, "k", 10*time.Second)

	s.Step("A try_acquires k while R holds it")
	c, _ := a.tryAcquire("k", 5*time.Second)
	rep := s.ok(c, prompt, "try_acquire of a held key")
	var acquired bool
	if err := rep.decode("acquired", &acquired); err != nil {
		s.Fatalf("try_acquire: %v", err)
	}
	if acquired {
		s.Fatalf("try_acquire of a key R holds: acquired; want not acquired")
	}
	s.expectInspect(r, "k", true, 0)

	s.rRelease(r, "k", tokR)
	s.Step("A try_acquires k, now free")
	c, lock := a.tryAcquire("k", 5*time.Second)
	rep = s.ok(c, prompt, "try_acquire of a free key")
	if err := rep.decode("acquired", &acquired); err != nil {
		s.Fatalf("try_acquire: %v", err)
	}
	if !acquired {
		s.Fatalf("try_acquire of a free key: not acquired")
	}
	tok, err := rep.token("token")
	if err != nil {
		s.Fatalf("try_acquire: %v", err)
	}
	if tok <= tokR {
		s.Fatalf("try_acquire token %d; want above R's %d", tok, tokR)
	}
	h := held{c: a, lock: lock, token: tok}

	s.Step("B acquires k with wait_ms 0 while A holds it")
	c, _ = b.acquire("k", 5*time.Second, acquireArgs{wait: waitFor(0)})
	s.fails(c, prompt, "acquire with wait_ms 0 of a held key", "not_acquired")
	s.expectInspect(r, "k", true, 0)
	s.releaseAny(h, "k", prompt)
	s.expectInspect(r, "k", false, 0)
}

func scWaitTimeout(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	s.rAcquire(r, "k", 30*time.Second)
	c, _ := a.acquire("k", 5*time.Second, acquireArgs{wait: waitFor(300 * time.Millisecond)})
	s.fails(c, prompt+300*time.Millisecond, "acquire with wait_ms 300", "not_acquired")
	if c.elapsed() < 300*time.Millisecond || c.elapsed() > prompt {
		s.Fatalf("not_acquired after %v; want at least 300 ms and within %v", c.elapsed(), prompt)
	}
	s.expectInspect(r, "k", true, 0)
}

// queueInOrder makes each client acquire key and waits until R sees it queued, one by one.
func (s *S) queueInOrder(r *rawClient, key string, clients []*client, lease time.Duration) ([]*call, []string) {
	calls := make([]*call, len(clients))
	locks := make([]string, len(clients))
	for i, c := range clients {
		calls[i], locks[i] = c.acquire(key, lease, acquireArgs{})
		s.waitInspect(r, key, true, uint32(i+1), 5*time.Second)
	}
	return calls, locks
}

// grantInOrder waits for each acquire in turn, checks that no later one finished before it and
// that tokens strictly increase above after, and releases each grant at once.
func (s *S) grantInOrder(clients []*client, calls []*call, locks []string, key string, after uint64) []held {
	var out []held
	last := after
	for i, c := range calls {
		h := s.granted(clients[i], c, locks[i], 5*time.Second, fmt.Sprintf("acquire #%d (%s %s)", i+1, clients[i].d.name, clients[i].name))
		for j := i + 1; j < len(calls); j++ {
			if calls[j].isDone() {
				s.Fatalf("acquire #%d (%s %s) finished before #%d released: %s", j+1, clients[j].d.name, clients[j].name, i+1, clip(calls[j].reply.raw, 200))
			}
		}
		if h.token <= last {
			s.Fatalf("acquire #%d got token %d, not above %d", i+1, h.token, last)
		}
		last = h.token
		s.releaseAny(h, key, prompt)
		out = append(out, h)
	}
	return out
}

func scFifo(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	clients := []*client{s.connect(s.d, t, connectOpts{}), s.connect(s.d, t, connectOpts{}), s.connect(s.d, t, connectOpts{})}
	tokR := s.rAcquire(r, "k", 30*time.Second)
	calls, locks := s.queueInOrder(r, "k", clients, 10*time.Second)
	s.rRelease(r, "k", tokR)
	s.grantInOrder(clients, calls, locks, "k", tokR)
	s.expectInspect(r, "k", false, 0)
}

func scFifoCross(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	var clients []*client
	for round := 0; round < 2; round++ {
		for _, d := range s.drivers {
			clients = append(clients, s.connect(d, t, connectOpts{}))
		}
	}
	tokR := s.rAcquire(r, "k", 60*time.Second)
	calls, locks := s.queueInOrder(r, "k", clients, 10*time.Second)
	s.rRelease(r, "k", tokR)
	s.grantInOrder(clients, calls, locks, "k", tokR)
	s.expectInspect(r, "k", false, 0)
	for i, c := range clients {
		s.expectNotLost(held{c: c, lock: locks[i]})
	}
}

func scOwnerIsToken(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	b := s.connect(s.d, t, connectOpts{})
	h := a.mustAcquire("k", 10*time.Second, acquireArgs{}, prompt)
	s.Step("B releases k with A's token")
	s.ok(b.releaseToken("k", h.token), prompt, "B's release_token with A's token")
	s.expectInspect(r, "k", false, 0)
	s.lockLost(h.release(), prompt, "A's release after B released its lock", "not_held")
	if s.d.features["lost_events"] {
		s.expectLostEvent(h, "not_held", prompt)
		observe(200 * time.Millisecond)
		s.expectSingleEvent(h)
	}
}

func scExtend(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	c, lock := a.acquire("k", 600*time.Millisecond, acquireArgs{})
	h := s.granted(a, c, lock, prompt, "acquire k (lease 600 ms)")
	granted := c.at
	time.Sleep(time.Until(granted.Add(200 * time.Millisecond)))
	s.Step("extend to 2 s at %v after the grant", time.Since(granted).Round(time.Millisecond))
	rep := s.ok(h.extend(2*time.Second), prompt, "extend to 2000 ms")
	var lease int64
	if err := rep.decode("lease_ms", &lease); err != nil {
		s.Fatalf("extend: %v", err)
	}
	if lease != 2000 {
		s.Fatalf("extend replied lease_ms %d; want 2000", lease)
	}
	time.Sleep(time.Until(granted.Add(1200 * time.Millisecond)))
	s.Step("1200 ms after the grant")
	s.expectNotLost(h)
	in, err := r.inspect("k", h.token)
	if err != nil {
		s.Fatalf("%v", err)
	}
	s.log.add(time.Now(), "R INSPECT %q token %d: %s", "k", h.token, in)
	if !in.tokenMatch() {
		s.Fatalf("1200 ms after the grant the server says token %d does not hold k: %s", h.token, in)
	}
	if s.d.features["verify"] {
		s.expectVerify(h, true)
	}
	s.ok(h.release(), prompt, "release")
	s.expectInspect(r, "k", false, 0)
}

// expectVerify checks verify's answer.
func (s *S) expectVerify(h held, want bool) {
	rep := s.ok(h.verify(), prompt, "verify "+h.lock)
	var got bool
	if err := rep.decode("held", &got); err != nil {
		s.Fatalf("verify: %v", err)
	}
	if got != want {
		s.Fatalf("verify %s: held=%v; want %v", h.lock, got, want)
	}
}

func scVerify(s *S) {
	t := s.server(targetConfig{})
	a := s.connect(s.d, t, connectOpts{})
	b := s.connect(s.d, t, connectOpts{})
	h := a.mustAcquire("k", 10*time.Second, acquireArgs{}, prompt)
	s.expectVerify(h, true)
	s.ok(b.releaseToken("k", h.token), prompt, "B's release_token with A's token")
	s.expectVerify(h, false)
}

func scRefuseHeld(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	h := a.mustAcquire("k", 10*time.Second, acquireArgs{}, prompt)
	c, _ := a.acquire("k", 10*time.Second, acquireArgs{refuseHeld: true})
	s.fails(c, prompt, "second acquire of k with refuse_held", "already_held")
	s.expectInspect(r, "k", true, 0)
	s.ok(h.release(), prompt, "release")
}
