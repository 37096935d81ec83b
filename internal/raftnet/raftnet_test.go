package raftnet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func listen(t *testing.T, secret string, o Options) *Layer {
	t.Helper()
	o.Secret = []byte(secret)
	l, err := Listen("127.0.0.1:0", o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// acceptOne returns the next connection the layer hands to raft, or fails after d.
func acceptOne(t *testing.T, l *Layer, d time.Duration) net.Conn {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			ch <- c
		}
	}()
	select {
	case c := <-ch:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(d):
		t.Fatalf("no authenticated connection accepted within %v", d)
		return nil
	}
}

// dialIdle opens a TCP connection from the local address src (empty: any) and sends nothing.
func dialIdle(t *testing.T, addr, src string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// closedWithin reports whether the server closed nc (EOF or reset) within d.
func closedWithin(nc net.Conn, d time.Duration) bool {
	nc.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	_, err := nc.Read(b[:])
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func waitPending(t *testing.T, l *Layer, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.pending.len() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections pending, want %d", l.pending.len(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDialAuthenticates(t *testing.T) {
	a := listen(t, "secret", Options{})
	b := listen(t, "secret", Options{})
	c, err := b.Dial(raft.ServerAddress(a.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := acceptOne(t, a, 5*time.Second)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "ping" {
		t.Fatalf("read %q, %v", got, err)
	}

	wrong := listen(t, "other", Options{})
	if _, err := wrong.Dial(raft.ServerAddress(a.Addr().String()), time.Second); !errors.Is(err, ErrAuth) {
		t.Fatalf("dial with a wrong secret: %v, want ErrAuth", err)
	}
}

// A flood of idle connections from the peers' own address (no secret needed) never keeps a
// peer out: each new one closes that address's oldest pending connection, not the peer's.
func TestFloodFromOneAddressDoesNotKeepPeerOut(t *testing.T) {
	a := listen(t, "secret", Options{})
	b := listen(t, "secret", Options{})
	var idle []net.Conn
	for i := 0; i < 3*pendingMax; i++ {
		idle = append(idle, dialIdle(t, a.Addr().String(), ""))
	}
	waitPending(t, a, pendingPerHost)
	if !closedWithin(idle[0], 2*time.Second) {
		t.Fatal("the oldest idle connection of the address is still open")
	}
	if closedWithin(idle[len(idle)-1], 50*time.Millisecond) {
		t.Fatal("the newest idle connection was closed")
	}
	c, err := b.Dial(raft.ServerAddress(a.Addr().String()), 5*time.Second)
	if err != nil {
		t.Fatalf("peer refused behind a flood: %v", err)
	}
	defer c.Close()
	acceptOne(t, a, 5*time.Second)
}

// Beyond pendingMax in all (from many addresses), a new connection closes the oldest one.
func TestFullPendingSetClosesOldest(t *testing.T) {
	a := listen(t, "secret", Options{})
	if c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).Dial("tcp", a.Addr().String()); err != nil {
		t.Skipf("no 127.0.0.2 source address here: %v", err)
	} else {
		c.Close()
	}
	waitPending(t, a, 0)
	var idle []net.Conn
	hosts := pendingMax / pendingPerHost
	for h := 0; h < hosts; h++ {
		for k := 0; k < pendingPerHost; k++ {
			idle = append(idle, dialIdle(t, a.Addr().String(), fmt.Sprintf("127.0.0.%d", h+2)))
		}
	}
	waitPending(t, a, pendingMax)
	if closedWithin(idle[0], 50*time.Millisecond) {
		t.Fatal("a connection was closed before the pending set was full")
	}
	dialIdle(t, a.Addr().String(), fmt.Sprintf("127.0.0.%d", hosts+2))
	if !closedWithin(idle[0], 2*time.Second) {
		t.Fatal("the oldest pending connection is still open with the set full")
	}
	if closedWithin(idle[1], 50*time.Millisecond) {
		t.Fatal("more than the oldest pending connection was closed")
	}
	waitPending(t, a, pendingMax)
}

// An accepted connection that does not finish its handshake is closed after AcceptTimeout,
// and Close does not wait for pending handshakes.
func TestAcceptTimeoutAndClose(t *testing.T) {
	a := listen(t, "secret", Options{AcceptTimeout: 200 * time.Millisecond})
	nc := dialIdle(t, a.Addr().String(), "")
	nc.Write([]byte("TKRN")) // a partial hello
	start := time.Now()
	if !closedWithin(nc, 3*time.Second) {
		t.Fatal("an idle connection outlived the accept timeout")
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("closed after %v, before the accept timeout", d)
	}
	waitPending(t, a, 0)

	b := listen(t, "secret", Options{}) // default accept timeout: 2s
	for i := 0; i < 4; i++ {
		dialIdle(t, b.Addr().String(), "")
	}
	waitPending(t, b, 4)
	start = time.Now()
	b.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close waited %v for pending handshakes", d)
	}
	if _, err := b.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

// A layer bound to its own loopback address dials from it: nodes sharing a host on 127.0.0.x
// addresses are told apart by address in both directions.
func TestDialFromTheListenersLoopbackAddress(t *testing.T) {
	a := listen(t, "secret", Options{})
	o := Options{Secret: []byte("secret")}
	b, err := Listen("127.0.0.7:0", o)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := b.Dial(raft.ServerAddress(a.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := acceptOne(t, a, 5*time.Second)
	if ip := s.RemoteAddr().(*net.TCPAddr).IP.String(); ip != "127.0.0.7" {
		t.Fatalf("the dialled connection comes from %s, want 127.0.0.7", ip)
	}
}

// A node with another cluster secret dials a healthy one: the healthy node's log says what is
// wrong (it used to say only "err=EOF": the dialler hangs up once it cannot verify the proof).
func TestWrongSecretIsNamedOnTheHealthySide(t *testing.T) {
	var buf syncBuffer
	a := listen(t, "secret", Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	wrong := listen(t, "other", Options{})
	if _, err := wrong.Dial(raft.ServerAddress(a.Addr().String()), time.Second); !errors.Is(err, ErrAuth) {
		t.Fatalf("dial with a wrong secret: %v, want ErrAuth", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), "different cluster secret") {
		if time.Now().After(deadline) {
			t.Fatalf("the healthy node's log does not name the cause:\n%s", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
