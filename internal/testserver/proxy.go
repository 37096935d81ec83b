package testserver

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// Proxy relays TCP connections from its own loopback address to a target. A test controls the
// network between a client and a server with it:
//   - DropConns closes every relayed connection but keeps accepting new ones (a flaky network
//     or a middlebox reset: the client sees EOF and reconnects);
//   - Cut stops relaying in both directions and holds every socket open without answering (a
//     partition: the client sees silence, and new connections are accepted but never reach the
//     server);
//   - Refuse resets every new connection at once (a server that is down) until Refuse(false);
//   - NotLeader answers every new connection's HELLO itself with CHALLENGE NOT_LEADER and no
//     leader hint, then closes it (a cluster electing a leader) until NotLeader(false);
//   - HoldNew makes every connection accepted from then on relay the server's first frame (the
//     CHALLENGE) and then hold back what the server sends, as HoldServerBytes does: a test can
//     hold back a WELCOME and whatever follows it;
//   - per connection (Conns): HoldServerBytes keeps what the server sends from reaching the
//     client, ReleaseServerBytes delivers it, and Reset cuts the connection with a TCP RST on
//     both sides, dropping whatever was held;
//   - Close closes everything, the listener included.
//
// The proxy also records the frames it relays (Conn.Frames), split by their 4-byte length
// prefix, as long as the stream looks like the Ticketing protocol (not TLS), and the session id
// of each connection's HELLO (Conn.SessionID).
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu       sync.Mutex
	conns    map[net.Conn]struct{} // every open socket, both sides
	relayed  []*ProxyConn          // every connection accepted, in accept order
	cut      bool
	refuse   bool
	electing bool // NotLeader
	holdNew  bool // HoldNew
	notLed   int  // connections answered NOT_LEADER
	closed   bool
	accepted int
	wg       sync.WaitGroup
}

// NewProxy starts a proxy to target; with a *testing.T it is closed by t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := StartProxy(target)
	if err != nil {
		t.Fatalf("testserver: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// StartProxy is NewProxy without a testing.TB; the caller closes it.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.accepted++
		if p.refuse {
			p.mu.Unlock()
			resetConn(c)
			continue
		}
		if p.electing {
			p.notLed++
			p.conns[c] = struct{}{}
			p.wg.Add(1)
			p.mu.Unlock()
			go p.answerNotLeader(c)
			continue
		}
		pc := &ProxyConn{p: p, ID: p.accepted, Accepted: time.Now(), client: c, done: make(chan struct{}), holdAfterFirst: p.holdNew}
		p.relayed = append(p.relayed, pc)
		p.conns[c] = struct{}{}
		cut := p.cut
		p.mu.Unlock()
		if cut {
			continue // hold it open, never answer
		}
		p.wg.Add(1)
		go p.relay(pc)
	}
}

func (p *Proxy) relay(pc *ProxyConn) {
	defer p.wg.Done()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		p.drop(pc.client)
		pc.markDone()
		return
	}
	p.mu.Lock()
	if p.cut || p.closed {
		p.mu.Unlock()
		s.Close()
		if p.closed {
			p.drop(pc.client)
			pc.markDone()
		}
		return
	}
	p.conns[s] = struct{}{}
	pc.mu.Lock()
	pc.server = s
	reset := pc.reset
	pc.mu.Unlock()
	p.mu.Unlock()
	if reset { // Reset came before the server side existed
		p.drop(s)
		pc.markDone()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(pc, ClientToServer, s, pc.client) }()
	go func() { defer wg.Done(); p.pipe(pc, ServerToClient, pc.client, s) }()
	wg.Wait()
	pc.markDone()
}

// pipe copies src to dst until either fails; after Cut it stops copying but leaves both open.
// Server bytes held back by HoldServerBytes are kept in pc instead of written.
func (p *Proxy) pipe(pc *ProxyConn, dir Direction, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			// Swallow everything from now on; the sockets stay open until Close.
			io.Copy(io.Discard, src)
			return
		}
		if n > 0 {
			pc.observe(dir, buf[:n])
			var werr error
			if dir == ServerToClient {
				werr = pc.writeToClient(buf[:n])
			} else {
				_, werr = dst.Write(buf[:n])
			}
			if werr != nil {
				p.drop(src)
				p.drop(dst)
				return
			}
		}
		if err != nil {
			p.drop(src)
			p.drop(dst)
			return
		}
	}
}

func (p *Proxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// resetConn closes c with a TCP RST instead of a FIN (unsent data is dropped).
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// Cut partitions the network: nothing is relayed any more, in either direction, on existing or
// new connections; sockets stay open and silent.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
}

// Refuse makes the proxy reset every new connection at once (on) or relay them again (off).
// Connections already relayed are not affected.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// HoldNew makes the connections accepted from now on hold back what the server sends after its
// first frame (see ProxyConn.HoldServerBytes), or, off, relay everything again.
func (p *Proxy) HoldNew(on bool) {
	p.mu.Lock()
	p.holdNew = on
	p.mu.Unlock()
}

// NotLeader makes the proxy answer every new connection itself, as a cluster node does while
// no leader is known: it reads the client's HELLO, writes CHALLENGE NOT_LEADER with an empty
// leader hint and closes (on); or relay new connections again (off).
func (p *Proxy) NotLeader(on bool) {
	p.mu.Lock()
	p.electing = on
	p.mu.Unlock()
}

// NotLeaderAnswers returns how many connections NotLeader has answered.
func (p *Proxy) NotLeaderAnswers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.notLed
}

func (p *Proxy) answerNotLeader(c net.Conn) {
	defer p.wg.Done()
	defer p.drop(c)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	hello := make([]byte, wire.HelloSize)
	if _, err := io.ReadFull(c, hello); err != nil {
		return
	}
	c.Write(wire.AppendChallenge(nil, &wire.Challenge{Status: wire.StatusNotLeader, Version: wire.Version}))
}

// DropConns closes every connection relayed so far; new ones are still relayed.
func (p *Proxy) DropConns() {
	p.mu.Lock()
	cs := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// Conns returns every connection the proxy accepted and relayed (open or closed), in accept
// order; a connection reset because of Refuse is not among them.
func (p *Proxy) Conns() []*ProxyConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*ProxyConn(nil), p.relayed...)
}

// Open returns the relayed connections that are still open, in accept order.
func (p *Proxy) Open() []*ProxyConn {
	var open []*ProxyConn
	for _, c := range p.Conns() {
		if !c.IsDone() {
			open = append(open, c)
		}
	}
	return open
}

// Accepted is the number of connections accepted so far (refused ones included).
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.mu.Lock()
	cs := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	p.wg.Wait()
	for _, pc := range p.Conns() {
		pc.markDone()
	}
}

// Direction says which way a frame went through the proxy.
type Direction int

const (
	ClientToServer Direction = iota
	ServerToClient
)

func (d Direction) String() string {
	if d == ClientToServer {
		return "c->s"
	}
	return "s->c"
}

// Frame is one frame the proxy saw: its bytes (4-byte length included), when it arrived at the
// proxy, and whether it was held back at that moment (a held frame reaches the client only if
// ReleaseServerBytes comes before Reset).
type Frame struct {
	At    time.Time
	Dir   Direction
	Held  bool
	Bytes []byte
}

// Op is the frame's operation byte.
func (f Frame) Op() byte { return f.Bytes[4] }

// maxFrames bounds the frames a ProxyConn records.
const maxFrames = 8192

// tapLimit is the largest frame the recorder accepts; a larger length means the stream is not
// (or no longer) the Ticketing protocol, e.g. TLS, and recording stops for that direction.
const tapLimit = 4 + 28 + 0xFFFF

// ProxyConn is one relayed connection. Its methods are safe for concurrent use.
type ProxyConn struct {
	p        *Proxy
	ID       int       // accept order on its proxy, from 1
	Accepted time.Time // when the proxy accepted it
	client   net.Conn
	done     chan struct{}
	doneOnce sync.Once

	wmu sync.Mutex // serialises writes to the client (relay and ReleaseServerBytes)

	mu     sync.Mutex
	server net.Conn // nil until dialled
	reset  bool
	hold   bool
	held   []byte
	// holdAfterFirst: hold (as HoldServerBytes) once the server's first frame has been
	// relayed; first holds its bytes until its length is known.
	holdAfterFirst bool
	first          []byte
	session        [16]byte
	hasSession     bool
	tap            [2][]byte // partial frame per direction
	tapOff         [2]bool
	frames         []Frame
}

func (c *ProxyConn) markDone() { c.doneOnce.Do(func() { close(c.done) }) }

// Done is closed when both sides of the connection are closed.
func (c *ProxyConn) Done() <-chan struct{} { return c.done }

// IsDone reports whether the connection has ended.
func (c *ProxyConn) IsDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// SessionID returns the session id of the connection's HELLO, once the proxy has seen it (not
// through TLS).
func (c *ProxyConn) SessionID() ([16]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session, c.hasSession
}

// HoldServerBytes stops delivering what the server sends on this connection; it is kept until
// ReleaseServerBytes (delivered, in order) or Reset (dropped).
func (c *ProxyConn) HoldServerBytes() {
	c.mu.Lock()
	c.hold = true
	c.mu.Unlock()
}

// ReleaseServerBytes delivers the held bytes and relays normally again.
func (c *ProxyConn) ReleaseServerBytes() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	held := c.held
	c.held, c.hold = nil, false
	c.mu.Unlock()
	if len(held) == 0 {
		return nil
	}
	_, err := c.client.Write(held)
	return err
}

// HeldBytes is the number of server bytes held back now.
func (c *ProxyConn) HeldBytes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.held)
}

// Reset cuts the connection with a TCP RST on both sides; held bytes are dropped.
func (c *ProxyConn) Reset() {
	c.mu.Lock()
	c.reset = true
	c.held, c.hold = nil, true // nothing more reaches the client
	s := c.server
	c.mu.Unlock()
	c.p.mu.Lock()
	delete(c.p.conns, c.client)
	if s != nil {
		delete(c.p.conns, s)
	}
	c.p.mu.Unlock()
	resetConn(c.client)
	if s != nil {
		resetConn(s)
	}
}

func (c *ProxyConn) writeToClient(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if c.holdAfterFirst && !c.hold {
		// Relay up to the end of the first frame, then hold the rest.
		c.first = append(c.first, b...)
		if len(c.first) < 4 {
			c.mu.Unlock()
			return nil
		}
		end := 4 + int(binary.BigEndian.Uint32(c.first))
		if len(c.first) < end {
			c.mu.Unlock()
			return nil
		}
		pass := c.first[:end]
		c.held = append(c.held, c.first[end:]...)
		c.first, c.holdAfterFirst, c.hold = nil, false, true
		c.mu.Unlock()
		_, err := c.client.Write(pass)
		return err
	}
	if c.hold {
		if !c.reset {
			c.held = append(c.held, b...)
		}
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	_, err := c.client.Write(b)
	return err
}

// observe records the frames in b (and the session id of a HELLO).
func (c *ProxyConn) observe(dir Direction, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tapOff[dir] {
		return
	}
	buf := append(c.tap[dir], b...)
	now := time.Now()
	for len(buf) >= 4 {
		n := 4 + int(binary.BigEndian.Uint32(buf))
		if n < 5 || n > tapLimit {
			c.tapOff[dir] = true
			buf = nil
			break
		}
		if len(buf) < n {
			break
		}
		f := append([]byte(nil), buf[:n]...)
		buf = buf[n:]
		if dir == ClientToServer && !c.hasSession && n == 56 && f[4] == 0x01 {
			copy(c.session[:], f[8:24])
			c.hasSession = true
		}
		if len(c.frames) < maxFrames {
			held := dir == ServerToClient && (c.hold || c.holdAfterFirst && len(c.frames) > 0 && c.sawServerFrame())
			c.frames = append(c.frames, Frame{At: now, Dir: dir, Held: held, Bytes: f})
		}
	}
	c.tap[dir] = append(c.tap[dir][:0], buf...)
}

// sawServerFrame reports whether a server frame was recorded already. c.mu must be held.
func (c *ProxyConn) sawServerFrame() bool {
	for _, f := range c.frames {
		if f.Dir == ServerToClient {
			return true
		}
	}
	return false
}

// Frames returns the frames recorded so far on this connection, in the order the proxy saw
// them (both directions).
func (c *ProxyConn) Frames() []Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Frame(nil), c.frames...)
}
