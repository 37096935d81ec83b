package server

import (
	"container/list"
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/wire"
)

// handshake runs HELLO / CHALLENGE / AUTH / WELCOME under the handshake deadline, attaches the
// session and returns the connection, or false when it must close (the caller closes it). The
// answers PROTOCOL.md documents are sent first. Only the attach runs under Server.mu.
func (s *Server) handshake(nc net.Conn, tcp *net.TCPConn) (*conn, bool) {
	log := s.log.With("remote", nc.RemoteAddr().String())
	deadline := time.Now().Add(s.cfg.HandshakeTimeout)
	nc.SetDeadline(deadline)
	var buf [wire.ChallengeSize + wire.MaxChallengeData]byte
	if !readFixed(nc, buf[:wire.HelloSize], wire.HelloSize) {
		log.Debug("handshake: no valid HELLO")
		return nil, false
	}
	var hello wire.Hello
	if err := wire.DecodeHello(buf[:wire.HelloSize], &hello); err != nil {
		log.Debug("handshake: bad HELLO", "err", err)
		return nil, false
	}
	ch := wire.Challenge{Status: wire.StatusOK, Version: wire.Version}
	switch {
	case hello.Version != wire.Version:
		ch.Status, ch.Data = wire.StatusUnsupportedVersion, []byte(wire.MsgVersion)
	case hello.Flags != 0:
		ch.Status, ch.Detail, ch.Data = wire.StatusInvalid, wire.FieldFlags, []byte(wire.MsgFlags)
	case hello.SessionID == [wire.SessionIDSize]byte{}:
		ch.Status, ch.Detail, ch.Data = wire.StatusInvalid, wire.FieldSession, []byte(wire.MsgSessionZero)
	case s.attached.Load() >= int64(s.cfg.MaxConnections) && !s.attachedElsewhere(hello.SessionID):
		ch.Status, ch.Detail, ch.Data = wire.StatusBusy, wire.LimitConnections, []byte(wire.MsgConnections)
	case s.isStopping():
		ch.Status, ch.Data = wire.StatusShuttingDown, []byte(wire.MsgShuttingDown)
	case !s.sm.serving():
		// The leader hint: a follower answers a new connection with the leader's address.
		ch.Status, ch.Data = wire.StatusNotLeader, []byte(s.sm.leaderHint())
	}
	// The check above only reads the count; the slot is taken here, atomically, so handshakes
	// that pass the check together never serve more than MaxConnections. It is the
	// connection's from the attach on (detach gives it back) and is given back on every path
	// that does not attach.
	// A HELLO naming a session that is attached to another connection is let past a full
	// limit: it is the session's client coming back over a connection it believes dead (often
	// still half-open here), and refusing it would lose the session's locks when its grace
	// ends. Its takeover closes the old connection, which gives that slot back. Session ids
	// are unguessable capabilities, and each such handshake is still bounded by
	// MaxHandshakes and HandshakeTimeout, so this does not open the limit to strangers.
	slot := false
	if ch.Status == wire.StatusOK {
		if slot = s.takeSlot() || s.takeSlotOver(hello.SessionID); !slot {
			ch.Status, ch.Detail, ch.Data = wire.StatusBusy, wire.LimitConnections, []byte(wire.MsgConnections)
		}
	}
	release := func() {
		if slot {
			slot = false
			s.attached.Add(-1)
		}
	}
	defer release()
	keys := s.auth.Load()
	if len(keys.tokens) > 0 {
		ch.Flags = wire.ChallengeAuthRequired
		if ch.Status == wire.StatusOK {
			if _, err := rand.Read(ch.Nonce[:]); err != nil {
				log.Error("handshake: no randomness", "err", err)
				return nil, false
			}
		}
	}
	if _, err := nc.Write(wire.AppendChallenge(buf[:0], &ch)); err != nil {
		return nil, false
	}
	if ch.Status != wire.StatusOK {
		s.metrics.handshakeRefused(ch.Status)
		// NOT_LEADER is routine (every client connect to a follower: clients try the endpoints
		// in turn) and counted in ticketing_handshake_refusals_total; the others say something
		// about a client or a limit.
		lvl := slog.LevelInfo
		if ch.Status == wire.StatusNotLeader {
			lvl = slog.LevelDebug
		}
		log.Log(context.Background(), lvl, "handshake refused", "status", ch.Status.String(), "detail", ch.Detail, "client_version", hello.Version)
		drain(nc, s.cfg.HandshakeTimeout) // closing with unread input would reset the connection and lose the answer
		return nil, false
	}
	if !readFixed(nc, buf[:wire.AuthSize], wire.AuthSize) {
		log.Debug("handshake: no valid AUTH")
		return nil, false
	}
	var auth wire.Auth
	if err := wire.DecodeAuth(buf[:wire.AuthSize], &auth); err != nil {
		log.Debug("handshake: bad AUTH", "err", err)
		return nil, false
	}
	var token []byte
	if len(keys.tokens) > 0 {
		for _, t := range keys.tokens {
			want := wire.ClientProof(t, &hello.SessionID, &hello.Nonce, &ch.Nonce)
			if wire.ProofEqual(&want, &auth.Proof) {
				token = t
				break
			}
		}
		if token == nil {
			s.metrics.authFailure()
			release() // not held through the back-off
			s.authFailed(nc, log, deadline)
			return nil, false
		}
	}

	// Attach the session: the connection is registered first (so that nothing routed to it is
	// lost), the attach is applied (single node) or proposed and committed (cluster), and the
	// route step writes WELCOME first into its output when the attach result comes out.
	c := newConn(s, nc, tcp)
	c.sid = hello.SessionID
	c.hs = &pendingWelcome{cnonce: hello.Nonce, snonce: ch.Nonce, token: token, done: make(chan struct{})}
	s.mu.Lock()
	if s.stopping || !s.sm.serving() {
		s.mu.Unlock()
		release()
		st := wire.StatusShuttingDown
		if !s.stopping {
			st = wire.StatusNotLeader
		}
		s.refuseWelcome(nc, wire.Welcome{Status: st})
		return nil, false
	}
	s.nextConn++
	c.id = s.connBase | s.nextConn
	s.conns[c.id] = c
	slot = false // the connection's now: detach gives it back
	s.sm.attach(c)
	s.routeUnlock(nil, nil)
	select {
	case <-c.hs.done: // a single node: already (the attach was applied above)
	default:
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-c.hs.done:
		case <-t.C:
		case <-s.done:
		}
		t.Stop()
	}
	s.mu.Lock()
	hs := c.hs
	welcomed := hs.welcomed
	if !welcomed {
		s.detach(c) // not attached (yet): the attach, if it still applies, finds the connection gone
	}
	s.routeUnlock(nil, nil)
	if !welcomed { // its detach above gave the slot back
		st := wire.StatusNotLeader
		if hs.busy {
			st = wire.StatusBusy
		}
		s.refuseWelcome(nc, wire.Welcome{Status: st, Detail: hs.detail})
		return nil, false
	}
	c.flush()
	if c.isFailed() {
		s.closeConn(c)
		return nil, false
	}
	// Lift the handshake's deadline, unless a stop (Shutdown, lost leadership) already bounded
	// this connection's reads: stopReading and this are serialised by c.mu.
	c.mu.Lock()
	nc.SetDeadline(time.Time{})
	if !c.readUntil.IsZero() {
		nc.SetReadDeadline(c.readUntil)
	}
	c.mu.Unlock()
	s.metrics.sessionAttached(hs.resumed)
	log.Debug("session attached", "conn", c.id, "resumed", hs.resumed)
	return c, true
}

// pendingWelcome is what a connection needs to write its WELCOME once its attach is applied.
type pendingWelcome struct {
	cnonce, snonce [wire.NonceSize]byte
	token          []byte
	done           chan struct{} // closed when the attach result came
	welcomed       bool          // WELCOME OK is in the output
	ended          bool          // done is closed
	resumed, busy  bool
	detail         uint32
}

// welcome handles an attach result for connection d: WELCOME (OK, resumed or not) goes first
// into its output, or the handshake learns it was refused. A takeover closes the session's
// previous connection. Server.mu must be held.
func (s *Server) welcome(d *conn, o *locktable.Out) {
	hs := d.hs
	if hs == nil || hs.welcomed || hs.ended || d.detached {
		return
	}
	hs.ended = true
	defer close(hs.done)
	if o.Busy {
		hs.busy, hs.detail = true, wire.LimitSessions
		s.log.Warn("handshake refused: too many sessions", "max_sessions", s.cfg.MaxSessions)
		return
	}
	d.owner = o.Owner
	if o.Prev != 0 {
		if old := s.conns[o.Prev]; old != nil && old != d {
			// Only the newest connection of a session is served: the old one (half-open, or
			// simply older) is closed and its unread input dropped. Its session moved here.
			old.detached = true
			delete(s.conns, old.id)
			s.attached.Add(-1)
			old.kill()
		}
	}
	w := wire.Welcome{Status: wire.StatusOK, GraceMs: uint32(s.cfg.SessionGrace / time.Millisecond), StateID: s.sm.stateID()}
	if o.Resumed {
		w.Flags = wire.WelcomeResumed
	}
	if hs.token != nil {
		w.Proof = wire.ServerProof(hs.token, &d.sid, &hs.cnonce, &hs.snonce, &w)
	}
	d.mu.Lock()
	d.out = wire.AppendWelcome(d.out[:0], &w) // first: nothing was queued for d before its attach
	d.mu.Unlock()
	hs.welcomed, hs.resumed = true, o.Resumed
}

// refuseWelcome sends a refusing WELCOME and closes after a short drain.
func (s *Server) refuseWelcome(nc net.Conn, w wire.Welcome) {
	var b [wire.WelcomeSize]byte
	if _, err := nc.Write(wire.AppendWelcome(b[:0], &w)); err == nil {
		drain(nc, s.cfg.HandshakeTimeout)
	}
}

// authFailed answers AUTH_FAILED after this address's back-off (see authFailures) and closes.
func (s *Server) authFailed(nc net.Conn, log interface{ Warn(string, ...any) }, deadline time.Time) {
	host := hostOf(nc.RemoteAddr())
	delay, ok := s.failures.fail(host, time.Now())
	if !ok {
		return // too many failing handshakes from this address at once: close without an answer
	}
	defer s.failures.done(host)
	log.Warn("authentication failed", "backoff", delay)
	if delay > 0 {
		t := time.NewTimer(min(delay, time.Until(deadline)))
		select {
		case <-t.C:
		case <-s.done:
			t.Stop()
		}
	}
	s.refuseWelcome(nc, wire.Welcome{Status: wire.StatusAuthFailed})
}

func hostOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	h, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return h
}

// drain gives the peer a moment to read a final answer, then returns (the caller closes).
func drain(nc net.Conn, d time.Duration) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	nc.SetReadDeadline(time.Now().Add(min(time.Second, d)))
	io.Copy(io.Discard, io.LimitReader(nc, 1<<16))
}

// readFixed reads a fixed-size handshake frame into b, checking its length field first so a
// peer speaking another protocol is turned away without waiting for bytes it will never send.
func readFixed(r io.Reader, b []byte, size int) bool {
	if _, err := io.ReadFull(r, b[:4]); err != nil {
		return false
	}
	if n, _ := wire.FrameLen(b[:4]); n != size {
		return false
	}
	_, err := io.ReadFull(r, b[4:size])
	return err == nil
}

// takeSlot takes one of the MaxConnections connection slots (see Server.attached), or reports
// that none is free.
func (s *Server) takeSlot() bool {
	for {
		n := s.attached.Load()
		if n >= int64(s.cfg.MaxConnections) {
			return false
		}
		if s.attached.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// takeSlotOver takes a slot beyond MaxConnections for a handshake resuming a session that is
// attached to another connection (see handshake).
func (s *Server) takeSlotOver(sid [wire.SessionIDSize]byte) bool {
	if !s.attachedElsewhere(sid) {
		return false
	}
	s.attached.Add(1)
	return true
}

// attachedElsewhere reports whether session sid is attached to a connection now.
func (s *Server) attachedElsewhere(sid [wire.SessionIDSize]byte) bool {
	s.mu.Lock()
	_, conn, _, ok := s.table.Session(sid)
	s.mu.Unlock()
	return ok && conn != 0
}

func (s *Server) isStopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping
}

// pendingSet bounds the connections still in their handshake: beyond the limit, the oldest is
// closed (without an answer), so a flood of idle connections never keeps an authenticated
// client from being served, and each costs little (a goroutine and a small stack buffer).
type pendingSet struct {
	mu  sync.Mutex
	max int
	l   list.List // of net.Conn, oldest first
}

func (p *pendingSet) init(max int) { p.max = max }

func (p *pendingSet) add(nc net.Conn) *list.Element {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.l.Len() >= p.max {
		oldest := p.l.Front()
		p.l.Remove(oldest)
		oldest.Value.(net.Conn).Close()
	}
	return p.l.PushBack(nc)
}

func (p *pendingSet) remove(e *list.Element) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e.Value != nil {
		p.l.Remove(e)
		e.Value = nil
	}
}

func (p *pendingSet) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for e := p.l.Front(); e != nil; e = e.Next() {
		e.Value.(net.Conn).Close()
	}
}

// authFailures slows down wrong-token handshakes per client address (docs/operations.md,
// "Security"): the address has a score, s = max(s' - seconds since its previous failure, 0) + 1
// at each failure (s' its score then; 0 for an address not seen), and that failure's AUTH_FAILED
// waits 10 ms * 2^(floor(s) - 1), at most 2 s: 10, 20, 40 ... ms for failures in quick
// succession, back to 10 ms after a quiet spell as long as the score was. At most 16 failing handshakes of one address wait at once;
// more are closed without an answer. Handshakes that succeed are never delayed, so legitimate
// clients sharing the address are not slowed.
type authFailures struct {
	mu sync.Mutex
	m  map[string]*failRec
}

type failRec struct {
	score   float64
	at      time.Time
	waiting int
}

const (
	failBase       = 10 * time.Millisecond
	failMax        = 2 * time.Second
	failConcurrent = 16
	failMapMax     = 10_000
)

func (f *authFailures) init() { f.m = make(map[string]*failRec) }

func (f *authFailures) fail(host string, now time.Time) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.m[host]
	if r == nil {
		if len(f.m) >= failMapMax {
			for h, x := range f.m { // forget idle addresses; the map stays bounded
				if x.waiting == 0 {
					delete(f.m, h)
				}
			}
		}
		r = &failRec{at: now}
		f.m[host] = r
	}
	r.score = max(r.score-now.Sub(r.at).Seconds(), 0) + 1
	r.at = now
	if r.waiting >= failConcurrent {
		return 0, false
	}
	r.waiting++
	d := failBase << min(int(r.score)-1, 8)
	return min(d, failMax), true
}

func (f *authFailures) done(host string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.m[host]; r != nil {
		r.waiting--
	}
}
