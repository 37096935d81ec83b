package conformance

import (
	"fmt"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/wire"
)

// scDeadlineAfterResume: PROTOCOL.md, "The lost signal". Two grants that reach the client after
// its session resumed: (1) a hand-off decided before the client re-sent its ACQUIRE and read
// after it (the proxy holds back the new connection's WELCOME and the grant behind it for
// 300 ms); (2) a waiter re-sent after a reconnect and granted a second later. In both the
// client's deadline must not be after the server's lease end, nor earlier than first send +
// (detail + lease)(1 − 2ρ) allows.
func scDeadlineAfterResume(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	p := s.proxy(t)
	a := s.connect(s.d, t, connectOpts{endpoints: p.addrs()})
	lease := 3 * time.Second

	s.Step("part 1: a hand-off decided before the re-send, read 300 ms after it")
	tokR := s.rAcquire(r, "k", 30*time.Second)
	c, lock := a.acquire("k", lease, acquireArgs{})
	s.waitInspect(r, "k", true, 1, 5*time.Second)
	pc := s.proxiedConn(p, a)
	s.Step("hold back everything the server sends on A's next connection; reset A's connection")
	p.holdNew(true)
	pc.Reset()
	pc2 := s.nextConn(p, pc, "A's reconnection")
	s.waitFrame(pc2, 5*time.Second, "the WELCOME of A's resumed session (held back)", func(f testserver.Frame, _ wire.Response) bool {
		return f.Dir == testserver.ServerToClient && wire.Op(f.Op()) == wire.OpWelcome
	})
	s.rRelease(r, "k", tokR)
	g, gAt := s.grantFrame(pc2, 5*time.Second)
	time.Sleep(300 * time.Millisecond)
	s.Step("release the held WELCOME and grant to A")
	p.holdNew(false)
	if err := pc2.ReleaseServerBytes(); err != nil {
		s.Fatalf("release held bytes: %v", err)
	}
	h := s.granted(a, c, lock, 5*time.Second, "A's acquire across the resume")
	s.logFrames(pc2, "A")
	s.checkDeadline(h, c.sent, g, gAt)
	s.releaseAny(h, "k", prompt)

	s.Step("part 2: a waiter re-sent after a reconnect, granted a second later")
	tokR = s.rAcquire(r, "k2", 30*time.Second)
	c, lock = a.acquire("k2", lease, acquireArgs{})
	s.waitInspect(r, "k2", true, 1, 5*time.Second)
	pc = s.proxiedConn(p, a)
	pc.Reset()
	pc2 = s.nextConn(p, pc, "A's reconnection")
	s.waitFrame(pc2, 5*time.Second, "A's re-sent ACQUIRE", func(f testserver.Frame, _ wire.Response) bool {
		return f.Dir == testserver.ClientToServer && wire.Op(f.Op()) == wire.OpAcquire
	})
	time.Sleep(time.Second)
	s.rRelease(r, "k2", tokR)
	g, gAt = s.grantFrame(pc2, 5*time.Second)
	h = s.granted(a, c, lock, 5*time.Second, "A's acquire granted after its re-send")
	s.logFrames(pc2, "A")
	s.checkDeadline(h, c.sent, g, gAt)
	s.releaseAny(h, "k2", prompt)
	s.expectNoEvent(h)
}

// holdNew makes every proxy hold back the server's bytes on connections it accepts from now on.
func (ps proxies) holdNew(on bool) {
	for _, p := range ps {
		p.HoldNew(on)
	}
}

// nextConn waits for the client's connection through ps after old.
func (s *S) nextConn(ps proxies, old *testserver.ProxyConn, what string) *testserver.ProxyConn {
	var pc *testserver.ProxyConn
	s.eventually(5*time.Second, what, func() (bool, string) {
		for _, c := range ps.open() {
			if c != old && c.ID > old.ID {
				pc = c
				return true, ""
			}
		}
		return false, "no new connection"
	})
	return pc
}

// waitFrame waits until pc has carried a frame that match accepts; it returns that frame.
func (s *S) waitFrame(pc *testserver.ProxyConn, within time.Duration, what string, match func(testserver.Frame, wire.Response) bool) (testserver.Frame, wire.Response) {
	var hit testserver.Frame
	var resp wire.Response
	s.eventually(within, what, func() (bool, string) {
		for _, f := range pc.Frames() {
			var r wire.Response
			if f.Dir == testserver.ServerToClient && wire.Op(f.Op()) >= wire.OpAcquire {
				if _, err := wire.DecodeResponse(f.Bytes, wire.MaxDataLen, &r); err != nil {
					continue
				}
			}
			if match(f, r) {
				hit, resp = f, r
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d frames so far", len(pc.Frames()))
	})
	return hit, resp
}

// grantFrame waits for the first ACQUIRE OK the server sent on pc: the grant as decided, and when
// it reached the proxy (after the server decided it).
func (s *S) grantFrame(pc *testserver.ProxyConn, within time.Duration) (wire.Response, time.Time) {
	f, r := s.waitFrame(pc, within, fmt.Sprintf("a grant on connection %d", pc.ID), func(f testserver.Frame, r wire.Response) bool {
		return f.Dir == testserver.ServerToClient && r.Op == wire.OpAcquire && r.Status == wire.StatusOK
	})
	s.Step("the server's grant: token %d, lease_ms %d, detail %d (at the proxy %s)", r.Token, r.Lease, r.Detail, f.At.Sub(s.start).Round(time.Millisecond))
	return r, f.At
}

// checkDeadline compares the lock's local deadline (lock_state's deadline_in_ms, read between
// sending the command and reading its reply) with the server's lease end (no later than the
// grant frame's arrival at the proxy plus its lease) and with the rule's value from the earliest
// moment the client could have sent the ACQUIRE (sent: when the runner sent the acquire command).
func (s *S) checkDeadline(h held, sent time.Time, g wire.Response, grantAt time.Time) {
	c := h.state()
	rep := s.ok(c, prompt, "lock_state "+h.lock)
	var in float64
	if err := rep.decode("deadline_in_ms", &in); err != nil {
		s.Fatalf("lock_state %s: %v (the local deadline, in ms from now: DRIVER.md)", h.lock, err)
	}
	inD := time.Duration(in * float64(time.Millisecond))
	lo, hi := c.sent.Add(inD), c.at.Add(inD)
	end := grantAt.Add(time.Duration(g.Lease) * time.Millisecond)
	rule := time.Duration(float64(g.Detail+g.Lease) * (1 - 2*float64(wire.ClockRateBoundPPM)/1e6) * float64(time.Millisecond))
	want := sent.Add(rule)
	s.Step("A's deadline in %v..%v, the server's lease ends by %v, the rule's minimum %v",
		lo.Sub(s.start).Round(time.Millisecond), hi.Sub(s.start).Round(time.Millisecond),
		end.Sub(s.start).Round(time.Millisecond), want.Sub(s.start).Round(time.Millisecond))
	if late := lo.Sub(end); late > 2*time.Millisecond {
		s.Fatalf("%s's local deadline is %v after the server's lease end: another client can be granted the key while %s still believes it holds it", h.lock, late.Round(time.Millisecond), h.lock)
	}
	if early := want.Sub(hi); early > 5*time.Millisecond {
		s.Fatalf("%s's local deadline is %v earlier than first send + (detail + lease)(1 − 2ρ): the lock would be given up while the server still holds it for it (the deadline counts from the first send of the request, plus detail)", h.lock, early.Round(time.Millisecond))
	}
}
