package server

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
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
