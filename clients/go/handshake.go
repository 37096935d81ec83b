package ticketing

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
)

// handshakeError is a handshake failure that no other endpoint will fix (wrong token, version):
// dialling stops at once instead of trying the next endpoint.
type handshakeError struct{ err error }

func (e *handshakeError) Error() string { return e.err.Error() }
func (e *handshakeError) Unwrap() error { return e.err }

// dialEndpoint connects to addr: TCP, optional TLS, then the protocol handshake, all bounded by
// ctx and the dial timeout.
func (c *Client) dialEndpoint(ctx context.Context, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.dialTimeout)
	defer cancel()
	d := net.Dialer{}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if c.opts.tls != nil {
		cfg := c.opts.tls.Clone()
		if cfg.ServerName == "" {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				cfg.ServerName = host
			}
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("tls: %w", err)
		}
		nc = tc
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	// Unblock the handshake's reads and writes if ctx is cancelled before its deadline.
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	var nonce [wire.NonceSize]byte
	rand.Read(nonce[:])
	err = handshake(nc, &c.session, &nonce, c.opts.token, c.opts.hasToken)
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return nc, nil
}

// handshake runs HELLO / CHALLENGE / AUTH / WELCOME on rw (PROTOCOL.md "Handshake"). With a
// token it proves itself and verifies the server's proof in constant time. cnonce is this
// connection's fresh client nonce.
func handshake(rw io.ReadWriter, session *[wire.SessionIDSize]byte, cnonce *[wire.NonceSize]byte, token []byte, hasToken bool) error {
	buf := make([]byte, 0, wire.HelloSize)
	buf = wire.AppendHello(buf, &wire.Hello{Version: wire.Version, SessionID: *session, Nonce: *cnonce})
	if _, err := rw.Write(buf); err != nil {
		return err
	}

	in := make([]byte, wire.ChallengeSize+wire.MaxChallengeData)
	if _, err := io.ReadFull(rw, in[:4]); err != nil {
		return fmt.Errorf("reading CHALLENGE: %w", err)
	}
	n, err := wire.ChallengeLen(in[:4])
	if err != nil {
		return fmt.Errorf("%w: CHALLENGE: %v", ErrProtocol, err)
	}
	if _, err := io.ReadFull(rw, in[4:n]); err != nil {
		return fmt.Errorf("reading CHALLENGE: %w", err)
	}
	var ch wire.Challenge
	if err := wire.DecodeChallenge(in[:n], &ch); err != nil {
		return fmt.Errorf("%w: CHALLENGE: %v", ErrProtocol, err)
	}
	switch {
	case ch.Status == wire.StatusUnsupportedVersion:
		return &handshakeError{fmt.Errorf("%w: server speaks version %d, client %d", ErrUnsupportedVersion, ch.Version, wire.Version)}
	case ch.Status != wire.StatusOK:
		return &StatusError{Op: "HANDSHAKE", Status: Status(ch.Status), Detail: 0, Message: "server refused the connection"}
	case ch.Version != wire.Version:
		return &handshakeError{fmt.Errorf("%w: server speaks version %d, client %d", ErrUnsupportedVersion, ch.Version, wire.Version)}
	}
	authRequired := ch.Flags&wire.ChallengeAuthRequired != 0
	if hasToken && !authRequired {
		return &handshakeError{fmt.Errorf("%w: the server does not require auth, so it cannot prove it holds the token; refusing it", ErrAuthFailed)}
	}

	var a wire.Auth
	if authRequired && hasToken {
		a.Proof = wire.ClientProof(token, session, cnonce, &ch.Nonce)
	}
	buf = wire.AppendAuth(buf[:0], &a)
	if _, err := rw.Write(buf); err != nil {
		return err
	}

	var win [wire.WelcomeSize]byte
	if _, err := io.ReadFull(rw, win[:]); err != nil {
		if authRequired && !hasToken {
			return &handshakeError{fmt.Errorf("%w: server requires a token", ErrAuthFailed)}
		}
		return fmt.Errorf("reading WELCOME: %w", err)
	}
	var w wire.Welcome
	if err := wire.DecodeWelcome(win[:], &w); err != nil {
		return fmt.Errorf("%w: WELCOME: %v", ErrProtocol, err)
	}
	switch {
	case w.Status == wire.StatusAuthFailed && !hasToken:
		return &handshakeError{fmt.Errorf("%w: server requires a token", ErrAuthFailed)}
	case w.Status == wire.StatusAuthFailed:
		return &handshakeError{fmt.Errorf("%w: the server rejected the token", ErrAuthFailed)}
	case w.Status != wire.StatusOK:
		return &StatusError{Op: "HANDSHAKE", Status: Status(w.Status)}
	}
	if authRequired && hasToken {
		want := wire.ServerProof(token, session, cnonce, &ch.Nonce, &w)
		if !wire.ProofEqual(&want, &w.Proof) {
			return &handshakeError{fmt.Errorf("%w: the server's proof does not verify (it does not hold the token)", ErrAuthFailed)}
		}
	}
	return nil
}
