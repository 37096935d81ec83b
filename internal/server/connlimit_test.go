package server

import (
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// A handshake holds its connection slot from CHALLENGE OK on, and gives it back on every path
// that does not attach (no AUTH, a wrong token); an attached connection gives it back when it
// closes.
func TestConnectionSlotTakenAtChallengeAndGivenBack(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxConnections = 1; c.Tokens = []string{"good"} })
	slots := func(n int64) func() bool { return func() bool { return ts.attached.Load() == n } }
	hello := func(c *rawClient) wire.Challenge {
		c.write(wire.AppendHello(nil, &wire.Hello{Version: wire.Version, SessionID: c.sid}))
		return c.readChallenge()
	}

	// Past HELLO, before AUTH: the slot is held, and the next HELLO is refused.
	quiet := dialRaw(t, ts.addr)
	if ch := hello(quiet); ch.Status != wire.StatusOK {
		t.Fatalf("first HELLO: %+v", ch)
	}
	waitFor(t, 5*time.Second, "the slot taken", slots(1))
	other := dialRaw(t, ts.addr)
	if ch := hello(other); ch.Status != wire.StatusBusy || ch.Detail != wire.LimitConnections {
		t.Fatalf("HELLO with the only slot held by a handshake: %+v", ch)
	}
	quiet.nc.Close() // no AUTH: the slot comes back
	waitFor(t, 5*time.Second, "the slot given back after a handshake without AUTH", slots(0))

	// A wrong token gives it back too.
	if st := dialRaw(t, ts.addr).handshake("bad"); st != wire.StatusAuthFailed {
		t.Fatalf("wrong token: %v", st)
	}
	waitFor(t, 5*time.Second, "the slot given back after AUTH_FAILED", slots(0))

	// An attached connection holds it until it closes.
	c := connect(t, ts.addr, "good")
	if st := dialRaw(t, ts.addr).handshake("good"); st != wire.StatusBusy {
		t.Fatalf("second connection at the limit: %v", st)
	}
	c.nc.Close()
	waitFor(t, 5*time.Second, "the slot given back when the connection closed", slots(0))
	connect(t, ts.addr, "good")
	if _, _, _, n := ts.Stats(); n != 1 {
		t.Fatalf("%d connections served, limit 1", n)
	}
}

// At the connection limit, a client resuming its session over a new connection (its old one
// half-open: still counted) is let in and takes the session over, which gives the old slot
// back; a new session is still refused.
func TestResumeAtConnectionLimit(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxConnections = 2; c.SessionGrace = 5 * time.Second })
	a := connect(t, ts.addr, "")
	tok := a.expectAnswerTo(acquire(1, "k", 60000, 0), wire.StatusOK).Token
	connect(t, ts.addr, "") // the second slot
	if st := dialRaw(t, ts.addr).handshake(""); st != wire.StatusBusy {
		t.Fatalf("a new session at the limit: %v", st)
	}
	b := a.reconnect(t, ts.addr, "") // a's connection is still open: half-open as far as a knows
	if !b.resumed() {
		t.Fatalf("resume at the limit: challenge %+v welcome %+v", b.challenge, b.welcome)
	}
	a.expectClosed(2 * time.Second)
	waitFor(t, 5*time.Second, "the old slot given back", func() bool { return ts.attached.Load() == 2 })
	if r := b.roundTrip(release(2, "k", tok)); r.Status != wire.StatusOK {
		t.Fatalf("release of the resumed lock: %v", r.Status)
	}
	if st := dialRaw(t, ts.addr).handshake(""); st != wire.StatusBusy {
		t.Fatalf("a new session at the limit after the takeover: %v", st)
	}
}
