package server

import (
	"strings"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

func TestHandshakeRefusals(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.HandshakeTimeout = 200 * time.Millisecond })

	// Unsupported version: CHALLENGE UNSUPPORTED_VERSION with the server's version, then close.
	c := dialRaw(t, ts.addr)
	c.write(wire.AppendHello(nil, &wire.Hello{Version: 99, SessionID: c.sid}))
	if ch := c.readChallenge(); ch.Status != wire.StatusUnsupportedVersion || ch.Version != wire.Version {
		t.Fatalf("%+v", ch)
	}
	c.expectClosed(2 * time.Second)

	// A handshake that never finishes: closed after the handshake timeout, no answer.
	slow := dialRaw(t, ts.addr)
	slow.write([]byte{0, 0, 0, 52, 1}) // a partial HELLO
	start := time.Now()
	slow.expectClosed(3 * time.Second)
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Fatalf("closed after %v, before the handshake timeout", el)
	}

	// Not our protocol (an HTTP request): closed at once without an answer.
	web := dialRaw(t, ts.addr)
	web.write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	web.expectClosed(2 * time.Second)

	// The server keeps serving others.
	ok := connect(t, ts.addr, "")
	if r := ok.roundTrip(acquire(1, "k", 1000, 0)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
}

func TestConnectionLimit(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxConnections = 2 })
	connect(t, ts.addr, "")
	connect(t, ts.addr, "")
	c := dialRaw(t, ts.addr)
	c.write(wire.AppendHello(nil, &wire.Hello{Version: wire.Version, SessionID: c.sid}))
	if ch := c.readChallenge(); ch.Status != wire.StatusBusy || ch.Detail != wire.LimitConnections {
		t.Fatalf("%+v", ch)
	}
	c.expectClosed(2 * time.Second)
}

// Bad requests get their documented answer; framing errors close only that connection.
func TestBadInput(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxKeyLen = 16; c.MaxLease = time.Hour })
	bystander := connect(t, ts.addr, "")
	held := bystander.roundTrip(acquire(1, "precious", 60000, 0))

	c := connect(t, ts.addr, "")
	cases := []struct {
		name   string
		req    wire.Request
		status wire.Status
		detail uint32
	}{
		{"oversize key", acquire(1, strings.Repeat("x", 17), 1000, 0), wire.StatusInvalid, wire.FieldKey},
		{"empty key", acquire(2, "", 1000, 0), wire.StatusInvalid, wire.FieldKey},
		{"zero lease", acquire(3, "k", 0, 0), wire.StatusInvalid, wire.FieldLease},
		{"huge lease", acquire(4, "k", 0xFFFFFFFE, 0), wire.StatusInvalid, wire.FieldLease},
		{"extend zero lease", wire.Request{Op: wire.OpExtend, ID: 5, Key: []byte("precious"), Token: held.Token}, wire.StatusInvalid, wire.FieldLease},
		{"unknown op", wire.Request{Op: 0x7f, ID: 6}, wire.StatusInvalid, wire.FieldOp},
		{"flags", wire.Request{Op: wire.OpPing, ID: 7, Flags: 1}, wire.StatusInvalid, wire.FieldFlags},
		{"zero id", wire.Request{Op: wire.OpPing, ID: 0}, wire.StatusInvalid, wire.FieldRequestID},
		{"zero token", release(8, "precious", 0), wire.StatusInvalid, wire.FieldToken},
		{"wrong token", release(9, "precious", held.Token+100), wire.StatusNotHeld, 0},
	}
	for _, tc := range cases {
		r := c.roundTrip(tc.req)
		if r.Status != tc.status || r.Detail != tc.detail || r.Op != tc.req.Op {
			t.Errorf("%s: got %v detail %d op %v, want %v detail %d", tc.name, r.Status, r.Detail, r.Op, tc.status, tc.detail)
		}
		if tc.status == wire.StatusInvalid && len(r.Data) == 0 {
			t.Errorf("%s: no message", tc.name)
		}
	}
	// Duplicate id of a pending acquire.
	c.send(acquire(50, "precious", 1000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 1 })
	if r := c.roundTrip(acquire(50, "precious", 1000, wire.WaitForever)); r.Status != wire.StatusInvalid || r.Detail != wire.FieldRequestID {
		t.Errorf("duplicate id: %+v", r)
	}

	// Malformed framing: length below the header -> INVALID/LENGTH, then close.
	m := connect(t, ts.addr, "")
	m.write([]byte{0, 0, 0, 10, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	if r := m.recv(); r.Status != wire.StatusInvalid || r.Detail != wire.FieldLength {
		t.Fatalf("short length: %+v", r)
	}
	m.expectClosed(3 * time.Second)

	// key_len disagreeing with the length.
	m2 := connect(t, ts.addr, "")
	f := wire.AppendRequest(nil, &wire.Request{Op: wire.OpAcquire, ID: 77, Lease: 10, Key: []byte("abc")})
	f[7] = 9
	m2.write(f)
	if r := m2.recv(); r.Status != wire.StatusInvalid || r.Detail != wire.FieldLength || r.ID != 0 || r.Op != 0 {
		t.Fatalf("key_len mismatch: %+v", r)
	}
	m2.expectClosed(3 * time.Second)

	// A length above the format ceiling: answered from the 4 length bytes alone, then close.
	m3 := connect(t, ts.addr, "")
	m3.write([]byte{0xff, 0xff, 0xff, 0xff, 0x10})
	if r := m3.recv(); r.Status != wire.StatusInvalid || r.Detail != wire.FieldLength {
		t.Fatalf("huge length: %+v", r)
	}
	m3.expectClosed(3 * time.Second)

	// The bystander's lock is intact and the server still serves.
	if info, ok := ts.inspect("precious"); !ok || info.Token != held.Token {
		t.Fatalf("bystander's lock disturbed: %+v", info)
	}
	if r := bystander.roundTrip(release(2, "precious", held.Token)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
}

// A key longer than the limit but within the format ceiling is read and discarded; the
// connection stays usable.
func TestLargeKeyWithinCeilingKeepsConnection(t *testing.T) {
	ts := startServer(t, nil)
	c := connect(t, ts.addr, "")
	r := c.roundTrip(acquire(1, strings.Repeat("k", 60000), 1000, 0))
	if r.Status != wire.StatusInvalid || r.Detail != wire.FieldKey {
		t.Fatalf("%+v", r)
	}
	if r := c.roundTrip(acquire(2, "k", 1000, 0)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
}

func TestLimits(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxWaitersPerKey = 2; c.MaxInflight = 3; c.MaxLocks = 5 })
	c := connect(t, ts.addr, "")
	c.roundTrip(acquire(1, "k", 60000, 0))
	c.send(acquire(2, "k", 1000, wire.WaitForever))
	c.send(acquire(3, "k", 1000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 2 })
	if r := c.roundTrip(acquire(4, "k", 1000, wire.WaitForever)); r.Status != wire.StatusBusy || r.Detail != wire.LimitWaitersPerKey {
		t.Fatalf("per key: %+v", r)
	}
	c.roundTrip(acquire(5, "j", 60000, 0))
	c.send(acquire(6, "j", 1000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 3 })
	if r := c.roundTrip(acquire(7, "j", 1000, wire.WaitForever)); r.Status != wire.StatusBusy || r.Detail != wire.LimitInflight {
		t.Fatalf("inflight: %+v", r)
	}
	for i := 0; i < 3; i++ {
		c.roundTrip(acquire(uint64(10+i), "x"+string(rune('0'+i)), 60000, 0))
	}
	if r := c.roundTrip(acquire(20, "y", 60000, 0)); r.Status != wire.StatusBusy || r.Detail != wire.LimitLocks {
		t.Fatalf("locks: %+v", r)
	}
}

// The limits' INVALID answers name the numbers (a client shows the server's message as it is).
func TestLimitMessagesNameTheLimit(t *testing.T) {
	ts := startServer(t, nil)
	c := connect(t, ts.addr, "")
	r := c.roundTrip(acquire(1, strings.Repeat("k", 300), 1000, 0))
	if r.Status != wire.StatusInvalid || r.Detail != wire.FieldKey || string(r.Data) != "key of 300 bytes is longer than the server's max key length (256)" {
		t.Fatalf("long key: %+v %q", r, r.Data)
	}
	r = c.roundTrip(acquire(2, "k", 3600001, 0))
	if r.Status != wire.StatusInvalid || r.Detail != wire.FieldLease || string(r.Data) != "lease 3600001 ms is outside the server's range (1 ms to 1 h)" {
		t.Fatalf("long lease: %+v %q", r, r.Data)
	}
}

func TestWaitersTotalLimit(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxWaiters = 2 })
	h := connect(t, ts.addr, "")
	h.roundTrip(acquire(1, "a", 60000, 0))
	h.roundTrip(acquire(2, "b", 60000, 0))
	w := connect(t, ts.addr, "")
	w.send(acquire(1, "a", 1000, wire.WaitForever))
	w.send(acquire(2, "b", 1000, wire.WaitForever))
	waitFor(t, 5*time.Second, "queued", func() bool { return ts.waiters() == 2 })
	if r := w.roundTrip(acquire(3, "a", 1000, wire.WaitForever)); r.Status != wire.StatusBusy || r.Detail != wire.LimitWaitersTotal {
		t.Fatalf("total waiters: %+v", r)
	}
	// Try-once acquires never queue, so the limit does not apply to them.
	if r := w.roundTrip(acquire(4, "a", 1000, 0)); r.Status != wire.StatusTimedOut {
		t.Fatalf("try once: %+v", r)
	}
}
