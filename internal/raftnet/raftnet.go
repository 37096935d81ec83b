// Package raftnet is the node-to-node network layer of a Ticketing cluster: a
// hashicorp/raft StreamLayer whose every connection is mutually authenticated with the cluster
// secret before raft sees a byte of it, and optionally encrypted with TLS. An outsider who
// reaches a Raft port — without the secret, with a wrong one, speaking garbage or plaintext to
// TLS — is closed and can never inject state.
//
// The handshake, after TLS when configured (all integers big-endian):
//
//	dialer  -> "TKRN" version(1) reserved(3) nonce_d[32]
//	listener-> nonce_l[32] HMAC-SHA256(secret, "ticketing/raft listener" || nonce_d || nonce_l)
//	dialer  -> HMAC-SHA256(secret, "ticketing/raft dialer" || nonce_d || nonce_l)
//
// Both proofs are compared in constant time; the labels keep one from being replayed as the
// other, and fresh nonces on both sides keep a recorded handshake from being replayed at all.
//
// Accepted connections that have not proved the secret yet are bounded, so that a flood of them
// (idle sockets, garbage; no secret needed) never keeps a peer out: each has AcceptTimeout to
// finish its handshake; at most pendingPerHost of them from one address are kept (a newer one
// closes that address's oldest) and at most pendingMax in all (a newer one closes the oldest).
// A peer's own handshake takes a few round trips, so it completes unless a flood replaces the
// whole pending set within that time.
package raftnet

import (
	"container/list"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

const (
	magic          = "TKRN"
	version        = 1
	nonceSize      = 32
	labelListener  = "ticketing/raft listener"
	labelDialer    = "ticketing/raft dialer"
	pendingMax     = 64              // accepted connections in their handshake; beyond it the oldest is closed
	pendingPerHost = 8               // of them from one address; beyond it that address's oldest is closed
	acceptTimeout  = 2 * time.Second // default Options.AcceptTimeout
)

// ErrAuth is returned by Dial when the peer does not prove it holds the cluster secret.
var ErrAuth = errors.New("raftnet: the peer failed authentication: it holds a different cluster secret, or is not a peer")

// Layer is an authenticated raft.StreamLayer over TCP (and TLS when configured).
type Layer struct {
	ln        net.Listener
	advertise net.Addr
	secret    []byte
	serverTLS *tls.Config // nil: plain TCP
	clientTLS *tls.Config
	timeout   time.Duration
	acceptTO  time.Duration
	log       *slog.Logger
	// localIP: the loopback address the listener is bound to, which Dial also sends from, so
	// that nodes sharing one host on their own loopback addresses (127.0.0.11, .12...) are told
	// apart by address, their outgoing Raft traffic included (a firewall rule, or a test that
	// cuts one node off). nil for any other listener: the kernel picks the source by route.
	localIP net.IP

	accepted chan net.Conn
	done     chan struct{}
	once     sync.Once
	pending  pendingSet
	wg       sync.WaitGroup

	connMu sync.Mutex
	conns  map[*conn]struct{} // dialled (from the TCP connect on) or handed to raft, until closed
	ctx    context.Context    // cancelled by CloseConns: dials in progress and later fail at once
	cancel context.CancelFunc
}

// conn is a connection handed to raft, tracked by its Layer until it is closed.
type conn struct {
	net.Conn
	l    *Layer
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.l.connMu.Lock()
		delete(c.l.conns, c)
		c.l.connMu.Unlock()
	})
	return c.Conn.Close()
}

// track wraps a connection handed to raft.
func (l *Layer) track(nc net.Conn) net.Conn {
	c := &conn{Conn: nc, l: l}
	l.connMu.Lock()
	l.conns[c] = struct{}{}
	l.connMu.Unlock()
	return c
}

// CloseConns closes every connection handed to raft, dialled or accepted, and every dial in
// progress, and makes later dials fail at once. Raft's shutdown waits for the RPCs in flight,
// and on a link that drops packets (no reset) one blocks until its I/O timeout, a dial until its
// handshake timeout: closing the connections under them ends them at once.
func (l *Layer) CloseConns() {
	l.cancel()
	l.connMu.Lock()
	cs := make([]*conn, 0, len(l.conns))
	for c := range l.conns {
		cs = append(cs, c)
	}
	l.connMu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// Options configure a Layer.
type Options struct {
	Secret    []byte        // the cluster secret; required
	ServerTLS *tls.Config   // TLS for accepted connections (with ClientCAs + RequireAndVerifyClientCert for mutual TLS); nil = plain TCP
	ClientTLS *tls.Config   // TLS for dialled connections; must be set exactly when ServerTLS is
	Advertise net.Addr      // the address peers dial (default: the listener's)
	Timeout   time.Duration // handshake bound of Dial; default 5s
	// AcceptTimeout bounds the handshake of an accepted connection (TLS included), which has
	// not proved anything yet; default 2s.
	AcceptTimeout time.Duration
	Logger        *slog.Logger
}

// Listen opens a Layer on addr.
func Listen(addr string, o Options) (*Layer, error) {
	if len(o.Secret) == 0 {
		return nil, errors.New("raftnet: a cluster secret is required")
	}
	if (o.ServerTLS == nil) != (o.ClientTLS == nil) {
		return nil, errors.New("raftnet: server and client TLS go together")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &Layer{
		ln: ln, advertise: o.Advertise, secret: o.Secret, serverTLS: o.ServerTLS, clientTLS: o.ClientTLS,
		timeout: o.Timeout, acceptTO: o.AcceptTimeout, log: o.Logger,
		accepted: make(chan net.Conn), done: make(chan struct{}), conns: map[*conn]struct{}{},
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.pending.init(pendingMax, pendingPerHost)
	if l.advertise == nil {
		l.advertise = ln.Addr()
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		l.localIP = ta.IP
	}
	if l.timeout <= 0 {
		l.timeout = 5 * time.Second
	}
	if l.acceptTO <= 0 {
		l.acceptTO = acceptTimeout
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

func (l *Layer) acceptLoop() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p := l.pending.add(nc) // may close the oldest pending connection(s); nil once closed
		if p == nil {
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			c, err := l.serverHandshake(nc)
			if !l.pending.remove(p) { // closed under it: a newer connection took its place
				l.log.Debug("raft connection closed in its handshake: too many pending", "remote", nc.RemoteAddr().String())
				if c != nil {
					c.Close()
				}
				return
			}
			if err != nil {
				l.log.Warn("raft connection refused", "remote", nc.RemoteAddr().String(), "err", err)
				nc.Close()
				return
			}
			tc := l.track(c)
			select {
			case l.accepted <- tc:
			case <-l.done:
				tc.Close()
			}
		}()
	}
}

// Accept returns the next authenticated connection.
func (l *Layer) Accept() (net.Conn, error) {
	select {
	case c := <-l.accepted:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; connections already handed to raft are raft's.
func (l *Layer) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.ln.Close()
		l.pending.closeAll()
	})
	l.wg.Wait()
	return nil
}

// Addr is the advertised address.
func (l *Layer) Addr() net.Addr { return l.advertise }

// Dial connects to a peer and authenticates both ways.
func (l *Layer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 || timeout > l.timeout {
		timeout = l.timeout
	}
	d := net.Dialer{Timeout: timeout}
	if l.localIP != nil {
		if host, _, err := net.SplitHostPort(string(address)); err == nil {
			if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() && (ip.To4() == nil) == (l.localIP.To4() == nil) {
				d.LocalAddr = &net.TCPAddr{IP: l.localIP}
			}
		}
	}
	raw, err := d.DialContext(l.ctx, "tcp", string(address))
	if err != nil {
		return nil, err
	}
	nc := l.track(raw) // from here on, CloseConns ends the handshake too
	deadline := time.Now().Add(timeout)
	nc.SetDeadline(deadline)
	var c net.Conn = nc
	if l.clientTLS != nil {
		cfg := l.clientTLS.Clone()
		if cfg.ServerName == "" {
			if host, _, err := net.SplitHostPort(string(address)); err == nil {
				cfg.ServerName = host
			}
		}
		tc := tls.Client(nc, cfg)
		if err := tc.Handshake(); err != nil {
			nc.Close()
			return nil, fmt.Errorf("raftnet: tls: %w", err)
		}
		c = tc
	}
	if err := dialHandshake(c, l.secret); err != nil {
		c.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return c, nil
}

func proof(secret []byte, label string, nd, nl []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(nd)
	m.Write(nl)
	return m.Sum(nil)
}

func dialHandshake(c net.Conn, secret []byte) error {
	hello := make([]byte, 8+nonceSize)
	copy(hello, magic)
	hello[4] = version
	nd := hello[8:]
	if _, err := rand.Read(nd); err != nil {
		return err
	}
	if _, err := c.Write(hello); err != nil {
		return err
	}
	resp := make([]byte, nonceSize+sha256.Size)
	if _, err := io.ReadFull(c, resp); err != nil {
		// No answer (a peer that is down, frozen or cut off; or one that refused us): not
		// an authentication failure as far as this node can tell.
		return fmt.Errorf("raftnet: no handshake answer from the peer: %w", err)
	}
	nl := resp[:nonceSize]
	if !hmac.Equal(resp[nonceSize:], proof(secret, labelListener, nd, nl)) {
		return ErrAuth
	}
	_, err := c.Write(proof(secret, labelDialer, nd, nl))
	return err
}

func (l *Layer) serverHandshake(nc net.Conn) (net.Conn, error) {
	nc.SetDeadline(time.Now().Add(l.acceptTO))
	var c net.Conn = nc
	if l.serverTLS != nil {
		tc := tls.Server(nc, l.serverTLS)
		if err := tc.Handshake(); err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		c = tc
	}
	hello := make([]byte, 8+nonceSize)
	if _, err := io.ReadFull(c, hello); err != nil {
		return nil, err
	}
	if string(hello[:4]) != magic || hello[4] != version {
		return nil, errors.New("not a ticketing raft peer")
	}
	nd := hello[8:]
	resp := make([]byte, nonceSize+sha256.Size)
	nl := resp[:nonceSize]
	if _, err := rand.Read(nl); err != nil {
		return nil, err
	}
	copy(resp[nonceSize:], proof(l.secret, labelListener, nd, nl))
	if _, err := c.Write(resp); err != nil {
		return nil, err
	}
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, got); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			// A dialler that cannot verify this node's proof hangs up here: it holds another
			// cluster secret (or it is not a peer at all).
			return nil, errors.New("the peer hung up after this node's proof: it has a different cluster secret, or is not a peer")
		}
		return nil, err
	}
	if !hmac.Equal(got, proof(l.secret, labelDialer, nd, nl)) {
		return nil, ErrAuth
	}
	nc.SetDeadline(time.Time{})
	return c, nil
}

// pendingSet holds the accepted connections still in their handshake, oldest first, and makes
// room for a new one by closing the oldest of its address (more than perHost from it) or the
// oldest of all (more than max in all). A peer's handshake is short, so it is rarely the oldest.
type pendingSet struct {
	mu      sync.Mutex
	max     int
	perHost int
	l       list.List // of *pendingConn, oldest first
	hosts   map[string]int
	closed  bool
}

type pendingConn struct {
	nc   net.Conn
	host string
	el   *list.Element // nil once removed
}

func (p *pendingSet) init(max, perHost int) {
	p.max, p.perHost = max, perHost
	p.hosts = make(map[string]int)
}

// add registers nc, closing whatever it replaces; it returns nil (and closes nc) once the set
// is closed.
func (p *pendingSet) add(nc net.Conn) *pendingConn {
	pc := &pendingConn{nc: nc, host: hostOf(nc.RemoteAddr())}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		nc.Close()
		return nil
	}
	if p.hosts[pc.host] >= p.perHost {
		for e := p.l.Front(); e != nil; e = e.Next() {
			if old := e.Value.(*pendingConn); old.host == pc.host {
				p.evict(old)
				break
			}
		}
	}
	for p.l.Len() >= p.max {
		p.evict(p.l.Front().Value.(*pendingConn))
	}
	pc.el = p.l.PushBack(pc)
	p.hosts[pc.host]++
	return pc
}

func (p *pendingSet) evict(pc *pendingConn) {
	p.unlink(pc)
	pc.nc.Close()
}

func (p *pendingSet) unlink(pc *pendingConn) {
	p.l.Remove(pc.el)
	pc.el = nil
	if p.hosts[pc.host]--; p.hosts[pc.host] <= 0 {
		delete(p.hosts, pc.host)
	}
}

// remove takes pc out of the set when its handshake ended; false if it was closed meanwhile.
func (p *pendingSet) remove(pc *pendingConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc.el == nil {
		return false
	}
	p.unlink(pc)
	return true
}

func (p *pendingSet) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.l.Len()
}

// closeAll closes every pending connection, and any added later.
func (p *pendingSet) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for p.l.Len() > 0 {
		p.evict(p.l.Front().Value.(*pendingConn))
	}
}

func hostOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}
