package server

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// tryFlush never blocks: when the peer is not reading, it writes what the socket takes and leaves
// the rest, in order, to the writer goroutine.
func TestTryFlushPartialWriteKeepsOrder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.DataDir = t.TempDir()
	s, err := New(cfg, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	c := newConn(s, sc, sc.(*net.TCPConn))
	defer c.close(time.Now().Add(time.Second))
	defer s.store.Close()

	want := make([]byte, 16<<20) // far more than a socket buffer holds
	for i := range want {
		want[i] = byte(i % 251)
	}
	half := len(want) / 2
	c.mu.Lock()
	c.out = append(c.out, want[:half]...)
	c.mu.Unlock()
	start := time.Now()
	c.tryFlush() // the peer reads nothing yet: this must return at once
	if el := time.Since(start); el > time.Second {
		t.Fatalf("tryFlush blocked for %v", el)
	}
	c.mu.Lock()
	c.out = append(c.out, want[half:]...)
	c.mu.Unlock()
	c.kick()

	got := make([]byte, len(want))
	client.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes reordered or lost")
	}
}

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
