package locktable

import (
	"testing"

	"github.com/ticketing/ticketing/wire"
)

// Paths to two holders found in review (issue "Lock safety"): each test here failed before its
// fix.

// sess is one session of a test table: its id, owner and current connection.
type sess struct {
	id    [wire.SessionIDSize]byte
	owner Owner
	conn  uint64
}

func attach(t *testing.T, tb *Table, now int64, id byte, conn uint64, grace int64) *sess {
	t.Helper()
	s := &sess{id: [wire.SessionIDSize]byte{id}, conn: conn}
	tb.Attach(now, s.id, conn, grace)
	outs := tb.Outs()
	o := outs[len(outs)-1]
	if !o.Attached || o.Busy {
		t.Fatalf("attach %d: %+v", id, o)
	}
	s.owner = o.Owner
	tb.ClearOuts()
	return s
}

// send applies requests of s on its connection and returns the outputs (copied).
func send(tb *Table, now int64, s *sess, reqs ...wire.Request) []Out {
	tb.Requests(now, s.owner, s.conn, reqs)
	return takeOuts(tb)
}

func takeOuts(tb *Table) []Out {
	outs := append([]Out(nil), tb.Outs()...)
	for k := range outs {
		outs[k].Resp.Data = append([]byte(nil), outs[k].Resp.Data...)
	}
	tb.ClearOuts()
	return outs
}

func acq(id uint64, key string, leaseMs uint32) wire.Request {
	return wire.Request{Op: wire.OpAcquire, ID: id, Key: []byte(key), Lease: leaseMs, WaitMs: wire.WaitForever}
}

func grantOf(t *testing.T, outs []Out, id uint64) wire.Response {
	t.Helper()
	for _, o := range outs {
		if o.Resp.Op == wire.OpAcquire && o.Resp.ID == id && o.Resp.Status == wire.StatusOK {
			return o.Resp
		}
	}
	t.Fatalf("no grant for request %d in %+v", id, outs)
	return wire.Response{}
}

// A grant answered twice on one connection — the hand-off to a re-attached queued acquire, then
// its retry answered from the table — stays the client's when only the second frame is dropped
// unwritten: the client may have read the first. Before the fix the dropped second frame made
// the grant revocable, and the session's end handed the key to the next waiter while the client
// still held it.
func TestUndeliveredSecondGrantFrameKeepsTheGrant(t *testing.T) {
	const grace = 100 * nsPerMs
	tb := New(Config{})
	b := attach(t, tb, 1, 2, 10, grace)
	a := attach(t, tb, 1, 1, 20, grace)
	c := attach(t, tb, 1, 3, 30, grace)
	holder := grantOf(t, send(tb, 2, b, acq(1, "k", 60_000)), 1)
	send(tb, 3, a, acq(1, "k", 30_000)) // queued
	send(tb, 4, c, acq(1, "k", 30_000)) // queued behind a

	// a's connection drops; it resumes on connection 21 and its retry is on its way.
	tb.Detach(5, a.owner, a.conn)
	takeOuts(tb)
	a.conn = 21
	tb.Attach(6, a.id, a.conn, grace)
	takeOuts(tb)
	// The hand-off reaches connection 21 first (frame 1), then the retry is answered from the
	// table (frame 2).
	outs := send(tb, 7, b, wire.Request{Op: wire.OpRelease, ID: 2, Key: []byte("k"), Token: holder.Token})
	first := grantOf(t, outs, 1)
	second := grantOf(t, send(tb, 8, a, acq(1, "k", 30_000)), 1)
	if first.Token != second.Token {
		t.Fatalf("tokens differ: %d, %d", first.Token, second.Token)
	}
	// Only the second frame is dropped; the client read the first. It stays away past the grace.
	tb.Undelivered(9, a.owner, a.conn, 1)
	takeOuts(tb)
	tb.Tick(10 + 2*grace)
	outs = takeOuts(tb)
	info, _ := tb.Inspect([]byte("k"))
	if !info.Held || info.Token != first.Token {
		t.Fatalf("the grant the client read was revoked: %+v (outputs %+v)", info, outs)
	}
	for _, o := range outs {
		if o.Resp.Op == wire.OpAcquire && o.Resp.Status == wire.StatusOK {
			t.Fatalf("a second holder was granted while the first still held: %+v", o.Resp)
		}
	}
}

// The single frame of a grant dropped unwritten still makes it revocable (the case Undelivered
// exists for), also when that frame was the answer to a retry of a grant made while detached.
func TestUndeliveredOnlyGrantFrameIsRevoked(t *testing.T) {
	const grace = 100 * nsPerMs
	for _, detachedGrant := range []bool{false, true} {
		tb := New(Config{})
		b := attach(t, tb, 1, 2, 10, grace)
		a := attach(t, tb, 1, 1, 20, grace)
		c := attach(t, tb, 1, 3, 30, grace)
		holder := grantOf(t, send(tb, 2, b, acq(1, "k", 60_000)), 1)
		send(tb, 3, a, acq(1, "k", 30_000))
		send(tb, 4, c, acq(1, "k", 30_000))
		if detachedGrant {
			tb.Detach(5, a.owner, a.conn)
			send(tb, 6, b, wire.Request{Op: wire.OpRelease, ID: 2, Key: []byte("k"), Token: holder.Token})
			a.conn = 21
			tb.Attach(7, a.id, a.conn, grace)
			takeOuts(tb)
			grantOf(t, send(tb, 8, a, acq(1, "k", 30_000)), 1) // the retry's answer: the only frame
		} else {
			grantOf(t, send(tb, 6, b, wire.Request{Op: wire.OpRelease, ID: 2, Key: []byte("k"), Token: holder.Token}), 1)
		}
		tb.Undelivered(9, a.owner, a.conn, 1)
		takeOuts(tb)
		tb.Tick(10 + 2*grace)
		outs := takeOuts(tb)
		grantOf(t, outs, 1) // c's acquire, id 1 of its own session
		info, _ := tb.Inspect([]byte("k"))
		if !info.Held || info.Holder != c.owner {
			t.Fatalf("detached grant %v: the undelivered grant was not passed on: %+v", detachedGrant, info)
		}
	}
}

// A session that ends while holding several revocable grants revokes them in an order that is a
// function of the replicated state alone, so a replica restored from a snapshot hands the keys
// on with the same tokens as one that applied every entry. Before the fix the order was the
// owner's held list, which Restore relinked in key order.
func TestSnapshotRestoreRevokesInTheSameOrder(t *testing.T) {
	const grace = 100 * nsPerMs
	tb := New(Config{})
	b := attach(t, tb, 1, 2, 10, grace)
	a := attach(t, tb, 1, 1, 20, grace)
	c := attach(t, tb, 1, 3, 30, grace)
	keys := []string{"k3", "k1", "k2", "k0"} // grant order unlike key order
	var held []uint64
	for n, k := range keys {
		held = append(held, grantOf(t, send(tb, 2, b, acq(uint64(n+1), k, 60_000)), uint64(n+1)).Token)
		send(tb, 3, a, acq(uint64(n+1), k, 30_000))
		send(tb, 4, c, acq(uint64(n+1), k, 30_000))
	}
	tb.Detach(5, a.owner, a.conn)
	takeOuts(tb)
	for n, k := range keys { // every key goes to a while it is detached: revocable grants
		send(tb, 6, b, wire.Request{Op: wire.OpRelease, ID: uint64(10 + n), Key: []byte(k), Token: held[n]})
	}
	r, err := Restore(Config{}, tb.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if r.StateHash() != tb.StateHash() {
		t.Fatal("restored table differs at the snapshot")
	}
	tb.Tick(10 + 2*grace) // a's session ends: its four grants are revoked and handed to c
	r.Tick(10 + 2*grace)
	oa, ob := takeOuts(tb), takeOuts(r)
	for _, k := range keys {
		ia, _ := tb.Inspect([]byte(k))
		ib, _ := r.Inspect([]byte(k))
		if ia.Token != ib.Token || ia.Holder != c.owner || ib.Holder != c.owner {
			t.Fatalf("key %s: token %d on the original, %d on the restored replica (holders %d, %d)", k, ia.Token, ib.Token, ia.Holder, ib.Holder)
		}
	}
	if tb.StateHash() != r.StateHash() {
		t.Fatalf("state hashes differ after the session ended (outputs %+v vs %+v)", oa, ob)
	}
}

// The answer to a retried ACQUIRE whose grant the table holds counts like every grant answer:
// detail is the time since the request first arrived, lease_ms the lease left now, so that
// first send + (detail + lease_ms) is the lease's end (PROTOCOL.md, "The lost signal").
func TestRetriedGrantCountsFromTheFirstArrival(t *testing.T) {
	const grace = 5000 * nsPerMs
	tb := New(Config{})
	b := attach(t, tb, 0, 2, 10, grace)
	a := attach(t, tb, 0, 1, 20, grace)
	holder := grantOf(t, send(tb, 0, b, acq(1, "k", 60_000)), 1)
	send(tb, 100*nsPerMs, a, acq(1, "k", 10_000)) // first arrival at 100 ms
	g := grantOf(t, send(tb, 1100*nsPerMs, b, wire.Request{Op: wire.OpRelease, ID: 2, Key: []byte("k"), Token: holder.Token}), 1)
	if g.Detail != 1000 || g.Lease != 10_000 {
		t.Fatalf("hand-off: detail %d lease %d, want 1000 and 10000", g.Detail, g.Lease)
	}
	tb.Detach(1200*nsPerMs, a.owner, a.conn)
	a.conn = 21
	tb.Attach(1500*nsPerMs, a.id, a.conn, grace)
	takeOuts(tb)
	r := grantOf(t, send(tb, 1600*nsPerMs, a, acq(1, "k", 10_000)), 1)
	if r.Token != g.Token || r.Detail != 1500 || r.Lease != 9500 {
		t.Fatalf("retry: token %d detail %d lease %d, want %d, 1500 and 9500", r.Token, r.Detail, r.Lease, g.Token)
	}
	// An immediate grant: detail 0, and its retry counts from that arrival too.
	grantOf(t, send(tb, 1700*nsPerMs, b, acq(3, "j", 4000)), 3)
	tb.Detach(1800*nsPerMs, b.owner, b.conn)
	b.conn = 11
	tb.Attach(1900*nsPerMs, b.id, b.conn, grace)
	takeOuts(tb)
	r = grantOf(t, send(tb, 2000*nsPerMs, b, acq(3, "j", 4000)), 3)
	if r.Detail != 300 || r.Lease != 3700 {
		t.Fatalf("retry of an immediate grant: detail %d lease %d, want 300 and 3700", r.Detail, r.Lease)
	}
}
