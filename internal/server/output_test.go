package server

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// outputPair is a connection's output side on a real loopback socket pair (client: the peer),
// with a server that is not serving.
func outputPair(t *testing.T, maxOutput int) (*conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.DataDir = t.TempDir()
	cfg.MaxOutput = maxOutput
	s, err := New(cfg, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.store.Close() })
	c := newConn(s, sc, sc.(*net.TCPConn))
	t.Cleanup(func() { c.close(time.Now().Add(time.Second)) })
	return c, client
}

// A grant is lost (revocable, PROTOCOL.md) exactly when its frame was not wholly handed to the
// socket: the first grant goes out with the first write, the filler behind it fills the
// socket (the peer reads nothing), and the connection is killed with the last grant still
// queued: only that one is reported lost, once.
func TestOutputLosesOnlyUnwrittenGrants(t *testing.T) {
	c, _ := outputPair(t, 64<<20)
	grant := func(id uint64) *wire.Response {
		return &wire.Response{Op: wire.OpAcquire, Status: wire.StatusOK, ID: id, Token: id}
	}
	if !c.push(grant(1), true) {
		t.Fatal("first grant not queued")
	}
	filler := &wire.Response{Op: wire.OpInspect, Status: wire.StatusOK, ID: 2, Data: make([]byte, 4000)}
	for i := 0; i < 4000; i++ { // 16 MB: far more than the socket buffers take
		if !c.push(filler, false) {
			t.Fatal("filler not queued")
		}
	}
	if !c.push(grant(3), true) {
		t.Fatal("last grant not queued")
	}
	c.tryFlush() // writes what the socket takes now; the writer goroutine blocks on the rest
	time.Sleep(50 * time.Millisecond)
	c.kill()
	c.writers.Wait()
	c.mu.Lock()
	lost := append([]uint64(nil), c.lost...)
	c.mu.Unlock()
	if len(lost) != 1 || lost[0] != 3 {
		t.Fatalf("lost grants %v, want [3]: the first was written whole, the last never", lost)
	}
	if c.push(grant(4), true) {
		t.Fatal("a killed connection queued more output")
	}
}

// Output beyond MaxOutput dooms the connection: everything queued is dropped, its grants are
// lost, and the socket is closed at once.
func TestOutputOverflowDropsAndReportsGrants(t *testing.T) {
	c, client := outputPair(t, 64<<10)
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if !c.push(&wire.Response{Op: wire.OpAcquire, Status: wire.StatusOK, ID: 7, Token: 7}, true) {
		t.Fatal("grant not queued")
	}
	big := &wire.Response{Op: wire.OpInspect, Status: wire.StatusOK, ID: 8, Data: make([]byte, 70<<10)}
	if c.push(big, false) {
		t.Fatal("a frame beyond MaxOutput was queued")
	}
	if len(c.lost) != 1 || c.lost[0] != 7 || c.state != outFailed || len(c.s.toDetach) != 1 {
		t.Fatalf("after overflow: lost %v state %v to detach %d", c.lost, c.state, len(c.s.toDetach))
	}
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := client.Read(make([]byte, 64)); err == nil {
		t.Fatalf("the peer read %d bytes of a dropped output", n)
	}
}

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
	c.startWriter()

	got := make([]byte, len(want))
	client.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes reordered or lost")
	}
}
