package ticketing

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// fakeServer is a scriptable Ticketing server on 127.0.0.1 for the failure paths the real server
// does not produce on demand (GOAWAY, NOT_LEADER, a changed state id, lost answers, a frozen
// peer). It runs the real handshake (auth included, from the wire package) and hands every accepted
// connection to the test, which reads the requests and writes the answers itself.
type fakeServer struct {
	t    *testing.T
	ln   net.Listener
	Addr string

	conns chan *fakeConn

	mu        sync.Mutex
	stateID   [16]byte
	graceMs   uint32
	token     string
	sessions  map[[16]byte]bool // sessions seen: a HELLO naming one is resumed
	noResume  bool              // answer every HELLO with RESUMED clear
	autoPing  bool              // new connections answer PING by themselves
	noRead    bool              // new connections read nothing after the handshake
	paused    chan struct{}     // non-nil: handshakes wait until it is closed
	challenge func(h *wire.Hello) *wire.Challenge
	hellos    []wire.Hello
	all       []*fakeConn
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &fakeServer{t: t, ln: ln, Addr: ln.Addr().String(), conns: make(chan *fakeConn, 16), graceMs: 5000, sessions: map[[16]byte]bool{}}
	rand.Read(fs.stateID[:])
	go fs.accept()
	t.Cleanup(fs.close)
	return fs
}

func (fs *fakeServer) close() {
	fs.ln.Close()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, fc := range fs.all {
		fc.nc.Close()
	}
}

// pause makes new handshakes wait until unpause (a server that is down, seen from a client that
// keeps reconnecting).
func (fs *fakeServer) pause() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.paused = make(chan struct{})
}

func (fs *fakeServer) unpause() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.paused != nil {
		close(fs.paused)
		fs.paused = nil
	}
}

func (fs *fakeServer) set(f func(fs *fakeServer)) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f(fs)
}

// restart gives the server a new state id and forgets its sessions (a single node restarted).
func (fs *fakeServer) restart() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	rand.Read(fs.stateID[:])
	fs.sessions = map[[16]byte]bool{}
}

func (fs *fakeServer) helloSessions() [][16]byte {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var out [][16]byte
	for _, h := range fs.hellos {
		out = append(out, h.SessionID)
	}
	return out
}

func (fs *fakeServer) accept() {
	for {
		nc, err := fs.ln.Accept()
		if err != nil {
			return
		}
		go fs.handshake(nc)
	}
}

func (fs *fakeServer) handshake(nc net.Conn) {
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	var b [wire.HelloSize]byte
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		nc.Close()
		return
	}
	var h wire.Hello
	if err := wire.DecodeHello(b[:], &h); err != nil {
		nc.Close()
		return
	}
	fs.mu.Lock()
	gate := fs.paused
	fs.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-time.After(bound):
		}
	}
	fs.mu.Lock()
	fs.hellos = append(fs.hellos, h)
	custom, token, state, grace := fs.challenge, fs.token, fs.stateID, fs.graceMs
	resumed := fs.sessions[h.SessionID] && !fs.noResume
	fs.sessions[h.SessionID] = true
	fs.mu.Unlock()
	ch := &wire.Challenge{Status: wire.StatusOK, Version: wire.Version}
	if custom != nil {
		if c := custom(&h); c != nil {
			ch = c
		}
	}
	if token != "" && ch.Status == wire.StatusOK {
		ch.Flags |= wire.ChallengeAuthRequired
		rand.Read(ch.Nonce[:])
	}
	nc.Write(wire.AppendChallenge(nil, ch))
	if ch.Status != wire.StatusOK {
		nc.Close()
		return
	}
	var ab [wire.AuthSize]byte
	if _, err := io.ReadFull(nc, ab[:]); err != nil {
		nc.Close()
		return
	}
	var a wire.Auth
	wire.DecodeAuth(ab[:], &a)
	w := wire.Welcome{Status: wire.StatusOK, GraceMs: grace, StateID: state}
	if resumed {
		w.Flags = wire.WelcomeResumed
	}
	if token != "" {
		want := wire.ClientProof([]byte(token), &h.SessionID, &h.Nonce, &ch.Nonce)
		if !wire.ProofEqual(&want, &a.Proof) {
			nc.Write(wire.AppendWelcome(nil, &wire.Welcome{Status: wire.StatusAuthFailed}))
			nc.Close()
			return
		}
		w.Proof = wire.ServerProof([]byte(token), &h.SessionID, &h.Nonce, &ch.Nonce, &w)
	}
	nc.Write(wire.AppendWelcome(nil, &w))
	nc.SetDeadline(time.Time{})
	fc := &fakeConn{t: fs.t, nc: nc, Hello: h, Resumed: resumed, reqs: make(chan wire.Request, 4096), closed: make(chan struct{})}
	fs.mu.Lock()
	fc.autoPing = fs.autoPing
	fs.all = append(fs.all, fc)
	noRead := fs.noRead
	fs.mu.Unlock()
	if !noRead {
		go fc.readLoop()
	}
	fs.conns <- fc
}

// next waits for the next handshaken connection.
func (fs *fakeServer) next() *fakeConn {
	fs.t.Helper()
	select {
	case fc := <-fs.conns:
		return fc
	case <-time.After(bound):
		fs.t.Fatal("fake server: no connection")
		return nil
	}
}

// noConn checks that no new connection arrives within d.
func (fs *fakeServer) noConn(d time.Duration) {
	fs.t.Helper()
	select {
	case fc := <-fs.conns:
		fs.t.Fatalf("fake server: unexpected connection (session %x)", fc.Hello.SessionID)
	case <-time.After(d):
	}
}

// fakeConn is one handshaken connection of a fakeServer.
type fakeConn struct {
	t       *testing.T
	nc      net.Conn
	Hello   wire.Hello
	Resumed bool
	reqs    chan wire.Request // decoded requests, keys copied
	closed  chan struct{}     // closed when the client's side ends

	mu       sync.Mutex
	autoPing bool
}

func (fc *fakeConn) readLoop() {
	defer close(fc.closed)
	br := bufio.NewReader(fc.nc)
	for {
		h := make([]byte, 4)
		if _, err := io.ReadFull(br, h); err != nil {
			return
		}
		n, _ := wire.FrameLen(h)
		if n < wire.HeaderSize || n > wire.MaxFrameSize {
			fc.t.Errorf("fake server: bad frame length %d", n)
			return
		}
		b := make([]byte, n)
		copy(b, h)
		if _, err := io.ReadFull(br, b[4:]); err != nil {
			return
		}
		var r wire.Request
		if _, err := wire.DecodeRequest(b, wire.MaxKeyLen, &r); err != nil {
			fc.t.Errorf("fake server: %v", err)
			return
		}
		r.Key = bytes.Clone(r.Key)
		fc.mu.Lock()
		auto := fc.autoPing
		fc.mu.Unlock()
		if auto && r.Op == wire.OpPing {
			fc.reply(wire.Response{Op: wire.OpPing, ID: r.ID})
			continue
		}
		fc.reqs <- r
	}
}

// answerPings makes the connection answer PING by itself (the client's heartbeat).
func (fc *fakeConn) answerPings() *fakeConn {
	fc.mu.Lock()
	fc.autoPing = true
	fc.mu.Unlock()
	return fc
}

// next waits for the next request.
func (fc *fakeConn) next() wire.Request {
	fc.t.Helper()
	select {
	case r := <-fc.reqs:
		return r
	case <-time.After(bound):
		fc.t.Fatal("fake server: no request")
		return wire.Request{}
	}
}

// nextOp waits for the next request and checks its op.
func (fc *fakeConn) nextOp(op wire.Op) wire.Request {
	fc.t.Helper()
	r := fc.next()
	if r.Op != op {
		fc.t.Fatalf("fake server: got %v id %d, want %v", r.Op, r.ID, op)
	}
	return r
}

// none checks that no request arrives within d.
func (fc *fakeConn) none(d time.Duration) {
	fc.t.Helper()
	select {
	case r := <-fc.reqs:
		fc.t.Fatalf("fake server: unexpected %v id %d", r.Op, r.ID)
	case <-time.After(d):
	}
}

func (fc *fakeConn) reply(r wire.Response) {
	fc.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fc.nc.Write(wire.AppendResponse(nil, &r))
}

func (fc *fakeConn) write(b []byte) {
	fc.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fc.nc.Write(b)
}

// ok answers r with OK (an ACQUIRE or EXTEND with token and lease).
func (fc *fakeConn) ok(r wire.Request, token uint64) {
	resp := wire.Response{Op: r.Op, ID: r.ID}
	switch r.Op {
	case wire.OpAcquire, wire.OpExtend:
		resp.Token, resp.Lease = token, r.Lease
	case wire.OpInspect:
		resp.Data = make([]byte, wire.InspectDataSize)
	}
	fc.reply(resp)
}

// drop closes the connection abruptly.
func (fc *fakeConn) drop() { fc.nc.Close() }

// waitClosed waits until the client closed its side.
func (fc *fakeConn) waitClosed() {
	fc.t.Helper()
	select {
	case <-fc.closed:
	case <-time.After(bound):
		fc.t.Fatal("fake server: the client kept the connection open")
	}
}
