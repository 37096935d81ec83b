package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// TestReadAcrossWaits: a connection reads without holding a buffer while it waits (read), so a
// frame that arrives in pieces, with waits between them, must keep its first bytes across the
// waits; a batch larger than the read buffer arrives over several reads with frames cut at
// their edges; answers come whole and in order either way, and then the connection idles and
// serves again.
func TestReadAcrossWaits(t *testing.T) {
	ts := startServer(t, nil)
	c := connect(t, ts.addr, "")
	frame := wire.AppendRequest(nil, &wire.Request{Op: wire.OpAcquire, ID: 1, Key: []byte("piecewise"), Lease: 30000})
	for i := range frame {
		c.write(frame[i : i+1])
		time.Sleep(2 * time.Millisecond) // the server reads each byte alone, then waits
	}
	first := c.recv()
	if first.ID != 1 || first.Status != wire.StatusOK {
		t.Fatalf("piecewise acquire: %+v", first)
	}
	var batch []byte
	const n = 300 // about 40 bytes each: three times the read buffer
	for i := 0; i < n; i++ {
		batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpAcquire, ID: uint64(2 + i), Key: []byte(fmt.Sprintf("batch-%03d", i)), Lease: 30000})
	}
	if len(batch) <= readBufSize {
		t.Fatalf("batch of %d bytes does not exceed the read buffer", len(batch))
	}
	c.write(batch)
	for i := 0; i < n; i++ {
		if r := c.recv(); r.ID != uint64(2+i) || r.Status != wire.StatusOK {
			t.Fatalf("batch answer %d: %+v", i, r)
		}
	}
	time.Sleep(50 * time.Millisecond) // idle: the buffer goes back
	if r := c.roundTrip(release(uint64(2+n), "piecewise", first.Token)); r.Status != wire.StatusOK {
		t.Fatalf("release after idling: %+v", r)
	}
}
