package testserver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// echoServer answers every frame it reads with the same bytes.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// frame is a length-prefixed frame with op byte op and n bytes of body in all.
func frame(op byte, body ...byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(1+len(body)))
	b = append(b, op)
	return append(b, body...)
}

func dialProxy(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readN(t *testing.T, c net.Conn, n int, within time.Duration) ([]byte, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	b := make([]byte, n)
	_, err := io.ReadFull(c, b)
	return b, err
}

func waitOpen(t *testing.T, p *Proxy, n int) []*ProxyConn {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if open := p.Open(); len(open) == n {
			return open
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %d open proxied connections, have %d", n, len(p.Open()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestProxyHoldReleaseAndFrames(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	c := dialProxy(t, p)
	hello := frame(0x01, make([]byte, 51)...) // a HELLO-sized frame: 56 bytes in all
	copy(hello[8:24], []byte("0123456789abcdef"))
	c.Write(hello)
	if _, err := readN(t, c, len(hello), 5*time.Second); err != nil {
		t.Fatalf("relay: %v", err)
	}
	pc := waitOpen(t, p, 1)[0]
	if id, ok := pc.SessionID(); !ok || string(id[:]) != "0123456789abcdef" {
		t.Errorf("SessionID = %q, %v", id, ok)
	}

	pc.HoldServerBytes()
	f := frame(0x10, 1, 2, 3)
	c.Write(f)
	if _, err := readN(t, c, len(f), 300*time.Millisecond); err == nil {
		t.Fatal("held bytes reached the client")
	}
	deadline := time.Now().Add(5 * time.Second)
	for pc.HeldBytes() != len(f) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if pc.HeldBytes() != len(f) {
		t.Fatalf("HeldBytes = %d; want %d", pc.HeldBytes(), len(f))
	}
	if err := pc.ReleaseServerBytes(); err != nil {
		t.Fatal(err)
	}
	got, err := readN(t, c, len(f), 5*time.Second)
	if err != nil || !bytes.Equal(got, f) {
		t.Fatalf("after release: %x, %v; want %x", got, err, f)
	}

	frames := pc.Frames()
	var ops []string
	for _, fr := range frames {
		ops = append(ops, fr.Dir.String())
	}
	if len(frames) != 4 || frames[0].Op() != 0x01 || frames[2].Op() != 0x10 || frames[2].Dir != ClientToServer ||
		frames[3].Dir != ServerToClient || !frames[3].Held || frames[1].Held {
		t.Errorf("frames: %d %v", len(frames), ops)
	}
}

func TestProxyResetDropsHeldBytes(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	c := dialProxy(t, p)
	c.Write(frame(0x14))
	if _, err := readN(t, c, 5, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	pc := waitOpen(t, p, 1)[0]
	pc.HoldServerBytes()
	c.Write(frame(0x14, 9, 9))
	pc.Reset()
	_, err := readN(t, c, 1, 5*time.Second)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after Reset: %v; want connection reset", err)
	}
	select {
	case <-pc.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("connection not done after Reset")
	}
	// New connections are relayed as before.
	c2 := dialProxy(t, p)
	c2.Write(frame(0x14))
	if _, err := readN(t, c2, 5, 5*time.Second); err != nil {
		t.Fatalf("new connection after Reset: %v", err)
	}
}

func TestProxyRefuse(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	p.Refuse(true)
	// The reset may come before or after the dial returns.
	if c, err := net.Dial("tcp", p.Addr); err == nil {
		c.Write(frame(0x14))
		if _, err := readN(t, c, 1, 5*time.Second); err == nil {
			t.Fatal("a refused connection relayed bytes")
		}
		c.Close()
	}
	p.Refuse(false)
	c2 := dialProxy(t, p)
	c2.Write(frame(0x14))
	if _, err := readN(t, c2, 5, 5*time.Second); err != nil {
		t.Fatalf("after Refuse(false): %v", err)
	}
	if p.Accepted() != 2 || len(p.Conns()) != 1 {
		t.Errorf("Accepted %d, Conns %d; want 2, 1", p.Accepted(), len(p.Conns()))
	}
}
