package server

import (
	"crypto/rand"
	"io"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
)

// handshake runs HELLO / CHALLENGE / AUTH / WELCOME under the handshake deadline and reports
// whether the connection may go on. Every failure closes the connection (the caller closes it);
// the answers that PROTOCOL.md documents are sent first.
func (c *conn) handshake() bool {
	s := c.s
	log := s.log.With("remote", c.nc.RemoteAddr().String())
	c.nc.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	var buf [wire.ChallengeSize + wire.MaxChallengeData]byte
	if !readFixed(c.nc, buf[:wire.HelloSize], wire.HelloSize) {
		log.Debug("handshake: no valid HELLO")
		return false
	}
	var hello wire.Hello
	if err := wire.DecodeHello(buf[:wire.HelloSize], &hello); err != nil {
		log.Debug("handshake: bad HELLO", "err", err)
		return false
	}
	ch := wire.Challenge{Status: wire.StatusOK, Version: wire.Version}
	switch {
	case hello.Version != wire.Version:
		ch.Status = wire.StatusUnsupportedVersion
	case s.nconns.Load() > int64(s.cfg.MaxConnections):
		ch.Status = wire.StatusBusy
	case s.isShutting():
		ch.Status = wire.StatusShuttingDown
	}
	if s.cfg.Token != "" {
		ch.Flags = wire.ChallengeAuthRequired
		if _, err := rand.Read(ch.Nonce[:]); err != nil {
			log.Error("handshake: no randomness", "err", err)
			return false
		}
	}
	if _, err := c.nc.Write(wire.AppendChallenge(buf[:0], &ch)); err != nil {
		return false
	}
	if ch.Status != wire.StatusOK {
		log.Info("handshake refused", "status", ch.Status.String(), "client_version", hello.Version)
		c.drainAndClose() // closing with unread input would reset the connection and lose the answer
		return false
	}
	if !readFixed(c.nc, buf[:wire.AuthSize], wire.AuthSize) {
		log.Debug("handshake: no valid AUTH")
		return false
	}
	var auth wire.Auth
	if err := wire.DecodeAuth(buf[:wire.AuthSize], &auth); err != nil {
		log.Debug("handshake: bad AUTH", "err", err)
		return false
	}
	w := wire.Welcome{Status: wire.StatusOK}
	if s.cfg.Token != "" {
		token := []byte(s.cfg.Token)
		want := wire.ClientProof(token, &hello.SessionID, &hello.Nonce, &ch.Nonce)
		if wire.ProofEqual(&want, &auth.Proof) {
			w.Proof = wire.ServerProof(token, &hello.SessionID, &hello.Nonce, &ch.Nonce, &w)
		} else {
			w.Status = wire.StatusAuthFailed
		}
	}
	if _, err := c.nc.Write(wire.AppendWelcome(buf[:0], &w)); err != nil {
		return false
	}
	if w.Status != wire.StatusOK {
		log.Warn("authentication failed")
		c.drainAndClose()
		return false
	}
	c.nc.SetDeadline(time.Time{})
	return true
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

func (s *Server) isShutting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shutting
}
