package cluster

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// session is a raw protocol client for workloads under faults: one session (a random 16-byte
// id) that follows the leader the way PROTOCOL.md asks of every client. It tries the leader
// hint (NOT_LEADER, GOAWAY) first and then every endpoint; it resumes its session and re-sends
// an unanswered request with its original id and fields; a connection that stays silent past
// the heartbeat gets a PING, and one that does not answer that either is given up. It never
// fails the test itself (it runs in workload goroutines): what it saw goes back in a call.
//
// One request at a time (plus its heartbeat PING): a workload runs one session per worker.
type session struct {
	eps      []string
	sid      [wire.SessionIDSize]byte
	nc       net.Conn
	buf      []byte
	state    [wire.StateIDSize]byte
	hasState bool
	resumed  bool
	hint     string
	next     int    // endpoint to try first (the one that served last)
	lastID   uint64 // the session's request ids so far (in send order)
	answers  int    // answers since the last ACK
	hb       time.Duration
	onPush   func(r wire.Response, at time.Time) // EXPIRED notices
	stats    sessionStats
}

type sessionStats struct {
	connects, goaways, notLeader, resends, pings, deadConns int
	reconnecting                                            time.Duration // spent finding a leader after the first connect, in all
	longestReconnect                                        time.Duration
}

// outcome of a call.
type outcome int

const (
	answered outcome = iota
	unknownOutcome
)

// call is one request as the session sent it: first and last transmission (the one that got
// the answer), the answer and when it came.
type call struct {
	req         wire.Request
	first, last time.Time
	sends       int
	ret         time.Time
	resp        wire.Response
	outcome     outcome
	why         string // unknownOutcome: why
}

var (
	errGoaway       = errors.New("GOAWAY")
	errDeadConn     = errors.New("connection dead")
	errPastDeadline = errors.New("deadline passed")
	errStateChanged = errors.New("the state id changed")
	errNotLeader    = errors.New("not the leader")
)

func newSession(eps []string, hb time.Duration) *session {
	s := &session{eps: eps, hb: hb}
	rand.Read(s.sid[:])
	return s
}

// close drops the connection; the server keeps the session for its grace.
func (s *session) close() {
	if s.nc != nil {
		s.nc.Close()
		s.nc = nil
	}
}

// do sends req with a new request id and waits for its answer until deadline, reconnecting and
// re-sending as needed. An answer it cannot get (deadline, session ended, state changed) is
// an unknown outcome.
func (s *session) do(req wire.Request, deadline time.Time) *call {
	s.lastID++
	req.ID = s.lastID
	c := &call{req: req}
	for {
		if s.nc == nil {
			had := s.hasState
			t0 := time.Now()
			err := s.connect(deadline)
			if had {
				s.stats.reconnecting += time.Since(t0)
				s.stats.longestReconnect = max(s.stats.longestReconnect, time.Since(t0))
			}
			if err != nil {
				c.outcome, c.why = unknownOutcome, err.Error()
				return c
			}
			if had && !s.resumed && c.sends > 0 {
				// The session ended: what was in flight may or may not have run.
				c.outcome, c.why = unknownOutcome, "session not resumed"
				return c
			}
		}
		now := time.Now()
		if c.sends == 0 {
			c.first = now
		} else {
			s.stats.resends++
		}
		c.last = now
		c.sends++
		s.nc.SetWriteDeadline(now.Add(time.Second))
		if _, err := s.nc.Write(wire.AppendRequest(nil, &c.req)); err != nil {
			s.close()
			continue
		}
		r, err := s.await(c.req.ID, deadline)
		switch {
		case err == nil && r.Status == wire.StatusNotLeader:
			s.stats.notLeader++
			s.hint = string(r.Data)
			s.close()
		case err == nil:
			c.resp, c.ret, c.outcome = r, time.Now(), answered
			s.answers++
			return c
		case errors.Is(err, errPastDeadline):
			c.outcome, c.why = unknownOutcome, "no answer before the deadline"
			return c
		default:
			s.close()
		}
	}
}

// await reads frames until the answer to id; EXPIRED notices go to onPush, GOAWAY and a dead
// connection end the wait with an error.
func (s *session) await(id uint64, deadline time.Time) (wire.Response, error) {
	var ping uint64
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return wire.Response{}, errPastDeadline
		}
		r, err := s.read(min(s.hb, left))
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				return r, errDeadConn
			}
			if time.Until(deadline) <= 0 {
				return r, errPastDeadline
			}
			if ping != 0 {
				s.stats.deadConns++
				return r, errDeadConn // silent through a heartbeat and a PING
			}
			s.lastID++
			ping = s.lastID
			s.stats.pings++
			s.nc.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := s.nc.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpPing, ID: ping})); err != nil {
				return r, errDeadConn
			}
			continue
		}
		switch {
		case r.ID == 0 && r.Op == wire.OpGoaway:
			s.stats.goaways++
			s.hint = string(r.Data)
			return r, errGoaway
		case r.ID == 0:
			if s.onPush != nil {
				s.onPush(r, time.Now())
			}
		case r.ID == id:
			return r, nil
		case r.ID == ping:
			ping = 0
		}
	}
}

// read returns the next frame, waiting at most d.
func (s *session) read(d time.Duration) (wire.Response, error) {
	s.nc.SetReadDeadline(time.Now().Add(d))
	for {
		if size, err := wire.FrameLen(s.buf); err == nil && len(s.buf) >= size {
			var r wire.Response
			_, err := wire.DecodeResponse(s.buf, wire.MaxDataLen, &r)
			r.Data = bytes.Clone(r.Data)
			s.buf = s.buf[size:]
			if err != nil {
				return r, fmt.Errorf("bad frame: %w", err)
			}
			return r, nil
		}
		tmp := make([]byte, 4096)
		n, err := s.nc.Read(tmp)
		s.buf = append(s.buf, tmp[:n]...)
		if err != nil && n == 0 {
			return wire.Response{}, err
		}
	}
}

// connect finds the leader (hint first, then every endpoint) and resumes the session there.
func (s *session) connect(deadline time.Time) error {
	backoff := 10 * time.Millisecond
	for time.Now().Before(deadline) {
		tried := map[string]bool{}
		cands := make([]string, 0, len(s.eps)+1)
		if s.hint != "" {
			cands = append(cands, s.hint)
			s.hint = ""
		}
		for i := range s.eps {
			cands = append(cands, s.eps[(s.next+i)%len(s.eps)])
		}
		for len(cands) > 0 && time.Now().Before(deadline) {
			a := cands[0]
			cands = cands[1:]
			if tried[a] {
				continue
			}
			tried[a] = true
			hint, err := s.handshake(a, deadline)
			if err == nil {
				for i, e := range s.eps {
					if e == a {
						s.next = i
					}
				}
				s.stats.connects++
				return nil
			}
			if errors.Is(err, errStateChanged) {
				return err
			}
			if hint != "" && !tried[hint] {
				cands = append([]string{hint}, cands...)
			}
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 100*time.Millisecond)
	}
	return errors.New("no leader reachable before the deadline")
}

// handshake runs HELLO/CHALLENGE/AUTH/WELCOME on addr (no auth token); on NOT_LEADER it
// returns the hint.
func (s *session) handshake(addr string, deadline time.Time) (string, error) {
	nc, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) { nc.Close(); return "", err }
	nc.SetDeadline(minTime(time.Now().Add(700*time.Millisecond), deadline))
	h := wire.Hello{Version: wire.Version, SessionID: s.sid}
	rand.Read(h.Nonce[:])
	if _, err := nc.Write(wire.AppendHello(nil, &h)); err != nil {
		return fail(err)
	}
	ch, err := readChallenge(nc)
	if err != nil {
		return fail(err)
	}
	if ch.Status == wire.StatusNotLeader {
		nc.Close()
		return string(ch.Data), errNotLeader
	}
	if ch.Status != wire.StatusOK {
		return fail(fmt.Errorf("CHALLENGE %v", ch.Status))
	}
	// WELCOME comes once the session's ATTACH has committed.
	nc.SetDeadline(minTime(time.Now().Add(2500*time.Millisecond), deadline))
	if _, err := nc.Write(wire.AppendAuth(nil, &wire.Auth{})); err != nil {
		return fail(err)
	}
	wb := make([]byte, wire.WelcomeSize)
	if _, err := io.ReadFull(nc, wb); err != nil {
		return fail(err)
	}
	var w wire.Welcome
	if err := wire.DecodeWelcome(wb, &w); err != nil {
		return fail(err)
	}
	if w.Status != wire.StatusOK {
		return fail(fmt.Errorf("WELCOME %v", w.Status))
	}
	nc.SetDeadline(time.Time{})
	if s.hasState && w.StateID != s.state {
		nc.Close()
		return "", fmt.Errorf("%w: %x -> %x", errStateChanged, s.state[:4], w.StateID[:4])
	}
	s.state, s.hasState = w.StateID, true
	s.resumed = w.Flags&wire.WelcomeResumed != 0
	s.nc, s.buf = nc, nil
	return "", nil
}

// ack sends ACK(x) with x the next id (nothing else is awaited between calls) and returns
// whether it was answered.
func (s *session) ack(deadline time.Time) bool {
	c := s.do(wire.Request{Op: wire.OpAck, Token: s.lastID + 1}, deadline)
	if c.outcome == answered {
		s.answers = 0
		return true
	}
	return false
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
