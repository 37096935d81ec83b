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

// The Ticketing protocol, version 1, as far as the load generator needs it (see ../PROTOCOL.md).
// The bench module cannot import the server's internal/wire package, and the protocol is small:
// every frame after the handshake is a 32-byte header plus a variable part.

const (
	hdrLen = 32

	opHello     = 0x01
	opChallenge = 0x02
	opAuth      = 0x03
	opWelcome   = 0x04
	opAcquire   = 0x10
	opRelease   = 0x11
	opPing      = 0x14

	stOK       = 0
	stTimedOut = 1
	stNotHeld  = 2

	waitForever = 0xFFFFFFFF

	helloLen     = 56
	challengeLen = 40
	authLen      = 40
	welcomeLen   = 40

	flagAuthRequired = 0x01
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

// handshakeClient runs HELLO / CHALLENGE / AUTH (zero proof) / WELCOME on nc: the benchmark runs
// every server without an auth token.
func handshakeClient(nc net.Conn, timeout time.Duration) error {
	nc.SetDeadline(time.Now().Add(timeout))
	defer nc.SetDeadline(time.Time{})
	var hello [helloLen]byte
	be.PutUint32(hello[0:], helloLen-4)
	hello[4] = opHello
	hello[5] = 1                                    // version
	if _, err := rand.Read(hello[8:]); err != nil { // session id and client nonce
		return err
	}
	if _, err := nc.Write(hello[:]); err != nil {
		return err
	}
	var ch [challengeLen]byte
	if _, err := io.ReadFull(nc, ch[:]); err != nil {
		return fmt.Errorf("reading CHALLENGE: %w", err)
	}
	if be.Uint32(ch[0:]) != challengeLen-4 || ch[4] != opChallenge {
		return errors.New("not a CHALLENGE frame")
	}
	if ch[5] != stOK {
		return fmt.Errorf("CHALLENGE status %d", ch[5])
	}
	if ch[7]&flagAuthRequired != 0 {
		return errors.New("server requires an auth token; the benchmark runs servers without one")
	}
	var auth [authLen]byte
	be.PutUint32(auth[0:], authLen-4)
	auth[4] = opAuth
	if _, err := nc.Write(auth[:]); err != nil {
		return err
	}
	var wel [welcomeLen]byte
	if _, err := io.ReadFull(nc, wel[:]); err != nil {
		return fmt.Errorf("reading WELCOME: %w", err)
	}
	if wel[4] != opWelcome || wel[5] != stOK {
		return fmt.Errorf("WELCOME op %#x status %d", wel[4], wel[5])
	}
	return nil
}

// dialTicketing connects to a Ticketing (or null) server and completes the handshake.
func dialTicketing(addr string) (net.Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if err := handshakeClient(nc, 5*time.Second); err != nil {
		nc.Close()
		return nil, err
	}
	return nc, nil
}
