package locktable

import (
	"testing"
	"unsafe"

	"github.com/ticketing/ticketing/wire"
)

// keyHash must tell apart keys that differ in one byte, in length only, or in trailing zeros.
func TestKeyHashSeparatesNearKeys(t *testing.T) {
	seen := map[uint32]string{}
	add := func(k string) {
		h := keyHash([]byte(k))
		if o, ok := seen[h]; ok && o != k {
			t.Fatalf("keyHash(%q) == keyHash(%q)", k, o)
		}
		seen[h] = k
	}
	base := "order-000000-abcdefgh"
	for i := 0; i <= len(base); i++ {
		add(base[:i])
		add(base[:i] + "\x00")
		for _, c := range []byte("019az\x00\xff") {
			b := []byte(base)
			if i < len(b) {
				b[i] = c
				add(string(b))
			}
		}
	}
}

// An UNDELIVERED for a grant made on an older connection changes nothing once the session has
// attached since (the newer connection may have carried a retry's answer), even if the newer
// connection is gone too.
func TestUndeliveredForOlderConnectionIgnored(t *testing.T) {
	for _, late := range []bool{false, true} {
		tb := New(Config{})
		sid := [wire.SessionIDSize]byte{7}
		const grace = 100 * nsPerMs
		tb.Attach(1, sid, 1, grace)
		owner := tb.Outs()[0].Owner
		tb.ClearOuts()
		tb.Requests(2, owner, 1, []wire.Request{{Op: wire.OpAcquire, ID: 1, Key: []byte("k"), Lease: 60000}})
		if o := tb.Outs(); len(o) != 1 || o[0].Resp.Status != wire.StatusOK {
			t.Fatalf("grant: %+v", o)
		}
		tb.ClearOuts()
		conn := uint64(1) // the grant's connection
		if late {
			tb.Attach(3, sid, 2, grace) // resumed on connection 2, which dies too
			tb.Detach(4, owner, 2)
		} else {
			tb.Detach(4, owner, 1)
		}
		tb.Undelivered(5, owner, conn, 1)
		tb.Tick(5 + 2*grace) // the session's grace is over
		info, _ := tb.Inspect([]byte("k"))
		if late && !info.Held {
			t.Fatal("a grant the newer connection may have delivered was revoked")
		}
		if !late && info.Held {
			t.Fatal("an undelivered grant of an ended session was not revoked")
		}
	}
}

// A stored outcome is 32 bytes: busy sessions keep thousands of them, so a field added to
// record costs every such session (docs/operations.md, capacity).
func TestRecordSize(t *testing.T) {
	if n := unsafe.Sizeof(record{}); n != 32 {
		t.Fatalf("record is %d bytes, want 32", n)
	}
}
