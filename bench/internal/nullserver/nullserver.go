// Package nullserver is the benchmark's I/O limit: it speaks the Ticketing handshake of protocol
// v1 final (without auth; every connection a new session), then answers every request frame
// (32-byte header + key) with a 32-byte answer frame (status OK, the request's op and id,
// token 1) — exactly the sizes Ticketing reads and writes, ACKs included — with no lock table
// and no session state behind it. Like Ticketing it reads every complete frame of a read and
// answers them all with one write. It is its own small binary (cmd/nullserver) so that its RSS
// is that of a minimal Go TCP server, comparable with Ticketing's.
package nullserver

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

const (
	hdrLen       = 32
	helloLen     = 56
	challengeLen = 48 // no data
	authLen      = 40
	welcomeLen   = 64
	graceMs      = 5000
	opHello      = 0x01
	opChallenge  = 0x02
	opAuth       = 0x03
	opWelcome    = 0x04
)

var be = binary.BigEndian

// Serve answers connections on ln until it is closed.
func Serve(ln net.Listener) {
	var state [16]byte // the state id: one per server process, as a single node draws at start
	rand.Read(state[:])
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		go serveConn(nc, state)
	}
}

func serveConn(nc net.Conn, state [16]byte) {
	defer nc.Close()
	if err := handshake(nc, state); err != nil {
		return
	}
	var zero [hdrLen]byte
	rbuf := make([]byte, 16<<10)
	out := make([]byte, 0, 4<<10)
	n := 0
	for {
		m, err := nc.Read(rbuf[n:])
		n += m
		off := 0
		for n-off >= 4 {
			l := int(be.Uint32(rbuf[off:]))
			if l < 28 || l > 28+65535 {
				return
			}
			if n-off < 4+l {
				if 4+l > len(rbuf) { // a frame larger than the buffer: grow it
					nb := make([]byte, 4+l)
					copy(nb, rbuf[off:n])
					rbuf, n, off = nb, n-off, 0
				}
				break
			}
			f := rbuf[off:]
			k := len(out)
			out = append(out, zero[:]...)
			h := out[k:]
			be.PutUint32(h[0:], 28)
			h[4] = f[4]            // op
			copy(h[8:16], f[8:16]) // request id
			be.PutUint64(h[16:], 1)
			off += 4 + l
		}
		if len(out) > 0 {
			if _, werr := nc.Write(out); werr != nil {
				return
			}
			out = out[:0]
		}
		n = copy(rbuf, rbuf[off:n])
		if err != nil {
			return
		}
	}
}

func handshake(nc net.Conn, state [16]byte) error {
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	defer nc.SetDeadline(time.Time{})
	var hello [helloLen]byte
	if _, err := io.ReadFull(nc, hello[:]); err != nil {
		return err
	}
	if be.Uint32(hello[0:]) != helloLen-4 || hello[4] != opHello {
		return fmt.Errorf("bad HELLO")
	}
	var ch [challengeLen]byte
	be.PutUint32(ch[0:], challengeLen-4)
	ch[4], ch[6] = opChallenge, 1 // status OK, version 1, no auth, zero nonce
	if _, err := nc.Write(ch[:]); err != nil {
		return err
	}
	var auth [authLen]byte
	if _, err := io.ReadFull(nc, auth[:]); err != nil {
		return err
	}
	if auth[4] != opAuth {
		return fmt.Errorf("bad AUTH")
	}
	var wel [welcomeLen]byte
	be.PutUint32(wel[0:], welcomeLen-4)
	wel[4] = opWelcome // status OK, a new session, zero proof
	be.PutUint32(wel[12:], graceMs)
	copy(wel[16:32], state[:])
	_, err := nc.Write(wel[:])
	return err
}
