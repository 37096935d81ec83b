package main

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The Ticketing protocol, version 1 final, as far as the load generator needs it (see
// ../PROTOCOL.md). The bench module keeps its own copy rather than depend on the wire module, and the
// protocol is small: a four-frame handshake, then every frame is a 32-byte header plus a
// variable part. What a bench connection follows:
//   - it is its own session (a random 16-byte id; the failover client reuses it to resume);
//   - request ids increase in send order per session, starting at 1 (session.take);
//   - it sends ACK (token = the lowest request id still awaited, not counting ACQUIREs) after
//     every ackEvery answers, one ACK at a time (acker), so the server's stored outcomes of
//     RELEASEs stay far below its limit.

const (
	hdrLen = 32

	opHello     = 0x01
	opChallenge = 0x02
	opAuth      = 0x03
	opWelcome   = 0x04
	opAcquire   = 0x10
	opRelease   = 0x11
	opPing      = 0x14
	opAck       = 0x16
	opExpired   = 0x20
	opGoaway    = 0x21

	stOK        = 0
	stTimedOut  = 1
	stNotHeld   = 2
	stInvalid   = 3
	stNotLeader = 4
	stBusy      = 5

	waitForever = 0xFFFFFFFF

	helloLen         = 56
	challengeLen     = 48 // without its data part
	maxChallengeData = 1024
	authLen          = 40
	welcomeLen       = 64

	flagAuthRequired = 0x01 // CHALLENGE
	flagResumed      = 0x01 // WELCOME

	// ackEvery: a bench connection sends ACK after this many answers (the protocol asks for at
	// least one per 1,024).
	ackEvery = 256
)

var be = binary.BigEndian

// appendRequest appends one request frame to b (no allocation when b has room).
func appendRequest(b []byte, op byte, id, token uint64, leaseMs, waitMs uint32, key []byte) []byte {
	n := len(b)
	b = append(b, zeroHdr[:]...)
	h := b[n : n+hdrLen]
	be.PutUint32(h[0:], uint32(28+len(key)))
	h[4] = op
	h[5] = 0
	be.PutUint16(h[6:], uint16(len(key)))
	be.PutUint64(h[8:], id)
	be.PutUint64(h[16:], token)
	be.PutUint32(h[24:], leaseMs)
	be.PutUint32(h[28:], waitMs)
	return append(b, key...)
}

var zeroHdr [hdrLen]byte

// response is the fixed header of an answer.
type response struct {
	op, status byte
	id, token  uint64
	lease      uint32
	detail     uint32
}

// readResponse reads one answer from r, skipping its data part. It does not allocate.
func readResponse(r *bufio.Reader, resp *response) error {
	h, err := r.Peek(hdrLen)
	if err != nil {
		return err
	}
	l := be.Uint32(h[0:])
	if l < 28 || l > 28+65535 {
		return fmt.Errorf("bad frame length %d", l)
	}
	resp.op = h[4]
	resp.status = h[5]
	resp.id = be.Uint64(h[8:])
	resp.token = be.Uint64(h[16:])
	resp.lease = be.Uint32(h[24:])
	resp.detail = be.Uint32(h[28:])
	_, err = r.Discard(int(4 + l))
	return err
}

// session is one client session: its id and its request-id counter.
type session struct {
	id   [16]byte
	next uint64 // the last request id taken
}

// newSession draws a random, non-zero session id.
func newSession() *session {
	s := &session{}
	for s.id == ([16]byte{}) {
		if _, err := rand.Read(s.id[:]); err != nil {
			panic(err)
		}
	}
	return s
}

// take returns the next request id (1, 2, 3, ...): ids are taken in send order.
func (s *session) take() uint64 {
	s.next++
	return s.next
}

// acker follows the ACK rule for one session: count answers, and once ackEvery have arrived
// since the last ACK was sent and no ACK is awaiting its answer, one is due.
type acker struct {
	answers  int
	inflight uint64 // request id of the ACK awaiting its answer; 0: none
}

func (a *acker) due() bool { return a.inflight == 0 && a.answers >= ackEvery }

// appendAck appends ACK(lowest) with a new id of s. lowest is the lowest request id still
// awaited, not counting ACQUIREs; with none awaited, s.next+1 (the id the ACK itself takes).
func (a *acker) appendAck(b []byte, s *session, lowest uint64) []byte {
	id := s.take()
	a.inflight, a.answers = id, 0
	return appendRequest(b, opAck, id, lowest, 0, 0, nil)
}

// answered notes an ACK answer; false if id is not the ACK awaited.
func (a *acker) answered(id uint64) bool {
	if a.inflight == 0 || id != a.inflight {
		return false
	}
	a.inflight = 0
	return true
}

// welcome is what the handshake tells the client.
type welcome struct {
	resumed bool
	graceMs uint32
	stateID [16]byte
}

// notLeaderError is a CHALLENGE NOT_LEADER: a cluster follower; hint is the leader's client
// address, empty when the follower knows none.
type notLeaderError struct{ hint string }

func (e *notLeaderError) Error() string {
	if e.hint == "" {
		return "not the leader (no leader known)"
	}
	return "not the leader; leader at " + e.hint
}

// handshakeClient runs HELLO / CHALLENGE / AUTH (zero proof) / WELCOME on nc for session sid:
// the benchmark runs every server without an auth token.
func handshakeClient(nc net.Conn, sid [16]byte, timeout time.Duration) (*welcome, error) {
	nc.SetDeadline(time.Now().Add(timeout))
	defer nc.SetDeadline(time.Time{})
	var hello [helloLen]byte
	be.PutUint32(hello[0:], helloLen-4)
	hello[4] = opHello
	hello[5] = 1 // version
	copy(hello[8:24], sid[:])
	if _, err := rand.Read(hello[24:]); err != nil { // client nonce
		return nil, err
	}
	if _, err := nc.Write(hello[:]); err != nil {
		return nil, err
	}
	var ch [challengeLen + maxChallengeData]byte
	if _, err := io.ReadFull(nc, ch[:challengeLen]); err != nil {
		return nil, fmt.Errorf("reading CHALLENGE: %w", err)
	}
	n := int(be.Uint16(ch[12:]))
	if ch[4] != opChallenge || n > maxChallengeData || be.Uint32(ch[0:]) != uint32(challengeLen-4+n) {
		return nil, errors.New("not a CHALLENGE frame")
	}
	if _, err := io.ReadFull(nc, ch[challengeLen:challengeLen+n]); err != nil {
		return nil, fmt.Errorf("reading CHALLENGE data: %w", err)
	}
	data := string(ch[challengeLen : challengeLen+n])
	switch ch[5] {
	case stOK:
	case stNotLeader:
		return nil, &notLeaderError{hint: data}
	default:
		return nil, fmt.Errorf("CHALLENGE status %d: %s", ch[5], data)
	}
	if ch[7]&flagAuthRequired != 0 {
		return nil, errors.New("server requires an auth token; the benchmark runs servers without one")
	}
	var auth [authLen]byte
	be.PutUint32(auth[0:], authLen-4)
	auth[4] = opAuth
	if _, err := nc.Write(auth[:]); err != nil {
		return nil, err
	}
	var wel [welcomeLen]byte
	if _, err := io.ReadFull(nc, wel[:]); err != nil {
		return nil, fmt.Errorf("reading WELCOME: %w", err)
	}
	if be.Uint32(wel[0:]) != welcomeLen-4 || wel[4] != opWelcome {
		return nil, errors.New("not a WELCOME frame")
	}
	if wel[5] == stNotLeader {
		return nil, &notLeaderError{}
	}
	if wel[5] != stOK {
		return nil, fmt.Errorf("WELCOME status %d (detail %d)", wel[5], be.Uint32(wel[8:]))
	}
	w := &welcome{resumed: wel[6]&flagResumed != 0, graceMs: be.Uint32(wel[12:])}
	copy(w.stateID[:], wel[16:32])
	return w, nil
}

// dialPrev connects to a server of the protocol before v1 final (system prev; PROTOCOL.md at
// 19e2f99): HELLO as now, a 40-byte CHALLENGE, AUTH with a zero proof, a 40-byte WELCOME.
func dialPrev(addr string, timeout time.Duration) (net.Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (net.Conn, error) { nc.Close(); return nil, err }
	nc.SetDeadline(time.Now().Add(timeout))
	defer nc.SetDeadline(time.Time{})
	var hello [helloLen]byte
	be.PutUint32(hello[0:], helloLen-4)
	hello[4] = opHello
	hello[5] = 1
	if _, err := rand.Read(hello[8:]); err != nil { // session id and client nonce
		return fail(err)
	}
	if _, err := nc.Write(hello[:]); err != nil {
		return fail(err)
	}
	var ch [40]byte
	if _, err := io.ReadFull(nc, ch[:]); err != nil {
		return fail(fmt.Errorf("reading CHALLENGE: %w", err))
	}
	if be.Uint32(ch[0:]) != 36 || ch[4] != opChallenge || ch[5] != stOK || ch[7]&flagAuthRequired != 0 {
		return fail(fmt.Errorf("CHALLENGE op %#x status %d flags %#x: not a server of the earlier protocol without a token", ch[4], ch[5], ch[7]))
	}
	var auth [authLen]byte
	be.PutUint32(auth[0:], authLen-4)
	auth[4] = opAuth
	if _, err := nc.Write(auth[:]); err != nil {
		return fail(err)
	}
	var wel [40]byte
	if _, err := io.ReadFull(nc, wel[:]); err != nil {
		return fail(fmt.Errorf("reading WELCOME: %w", err))
	}
	if be.Uint32(wel[0:]) != 36 || wel[4] != opWelcome || wel[5] != stOK {
		return fail(fmt.Errorf("WELCOME op %#x status %d", wel[4], wel[5]))
	}
	return nc, nil
}

// dialSession connects to a Ticketing (or null) server and completes the handshake for sid.
func dialSession(addr string, sid [16]byte, timeout time.Duration) (net.Conn, *welcome, error) {
	nc, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, nil, err
	}
	w, err := handshakeClient(nc, sid, timeout)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, w, nil
}

// dialTicketing connects as a new session; it returns the connection and its session.
func dialTicketing(addr string) (net.Conn, *session, error) {
	s := newSession()
	nc, _, err := dialSession(addr, s.id, 5*time.Second)
	if err != nil {
		return nil, nil, err
	}
	return nc, s, nil
}

// readResponseData reads one answer like readResponse and returns its data part (a leader's
// address, an error message) appended to dst[:0].
func readResponseData(r *bufio.Reader, resp *response, dst []byte) ([]byte, error) {
	h, err := r.Peek(hdrLen)
	if err != nil {
		return dst[:0], err
	}
	l := be.Uint32(h[0:])
	if l < 28 || l > 28+65535 {
		return dst[:0], fmt.Errorf("bad frame length %d", l)
	}
	resp.op = h[4]
	resp.status = h[5]
	resp.id = be.Uint64(h[8:])
	resp.token = be.Uint64(h[16:])
	resp.lease = be.Uint32(h[24:])
	resp.detail = be.Uint32(h[28:])
	if _, err := r.Discard(hdrLen); err != nil {
		return dst[:0], err
	}
	n := int(l) - 28
	dst = append(dst[:0], make([]byte, n)...)
	_, err = io.ReadFull(r, dst)
	return dst, err
}
