package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// testServer is a real server on 127.0.0.1 with a free port.
type testServer struct {
	*Server
	addr string
	cfg  Config
	errc chan error
}

func quietLogger() *slog.Logger {
	if os.Getenv("TICKETING_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func startServer(t *testing.T, mutate func(*Config)) *testServer {
	t.Helper()
	cfg := Default()
	cfg.Addr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.SessionGrace = 0 // tests of sessions set their own grace
	if mutate != nil {
		mutate(&cfg)
	}
	return startServerCfg(t, cfg)
}

func startServerCfg(t *testing.T, cfg Config) *testServer {
	t.Helper()
	ts, err := tryStartServerCfg(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// tryStartServerCfg is startServerCfg returning its error (a cluster test retries a start whose
// raft port was taken meanwhile: see startCluster).
func tryStartServerCfg(t *testing.T, cfg Config) (*testServer, error) {
	s, err := New(cfg, quietLogger())
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	ts := &testServer{Server: s, addr: ln.Addr().String(), cfg: cfg, errc: make(chan error, 1)}
	go func() { ts.errc <- s.Serve(ln) }()
	t.Cleanup(func() { ts.stop(t) })
	return ts, nil
}

func (ts *testServer) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ts.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// rawClient speaks the protocol byte by byte, so tests see exactly what the server sends.
type rawClient struct {
	t   *testing.T
	nc  net.Conn
	buf []byte
	sid [wire.SessionIDSize]byte
	// From the last handshake.
	welcome   wire.Welcome
	challenge wire.Challenge
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawClient{t: t, nc: nc}
	rand.Read(c.sid[:])
	return c
}

// connect dials and completes the handshake with token ("" = no auth), failing the test otherwise.
func connect(t *testing.T, addr, token string) *rawClient {
	t.Helper()
	c := dialRaw(t, addr)
	if st := c.handshake(token); st != wire.StatusOK {
		t.Fatalf("handshake: %v", st)
	}
	return c
}

// handshake runs the client side and returns WELCOME's status (or CHALLENGE's when not OK).
func (c *rawClient) handshake(token string) wire.Status {
	c.t.Helper()
	h := wire.Hello{Version: wire.Version, SessionID: c.sid}
	rand.Read(h.Nonce[:])
	c.write(wire.AppendHello(nil, &h))
	ch := c.readChallenge()
	c.challenge = ch
	if ch.Status != wire.StatusOK {
		return ch.Status
	}
	var a wire.Auth
	if token != "" {
		a.Proof = wire.ClientProof([]byte(token), &c.sid, &h.Nonce, &ch.Nonce)
	}
	c.write(wire.AppendAuth(nil, &a))
	var w wire.Welcome
	if err := wire.DecodeWelcome(c.readN(wire.WelcomeSize), &w); err != nil {
		c.t.Fatal(err)
	}
	if w.Status == wire.StatusOK && token != "" {
		want := wire.ServerProof([]byte(token), &c.sid, &h.Nonce, &ch.Nonce, &w)
		if want != w.Proof {
			c.t.Fatal("server proof does not verify")
		}
	}
	c.welcome = w
	return w.Status
}

// handshakeQuiet runs a client handshake on nc with token and returns WELCOME's status (or
// CHALLENGE's), or an error; it never fails a test (for goroutines that expect refusals).
func handshakeQuiet(nc net.Conn, token string) (wire.Status, error) {
	var sid [wire.SessionIDSize]byte
	rand.Read(sid[:])
	h := wire.Hello{Version: wire.Version, SessionID: sid}
	rand.Read(h.Nonce[:])
	if _, err := nc.Write(wire.AppendHello(nil, &h)); err != nil {
		return 0, err
	}
	head := make([]byte, 4)
	if _, err := io.ReadFull(nc, head); err != nil {
		return 0, err
	}
	n, err := wire.ChallengeLen(head)
	if err != nil {
		return 0, err
	}
	b := append(head, make([]byte, n-4)...)
	if _, err := io.ReadFull(nc, b[4:]); err != nil {
		return 0, err
	}
	var ch wire.Challenge
	if err := wire.DecodeChallenge(b, &ch); err != nil || ch.Status != wire.StatusOK {
		return ch.Status, err
	}
	var a wire.Auth
	a.Proof = wire.ClientProof([]byte(token), &sid, &h.Nonce, &ch.Nonce)
	if _, err := nc.Write(wire.AppendAuth(nil, &a)); err != nil {
		return 0, err
	}
	wb := make([]byte, wire.WelcomeSize)
	if _, err := io.ReadFull(nc, wb); err != nil {
		return 0, err
	}
	var w wire.Welcome
	err = wire.DecodeWelcome(wb, &w)
	return w.Status, err
}

// readChallenge reads one CHALLENGE frame.
func (c *rawClient) readChallenge() wire.Challenge {
	c.t.Helper()
	head := c.readN(4)
	n, err := wire.ChallengeLen(head)
	if err != nil {
		c.t.Fatal(err)
	}
	var ch wire.Challenge
	if err := wire.DecodeChallenge(append(head, c.readN(n-4)...), &ch); err != nil {
		c.t.Fatal(err)
	}
	ch.Data = bytes.Clone(ch.Data)
	return ch
}

func (c *rawClient) write(b []byte) {
	c.t.Helper()
	c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *rawClient) readN(n int) []byte {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c.nc, b); err != nil {
		c.t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

func (c *rawClient) send(r wire.Request) {
	c.t.Helper()
	c.write(wire.AppendRequest(nil, &r))
}

// recv reads one response frame within d.
func (c *rawClient) recvWithin(d time.Duration) (wire.Response, error) {
	c.nc.SetReadDeadline(time.Now().Add(d))
	for {
		if size, err := wire.FrameLen(c.buf); err == nil && len(c.buf) >= size {
			var r wire.Response
			if _, err := wire.DecodeResponse(c.buf, wire.MaxDataLen, &r); err != nil {
				return r, err
			}
			r.Data = bytes.Clone(r.Data)
			c.buf = c.buf[size:]
			return r, nil
		}
		tmp := make([]byte, 4096)
		n, err := c.nc.Read(tmp)
		c.buf = append(c.buf, tmp[:n]...)
		if err != nil && n == 0 {
			return wire.Response{}, err
		}
	}
}

func (c *rawClient) recv() wire.Response {
	c.t.Helper()
	r, err := c.recvWithin(5 * time.Second)
	if err != nil {
		c.t.Fatalf("recv: %v", err)
	}
	return r
}

// roundTrip sends r and returns the next response, which must answer r.
func (c *rawClient) roundTrip(r wire.Request) wire.Response {
	c.t.Helper()
	c.send(r)
	resp := c.recv()
	if resp.ID != r.ID {
		c.t.Fatalf("answer to %d arrived for %d (%v %v)", r.ID, resp.ID, resp.Op, resp.Status)
	}
	return resp
}

// expectClosed asserts the server closes the connection within d (after any answers).
func (c *rawClient) expectClosed(d time.Duration) {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c.nc)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		c.t.Fatal("connection still open")
	}
}

func acquire(id uint64, key string, leaseMs, waitMs uint32) wire.Request {
	return wire.Request{Op: wire.OpAcquire, ID: id, Key: []byte(key), Lease: leaseMs, WaitMs: waitMs}
}

func release(id uint64, key string, token uint64) wire.Request {
	return wire.Request{Op: wire.OpRelease, ID: id, Key: []byte(key), Token: token}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (ts *testServer) waiters() int {
	_, _, w, _ := ts.Stats()
	return w
}
