package cluster

import (
	"net"
	"sync"
	"testing"
	"time"
)

// linkNet is one TCP proxy per directed link between the nodes' raft ports: link(i, j) listens
// on node i's host and forwards to node j's raft listener, and node i's TICKETING_PEERS names
// it as j's address. Raft dials only the addresses of its own configuration (each node
// bootstraps with its own TICKETING_PEERS) and advertises its real address in its RPC headers,
// which it compares but never dials, so every byte node i sends towards node j crosses
// link(i, j); the answers come back on the same connection. Cutting link(i, j) therefore stops
// every RPC that i starts towards j (appends and heartbeats when i leads, votes when i
// campaigns) and their answers; cutting both directions separates the two nodes.
//
// A cut link is either a blackhole (connections stay open and bytes vanish, new connections
// are accepted and never answered: what a dropped route looks like) or a reset (connections are
// reset and new ones refused at once). Healing closes every connection the cut touched, so no
// stream resumes with bytes missing from its middle.
type linkNet struct {
	t     *testing.T
	links map[[2]int]*link
}

type linkMode int

const (
	linkUp linkMode = iota
	linkBlackhole
	linkReset
)

type link struct {
	from, to int
	addr     string // where the proxy listens (node from's host)
	target   string // node to's raft listener
	ln       net.Listener

	mu     sync.Mutex
	mode   linkMode
	closed bool
	conns  map[net.Conn]struct{} // both sides of every proxied connection, and held ones
	wg     sync.WaitGroup
}

func newLinkNet(t *testing.T, nodes []*node) *linkNet {
	t.Helper()
	ln := &linkNet{t: t, links: map[[2]int]*link{}}
	for i, a := range nodes {
		for j, b := range nodes {
			if i == j {
				continue
			}
			l, err := net.Listen("tcp", a.host+":0")
			if err != nil {
				t.Fatal(err)
			}
			k := &link{from: i, to: j, addr: l.Addr().String(), target: b.raftAddr, ln: l, conns: map[net.Conn]struct{}{}}
			ln.links[[2]int{i, j}] = k
			k.wg.Add(1)
			go k.accept()
		}
	}
	return ln
}

// link returns the proxy i -> j.
func (n *linkNet) link(i, j int) *link { return n.links[[2]int{i, j}] }

// cut cuts the directed link i -> j.
func (n *linkNet) cut(i, j int, mode linkMode) { n.link(i, j).set(mode) }

// isolate cuts every link from and to node i.
func (n *linkNet) isolate(i int, mode linkMode) {
	for k, l := range n.links {
		if k[0] == i || k[1] == i {
			l.set(mode)
		}
	}
}

// healAll restores every link.
func (n *linkNet) healAll() {
	for _, l := range n.links {
		l.set(linkUp)
	}
}

// cutCount is the number of links not up.
func (n *linkNet) cutCount() int {
	c := 0
	for _, l := range n.links {
		l.mu.Lock()
		if l.mode != linkUp {
			c++
		}
		l.mu.Unlock()
	}
	return c
}

func (n *linkNet) close() {
	for _, l := range n.links {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		l.ln.Close()
		l.set(linkReset) // closes every connection
	}
	for _, l := range n.links {
		l.wg.Wait()
	}
}

// set changes the link's mode. Any change closes the connections it holds: a cut ends them
// (reset) or freezes them (blackhole: see pipe), and healing ends the frozen ones.
func (l *link) set(m linkMode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mode == m {
		return
	}
	old := l.mode
	l.mode = m
	if m == linkBlackhole && old == linkUp {
		return // open connections freeze: pipe drops what they carry from now on
	}
	for c := range l.conns {
		if m == linkReset {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // RST, as from a dead route's ICMP or a firewall reject
			}
		}
		c.Close()
		delete(l.conns, c)
	}
}

func (l *link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *link) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	c.Close()
}

func (l *link) current() linkMode {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mode
}

func (l *link) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		switch l.current() {
		case linkReset:
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
			c.Close()
			continue
		case linkBlackhole:
			// Accepted by the kernel as a SYN into a black hole would not be; raft's dial
			// succeeds and its handshake times out, which is what a silent peer costs.
			if !l.track(c) {
				c.Close()
				continue
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.drain(c)
			}()
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			up, err := net.DialTimeout("tcp", l.target, time.Second)
			if err != nil {
				c.Close() // the target is down: the dialler sees its connection end
				return
			}
			if !l.track(c) || !l.track(up) || l.current() != linkUp {
				l.untrack(c) // cut while dialling
				l.untrack(up)
				return
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				l.pipe(up, c)
			}()
			l.pipe(c, up)
		}()
	}
}

// pipe copies src to dst while the link is up; while it is a blackhole the bytes are read and
// dropped (TCP itself stays up, as on a path that loses every packet after the handshake).
func (l *link) pipe(src, dst net.Conn) {
	defer l.untrack(src)
	defer l.untrack(dst)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && l.current() == linkUp {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// drain reads and drops everything on a connection accepted by a blackholed link.
func (l *link) drain(c net.Conn) {
	defer l.untrack(c)
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}
