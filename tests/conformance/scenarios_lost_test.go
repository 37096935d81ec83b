package conformance

import (
	"fmt"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/wire"
)

func scCancelWaiting(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	tokR := s.rAcquire(r, "k", 30*time.Second)
	c, _ := a.acquire("k", 10*time.Second, acquireArgs{})
	s.waitInspect(r, "k", true, 1, 5*time.Second)
	s.Step("cancel the queued acquire")
	s.ok(s.d.send("cancel", map[string]any{"target": c.id}), prompt, "cancel")
	s.fails(c, prompt, "the cancelled acquire", "cancelled")
	s.expectInspect(r, "k", true, 0)
	s.rRelease(r, "k", tokR)
	s.expectInspect(r, "k", false, 0)
}

func scCancelRace(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	const rounds = 20
	// R's lease: 50 ms, or the target's minimum (a cluster's); the cancels spread over the
	// lease and 30 ms beyond it, so the later rounds race the hand-off at its end.
	lease := t.minLease(50 * time.Millisecond)
	spread := lease + 30*time.Millisecond
	var cancelled, grantedFirst, grantedRacing int
	for i := 0; i < rounds; i++ {
		key := fmt.Sprintf("k%d", i)
		delay := time.Duration(i) * spread / (rounds - 1)
		s.Step("round %d: R holds %s for %v; A's acquire is cancelled %v after it is sent", i+1, key, lease, delay)
		s.rAcquire(r, key, lease)
		c, lock := a.acquire(key, 10*time.Second, acquireArgs{})
		time.Sleep(time.Until(c.sent.Add(delay)))
		if c.isDone() { // granted (or failed) before the cancel could be asked for
			h := s.granted(a, c, lock, prompt, "acquire "+key)
			grantedFirst++
			s.releaseAny(h, key, prompt)
		} else {
			cc := s.d.send("cancel", map[string]any{"target": c.id})
			if err := c.wait(prompt); err != nil {
				s.Fatalf("round %d: the acquire did not finish within %v of the cancel: %v", i+1, prompt, err)
			}
			if err := cc.wait(prompt); err != nil {
				s.Fatalf("round %d: cancel: %v", i+1, err)
			}
			if !cc.reply.OK && !(c.seq < cc.seq) {
				s.Fatalf("round %d: cancel failed %s while its acquire was pending", i+1, cc.reply.Error)
			}
			switch {
			case c.reply.OK: // the grant won the race before the driver took the cancel
				h := s.granted(a, c, lock, prompt, "acquire "+key)
				grantedRacing++
				s.releaseAny(h, key, prompt)
			case c.reply.Error.Kind == "cancelled":
				cancelled++
			default:
				s.Fatalf("round %d: cancelled acquire failed %s; want cancelled (or a grant)", i+1, c.reply.Error)
			}
		}
		s.eventually(prompt, fmt.Sprintf("round %d: %s free and nothing queued", i+1, key), func() (bool, string) {
			in := s.inspect(r, key)
			return !in.held() && in.Waiters == 0, in.String()
		})
	}
	s.Step("%d rounds: %d cancelled, %d granted before the cancel was sent, %d granted although cancelled (released by the runner)",
		rounds, cancelled, grantedFirst, grantedRacing)
}

func scLostOnExpiry(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	b := s.connect(s.d, t, connectOpts{})
	hA := a.mustAcquire("k", 400*time.Millisecond, acquireArgs{}, prompt)
	cB, lockB := b.acquire("k", 10*time.Second, acquireArgs{})
	hB := s.granted(b, cB, lockB, 400*time.Millisecond+prompt, "B's acquire (after A's lease ends)")
	ev := s.expectLostEvent(hA, "expired", prompt)
	if ev.seq > cB.seq {
		s.Fatalf("A's lost event came %v after B's grant; want it before", ev.at.Sub(cB.at))
	}
	s.Step("A's lost event came %v before B's grant", cB.at.Sub(ev.at))
	if hB.token <= hA.token {
		s.Fatalf("B's token %d not above A's %d", hB.token, hA.token)
	}
	s.lockLost(hA.release(), prompt, "A's release after expiry", "expired")
	s.expectSingleEvent(hA)
	s.ok(hB.release(), prompt, "B's release")
	s.expectInspect(r, "k", false, 0)
}

func scKeepalive(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	p := s.proxy(t)
	a := s.connect(s.d, t, connectOpts{endpoints: p.addrs()})
	c, lock := a.acquire("k", 600*time.Millisecond, acquireArgs{keepalive: true})
	h := s.granted(a, c, lock, prompt, "acquire k (lease 600 ms, keep-alive)")
	time.Sleep(time.Until(c.at.Add(2 * time.Second)))
	s.Step("2 s after the grant")
	s.expectNotLost(h)
	in, err := r.inspect("k", h.token)
	if err != nil {
		s.Fatalf("%v", err)
	}
	s.log.add(time.Now(), "R INSPECT %q token %d: %s", "k", h.token, in)
	if !in.held() || !in.tokenMatch() {
		s.Fatalf("2 s after the grant the server says token %d does not hold k: %s", h.token, in)
	}
	if s.d.features["verify"] {
		s.expectVerify(h, true)
	}
	rc := h.release()
	s.ok(rc, prompt, "release")
	s.expectInspect(r, "k", false, 0)
	observe(500 * time.Millisecond)
	s.expectInspect(r, "k", false, 0)
	s.expectNotLost(h)

	// What the proxy saw: extends while held, none after the release was answered.
	frames := p.frames()
	var relID uint64
	var relAnswered time.Time
	extends := 0
	for _, f := range frames {
		if f.Dir == testserver.ClientToServer && f.Op() == byte(wire.OpRelease) {
			var req wire.Request
			if _, err := wire.DecodeRequest(f.Bytes, wire.MaxKeyLen, &req); err == nil && req.Token == h.token {
				relID = req.ID
			}
		}
		if f.Dir == testserver.ServerToClient && relID != 0 && relAnswered.IsZero() && f.Op() == byte(wire.OpRelease) {
			var resp wire.Response
			if _, err := wire.DecodeResponse(f.Bytes, wire.MaxDataLen, &resp); err == nil && resp.ID == relID {
				relAnswered = f.At
			}
		}
		if f.Dir == testserver.ClientToServer && f.Op() == byte(wire.OpExtend) {
			if relAnswered.IsZero() {
				extends++
			} else if f.At.Sub(relAnswered) > 50*time.Millisecond {
				s.Fatalf("an EXTEND was sent %v after the RELEASE was answered: keep-alive did not stop (%s)",
					f.At.Sub(relAnswered).Round(time.Millisecond), describeRequest(f.Bytes))
			}
		}
	}
	if relAnswered.IsZero() {
		s.Fatalf("the proxy saw no answered RELEASE of token %d", h.token)
	}
	s.Step("%d EXTENDs sent while held", extends)
	if extends < 3 {
		s.Fatalf("only %d EXTENDs in 2 s of a 600 ms lease with keep-alive", extends)
	}
}

func scWithLockLost(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	var after uint64
	keeps := s.d.features["with_lock_keepalive"]
	if keeps {
		after = s.probeToken(r)
	}
	s.Step("with_lock k, lease 300 ms, hold 900 ms")
	c := a.withLock("k", 300*time.Millisecond, 900*time.Millisecond)
	if keeps {
		// The helper keeps its lease alive, so the runner ends the lease itself: EXTEND to 1 ms
		// (a cluster's minimum lease there) by the holder's token (the owner is the token).
		s.waitInspect(r, "k", true, 0, 5*time.Second)
		tok := s.holderToken(r, "k", after)
		short := t.minLease(time.Millisecond)
		resp, err := r.extend("k", tok, short)
		if err != nil || resp.Status != wire.StatusOK {
			s.Fatalf("R's EXTEND of the helper's lock to %v: %v %s", short, err, describeFrame(resp))
		}
	}
	s.lockLost(c, 900*time.Millisecond+prompt, "with_lock whose lease ran out during the body", "expired")
	s.Step("with_lock k, lease 2 s, hold 100 ms")
	s.ok(a.withLock("k", 2*time.Second, 100*time.Millisecond), 100*time.Millisecond+prompt, "with_lock (lease 2 s, hold 100 ms)")
	s.expectInspect(r, "k", false, 0)
}

func scLostOnRestart(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	b := s.connect(s.d, t, connectOpts{})
	hA := a.mustAcquire("k", 10*time.Second, acquireArgs{keepalive: s.d.features["keepalive"]}, prompt)
	s.rAcquire(r, "k2", 30*time.Second)
	cB, _ := b.acquire("k2", 10*time.Second, acquireArgs{})
	s.waitInspect(r, "k2", true, 1, 5*time.Second)
	s.Step("SIGKILL the server")
	t.kill()
	s.Step("restart it on the same port and data directory")
	if err := t.Restart(); err != nil {
		s.Fatalf("restart: %v", err)
	}
	s.Step("restarted")
	s.expectLostEvent(hA, "server_restarted", 3*time.Second)
	s.fails(cB, 3*time.Second, "B's queued acquire across the restart", "server_restarted")
	r2 := t.R()
	observe(300 * time.Millisecond) // a client that re-queued B would show up now
	s.expectInspect(r2, "k2", false, 0)
	e := s.fails(hA.release(), prompt, "A's release after the restart", "lock_lost")
	s.Step("A's release: lock_lost reason %q", e.Reason)
	c := s.connect(s.d, t, connectOpts{})
	hC := c.mustAcquire("k", 5*time.Second, acquireArgs{wait: waitFor(0)}, prompt)
	s.ok(hC.release(), prompt, "C's release")
	s.expectSingleEvent(hA)
}

// stopInBackground sends SIGTERM (Target.Stop) and returns a channel closed when it returned.
func (s *S) stopInBackground(t *target) <-chan struct{} {
	done := make(chan struct{})
	if s.onCluster() {
		s.Step("SIGTERM the leader")
	} else {
		s.Step("SIGTERM the server")
	}
	go func() {
		defer close(done)
		if err := t.Stop(); err != nil {
			s.Errorf("graceful stop: %v", err)
		}
	}()
	return done
}

func (s *S) waitStopped(done <-chan struct{}) {
	select {
	case <-done:
		s.Step("server exited")
	case <-time.After(30 * time.Second):
		s.Fatalf("server did not exit within 30 s of SIGTERM")
	}
}

func scStopping(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	hA := a.mustAcquire("k", 10*time.Second, acquireArgs{}, prompt)
	tokR := s.rAcquire(r, "k2", 10*time.Second)
	stopped := s.stopInBackground(t)
	// The server's side: R, a holder too, gets EXPIRED reason STOPPING before its connection ends.
	if _, ok := r.waitPush(func(f rawFrame) bool {
		return f.Op == wire.OpExpired && f.Token == tokR && f.Detail == wire.ExpiredStopping
	}, prompt); !ok {
		s.Errorf("R (holding k2) got no EXPIRED reason STOPPING before its connection closed")
	}
	s.expectLostEvent(hA, "server_stopping", prompt)
	s.waitStopped(stopped)
	s.expectSingleEvent(hA)
}

func scShuttingDown(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	s.rAcquire(r, "k", 30*time.Second)
	c, _ := a.acquire("k", 10*time.Second, acquireArgs{})
	s.waitInspect(r, "k", true, 1, 5*time.Second)
	stopped := s.stopInBackground(t)
	s.fails(c, prompt, "the queued acquire when the server stops", "shutting_down")
	s.waitStopped(stopped)
}
