package server

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// The protocol's edges of PROTOCOL.md "Request ids" and "Retries and stored outcomes", byte by
// byte against the real server.

func ping(id uint64) wire.Request { return wire.Request{Op: wire.OpPing, ID: id} }

func expectInvalidID(t *testing.T, what string, r wire.Response) {
	t.Helper()
	if r.Status != wire.StatusInvalid || r.Detail != wire.FieldRequestID {
		t.Fatalf("%s: %+v, want INVALID/REQUEST_ID", what, r)
	}
}

// A PING's id must be above every id its connection has carried; it does not count for the
// session (the next request may take any higher id).
func TestPingFollowsTheConnectionsIDs(t *testing.T) {
	ts := startServer(t, nil)
	a := connect(t, ts.addr, "")
	if r := a.roundTrip(acquire(1, "k", 30000, 0)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
	if r := a.roundTrip(ping(11)); r.Status != wire.StatusOK {
		t.Fatalf("PING above the highest: %+v", r)
	}
	expectInvalidID(t, "the same PING id again", a.roundTrip(ping(11)))
	expectInvalidID(t, "a PING id below one already used", a.roundTrip(ping(6)))
	expectInvalidID(t, "a PING reusing an ACQUIRE's id", a.roundTrip(ping(1)))
	if r := a.roundTrip(ping(12)); r.Status != wire.StatusOK {
		t.Fatalf("the next PING: %+v", r)
	}
	// The session's highest id is 1 (PINGs do not count for it): a request with id 5 is new.
	if r := a.roundTrip(acquire(5, "k2", 30000, 0)); r.Status != wire.StatusOK {
		t.Fatalf("a new request under the connection's highest PING id: %+v", r)
	}
}

// On a resumed connection, a request under the id of a held or queued ACQUIRE, or of a stored
// outcome, with another op is refused, never run: it is not a retry of that request.
func TestRetryWithAnotherOpIsRefused(t *testing.T) {
	ts := startServer(t, withGrace(5*time.Second))
	b := connect(t, ts.addr, "")
	if r := b.roundTrip(acquire(1, "busy", 30000, 0)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
	a := connect(t, ts.addr, "")
	g := a.roundTrip(acquire(1, "k", 30000, 0))
	if g.Status != wire.StatusOK {
		t.Fatal(g.Status)
	}
	a.send(acquire(2, "busy", 30000, wire.WaitForever)) // queued behind b
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 1 })
	if r := a.roundTrip(release(3, "none", 7)); r.Status != wire.StatusNotHeld {
		t.Fatal(r.Status)
	}
	a.nc.Close()
	a = a.reconnect(t, ts.addr, "")
	if !a.resumed() {
		t.Fatal("not resumed")
	}
	expectInvalidID(t, "EXTEND under a held ACQUIRE's id", a.roundTrip(wire.Request{Op: wire.OpExtend, ID: 1, Key: []byte("k"), Token: g.Token, Lease: 1000}))
	expectInvalidID(t, "INSPECT under a held ACQUIRE's id", a.roundTrip(wire.Request{Op: wire.OpInspect, ID: 1, Key: []byte("k")}))
	expectInvalidID(t, "RELEASE under a held ACQUIRE's id", a.roundTrip(release(1, "k", g.Token)))
	expectInvalidID(t, "INSPECT under a queued ACQUIRE's id", a.roundTrip(wire.Request{Op: wire.OpInspect, ID: 2, Key: []byte("busy")}))
	expectInvalidID(t, "INSPECT under a stored RELEASE's id", a.roundTrip(wire.Request{Op: wire.OpInspect, ID: 3, Key: []byte("none")}))
	// Nothing ran: the lock keeps its 30 s lease and its holder, the acquire its place.
	r := a.roundTrip(wire.Request{Op: wire.OpInspect, ID: 4, Key: []byte("k"), Token: g.Token})
	if r.Status != wire.StatusOK || r.Lease < 25000 || binary.BigEndian.Uint32(r.Data[8:])&wire.InspectTokenMatch == 0 {
		t.Fatalf("the held lock after the refused requests: %+v", r)
	}
	if ts.waiters() != 1 {
		t.Fatalf("waiters %d, want the queued acquire still there", ts.waiters())
	}
	// A faithful retry still works: the held ACQUIRE is answered with its token.
	if r := a.roundTrip(acquire(1, "k", 30000, 0)); r.Status != wire.StatusOK || r.Token != g.Token {
		t.Fatalf("faithful retry: %+v", r)
	}
}

// Request id 2^64-1 is reserved: a session at it could send nothing new.
func TestLastRequestIDIsReserved(t *testing.T) {
	ts := startServer(t, nil)
	a := connect(t, ts.addr, "")
	expectInvalidID(t, "id 2^64-1", a.roundTrip(acquire(math.MaxUint64, "k", 30000, 0)))
	expectInvalidID(t, "PING id 2^64-1", a.roundTrip(ping(math.MaxUint64)))
	if r := a.roundTrip(acquire(math.MaxUint64-1, "k", 30000, 0)); r.Status != wire.StatusOK {
		t.Fatalf("id 2^64-2: %+v", r)
	}
}

// With the session's stored outcomes full, an ACQUIRE granted at once (it stores no outcome)
// is still answered; one that could end without a grant gets BUSY/INFLIGHT.
func TestFullOutcomesStillGrantAtOnce(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxOutcomes = 2 })
	a := connect(t, ts.addr, "")
	// The first grant of a fresh server waits for its first durable token block (PROTOCOL.md,
	// "ACQUIRE"): after it, grants need no storage for a while.
	if r := a.roundTrip(acquire(1, "warm", 30000, 0)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
	for id := uint64(2); id <= 3; id++ {
		if r := a.roundTrip(release(id, "none", 1)); r.Status != wire.StatusNotHeld {
			t.Fatal(r.Status)
		}
	}
	g := a.roundTrip(acquire(4, "free", 30000, 0))
	if g.Status != wire.StatusOK {
		t.Fatalf("try-once ACQUIRE of a free key with outcomes full: %+v", g)
	}
	if r := a.roundTrip(acquire(5, "free", 30000, 0)); r.Status != wire.StatusBusy || r.Detail != wire.LimitInflight {
		t.Fatalf("try-once ACQUIRE of a held key with outcomes full: %+v", r)
	}
	if r := a.roundTrip(acquire(6, "free", 30000, wire.WaitForever)); r.Status != wire.StatusBusy || r.Detail != wire.LimitInflight {
		t.Fatalf("waiting ACQUIRE of a held key with outcomes full: %+v", r)
	}
}

// The auth back-off of docs/operations.md: 10 ms doubling per failure in quick succession, at
// most 2 s, decaying by one step per second without failures.
func TestAuthBackoffSchedule(t *testing.T) {
	var f authFailures
	f.init()
	t0 := time.Unix(1_000_000, 0)
	var got []time.Duration
	for i := 0; i < 10; i++ {
		d, ok := f.fail("10.0.0.1", t0)
		if !ok {
			t.Fatal("refused")
		}
		f.done("10.0.0.1")
		got = append(got, d)
	}
	want := []time.Duration{10, 20, 40, 80, 160, 320, 640, 1280, 2000, 2000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("failure %d in quick succession waits %v, want %v (all: %v)", i+1, got[i], want[i]*time.Millisecond, got)
		}
	}
	// Score 10 after those; 7.5 s later it is 2.5 + 1 = 3.5: 40 ms.
	if d, _ := f.fail("10.0.0.1", t0.Add(7500*time.Millisecond)); d != 40*time.Millisecond {
		t.Fatalf("after 7.5 s quiet: %v, want 40ms", d)
	}
	f.done("10.0.0.1")
	// Another address is not slowed by this one.
	if d, _ := f.fail("10.0.0.2", t0); d != 10*time.Millisecond {
		t.Fatalf("another address: %v", d)
	}
}
