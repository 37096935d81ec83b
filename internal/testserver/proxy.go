package testserver

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy relays TCP connections from its own loopback address to a target. A test controls the
// network between a client and a server with it:
//   - DropConns closes every relayed connection but keeps accepting new ones (a flaky network
//     or a middlebox reset: the client sees EOF and reconnects);
//   - Cut stops relaying in both directions and holds every socket open without answering (a
//     partition: the client sees silence, and new connections are accepted but never reach the
//     server);
//   - Close closes everything, the listener included.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	cut   bool
	wg    sync.WaitGroup
}

// NewProxy starts a proxy to target; with a *testing.T it is closed by t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testserver: proxy listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		cut := p.cut
		p.mu.Unlock()
		if cut {
			continue // hold it open, never answer
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

func (p *Proxy) relay(c net.Conn) {
	defer p.wg.Done()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		s.Close()
		return
	}
	p.conns[s] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(s, c) }()
	go func() { defer wg.Done(); p.pipe(c, s) }()
	wg.Wait()
}

// pipe copies src to dst until either fails; after Cut it stops copying but leaves both open.
func (p *Proxy) pipe(dst, src net.Conn) {
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
			if _, werr := dst.Write(buf[:n]); werr != nil {
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

// Cut partitions the network: nothing is relayed any more, in either direction, on existing or
// new connections; sockets stay open and silent.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
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

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
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
}
