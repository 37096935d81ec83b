package ticketing

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// redirectError is a handshake answered NOT_LEADER: try leader (the hint) next, or, when it is
// empty, the next endpoint.
type redirectError struct {
	addr, leader string
}

func (e *redirectError) Error() string {
	if e.leader == "" {
		return e.addr + ": not the leader (no leader known)"
	}
	return e.addr + ": not the leader; the leader is " + e.leader
}

func (e *redirectError) Is(target error) bool { return target == ErrNotLeader }

// endpointError is the failure of one endpoint in a connect round.
type endpointError struct {
	addr   string
	kind   error  // ErrUnavailable, ErrTLS, ErrAuthFailed, ErrUnsupportedVersion
	detail string // what happened there
	causes []error
}

func (e *endpointError) Error() string {
	return "ticketing: connect " + e.addr + ": " + kindText(e.kind) + ": " + e.detail
}

// short is the error without the "ticketing: connect" prefix, for a round's summary.
func (e *endpointError) short() string { return e.addr + ": " + e.detail }

func (e *endpointError) Unwrap() []error { return append([]error{e.kind}, e.causes...) }

// kindText is a sentinel's message without the package prefix ("server unavailable").
func kindText(kind error) string { return strings.TrimPrefix(kind.Error(), "ticketing: ") }

// dialEndpoint connects to addr: TCP, optional TLS, then the protocol handshake, all bounded by
// ctx and the dial timeout. The returned connection has read nothing beyond WELCOME.
// handshakeWait bounds TLS and the protocol handshake once TCP is connected (docs/clients.md,
// the connect timeout).
const handshakeWait = 2 * time.Second

func (c *Client) dialEndpoint(ctx context.Context, addr string, session *[wire.SessionIDSize]byte) (net.Conn, *wire.Welcome, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.dialTimeout)
	defer cancel()
	endpointErr := func(kind error, msg string, cause error) error {
		e := &endpointError{addr: addr, kind: kind, detail: msg}
		if cause != nil {
			e.causes = []error{cause}
		}
		return e
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			return nil, nil, endpointErr(ErrUnavailable, "no TCP connection within "+c.opts.dialTimeout.String(), nil)
		}
		return nil, nil, endpointErr(ErrUnavailable, netText(err), nil)
	}
	// TLS and the handshake get at most handshakeWait once TCP is connected: a frozen node's
	// kernel still accepts connections, and the next endpoint should not wait for the dial
	// timeout behind it.
	hsDeadline := time.Now().Add(min(handshakeWait, c.opts.dialTimeout))
	if dl, ok := ctx.Deadline(); ok && dl.Before(hsDeadline) {
		hsDeadline = dl
	}
	nc.SetDeadline(hsDeadline)
	ctx, cancelHS := context.WithDeadline(ctx, hsDeadline)
	defer cancelHS()
	// Unblock the handshake's reads and writes if ctx is cancelled before its deadline.
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
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
			return nil, nil, endpointErr(ErrTLS, "TLS handshake failed: "+tlsText(err, ctx), nil)
		}
		nc = tc
	}
	var nonce [wire.NonceSize]byte
	rand.Read(nonce[:])
	w, err := handshake(nc, session, &nonce, c.opts.token, c.opts.hasToken)
	if err != nil {
		nc.Close()
		var re *redirectError
		switch {
		case errors.As(err, &re):
			re.addr = addr
			detail := "not the leader; no leader known"
			if re.leader != "" {
				detail = "not the leader; the leader is " + re.leader
			}
			return nil, nil, &endpointError{addr: addr, kind: ErrUnavailable, detail: detail, causes: []error{re}}
		case isTimeout(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			// Connected, but no answer: a frozen or half-open server. It matches ErrTimeout too.
			return nil, nil, endpointErr(ErrUnavailable, "timed out: no handshake within "+min(handshakeWait, c.opts.dialTimeout).String()+" of the TCP connection (is the server frozen, or not a Ticketing server?)", ErrTimeout)
		case isKind(err):
			return nil, nil, &endpointError{addr: addr, kind: kindOf(err), detail: causeText(err), causes: []error{err}}
		case c.opts.tls != nil && isTLSAlert(err):
			return nil, nil, endpointErr(ErrTLS, "the server refused the TLS session: "+tlsText(err, ctx)+" (does it require a client certificate?)", nil)
		case c.opts.tls == nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)):
			return nil, nil, endpointErr(ErrUnavailable, "the server closed the connection during the handshake (is the server using TLS?)", nil)
		default:
			return nil, nil, endpointErr(ErrUnavailable, "handshake failed: "+netText(err), nil)
		}
	}
	nc.SetDeadline(time.Time{})
	return nc, w, nil
}

// isKind reports whether err already carries a kind of this package (a handshake verdict).
func isKind(err error) bool {
	var oe *opError
	var se *StatusError
	return errors.As(err, &oe) || errors.As(err, &se)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// netText is a network error's message without the "dial tcp ADDR:" prefix that the caller
// already shows.
func netText(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oneLine(oe.Err.Error())
	}
	return oneLine(err.Error())
}

// isTLSAlert reports whether err came from the TLS layer after the TLS handshake: an alert
// from the server (a missing or refused client certificate is reported on the first read under
// TLS 1.3) or a broken record.
func isTLSAlert(err error) bool {
	var ae tls.AlertError
	var rhe tls.RecordHeaderError
	var oe *net.OpError
	return errors.As(err, &ae) || errors.As(err, &rhe) || (errors.As(err, &oe) && oe.Op == "remote error")
}

// tlsText explains a failed TLS handshake, with a hint for the usual causes.
func tlsText(err error, ctx context.Context) string {
	var rhe tls.RecordHeaderError
	var cve *tls.CertificateVerificationError
	var uae x509.UnknownAuthorityError
	var hne x509.HostnameError
	switch {
	case errors.As(err, &rhe):
		return "the server did not answer with TLS (is the server using TLS?)"
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		return "the server closed the connection (is the server using TLS?)"
	case ctx.Err() != nil || isTimeout(err):
		return "no TLS answer in time (is the server using TLS?)"
	case errors.As(err, &uae):
		return "the server's certificate is signed by an unknown authority (set tls.Config.RootCAs)"
	case errors.As(err, &hne):
		return oneLine(hne.Error()) + " (set tls.Config.ServerName)"
	case errors.As(err, &cve):
		return oneLine(cve.Err.Error())
	}
	return netText(err)
}

// handshake runs HELLO / CHALLENGE / AUTH / WELCOME on rw (PROTOCOL.md, "Handshake") and returns
// the WELCOME. With a token it proves itself and verifies the server's proof in constant time.
// cnonce is this connection's fresh client nonce. It reads exactly the handshake's bytes.
func handshake(rw io.ReadWriter, session *[wire.SessionIDSize]byte, cnonce *[wire.NonceSize]byte, token []byte, hasToken bool) (*wire.Welcome, error) {
	buf := make([]byte, 0, wire.ChallengeSize+wire.MaxChallengeData)
	buf = wire.AppendHello(buf, &wire.Hello{Version: wire.Version, SessionID: *session, Nonce: *cnonce})
	if _, err := rw.Write(buf); err != nil {
		return nil, err
	}

	in := buf[:cap(buf)]
	if _, err := io.ReadFull(rw, in[:4]); err != nil {
		return nil, err
	}
	if in[0] == 0x15 || in[0] == 0x16 {
		// A TLS record (alert or handshake), not a CHALLENGE's length.
		return nil, &opError{kind: ErrTLS, msg: "the server answered with TLS (configure the client with WithTLS)"}
	}
	n, err := wire.ChallengeLen(in[:4])
	if err != nil {
		got, _ := wire.FrameLen(in[:4])
		return nil, &opError{kind: ErrProtocol, msg: fmt.Sprintf("CHALLENGE length %d is outside %d..%d (not a Ticketing server?)", got-4, wire.ChallengeSize-4, wire.ChallengeSize-4+wire.MaxChallengeData)}
	}
	if _, err := io.ReadFull(rw, in[4:n]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	var ch wire.Challenge
	if err := wire.DecodeChallenge(in[:n], &ch); err != nil {
		return nil, &opError{kind: ErrProtocol, msg: "CHALLENGE: " + err.Error()}
	}
	switch {
	case ch.Status == wire.StatusUnsupportedVersion || (ch.Status == wire.StatusOK && ch.Version != wire.Version):
		return nil, &opError{kind: ErrUnsupportedVersion, msg: fmt.Sprintf("the server speaks protocol version %d, this client %d", ch.Version, wire.Version)}
	case ch.Status == wire.StatusNotLeader:
		return nil, &redirectError{leader: string(ch.Data)}
	case ch.Status != wire.StatusOK:
		return nil, &StatusError{Op: "HANDSHAKE", Status: Status(ch.Status), Detail: ch.Detail, Message: string(ch.Data)}
	}
	authRequired := ch.Flags&wire.ChallengeAuthRequired != 0
	if hasToken && !authRequired {
		return nil, &opError{kind: ErrAuthFailed, msg: "the server does not require a token, so it cannot prove it holds ours; refusing it (is it the right server?)"}
	}

	var a wire.Auth
	if authRequired && hasToken {
		a.Proof = wire.ClientProof(token, session, cnonce, &ch.Nonce)
	}
	buf = wire.AppendAuth(buf[:0], &a)
	if _, err := rw.Write(buf); err != nil {
		return nil, err
	}

	var win [wire.WelcomeSize]byte
	if _, err := io.ReadFull(rw, win[:]); err != nil {
		if authRequired && !hasToken && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
			return nil, &opError{kind: ErrAuthFailed, msg: "the server requires a token (WithToken)"}
		}
		return nil, err
	}
	w := new(wire.Welcome)
	if err := wire.DecodeWelcome(win[:], w); err != nil {
		return nil, &opError{kind: ErrProtocol, msg: "WELCOME: " + err.Error()}
	}
	switch {
	case w.Status == wire.StatusAuthFailed && !hasToken:
		return nil, &opError{kind: ErrAuthFailed, msg: "the server requires a token (WithToken)"}
	case w.Status == wire.StatusAuthFailed:
		return nil, &opError{kind: ErrAuthFailed, msg: "the server rejected the token"}
	case w.Status == wire.StatusNotLeader:
		return nil, &redirectError{}
	case w.Status != wire.StatusOK:
		msg := ""
		if w.Status == wire.StatusBusy {
			msg = "limit " + wire.LimitName(w.Detail)
		}
		return nil, &StatusError{Op: "HANDSHAKE", Status: Status(w.Status), Detail: w.Detail, Message: msg}
	}
	if authRequired && hasToken {
		want := wire.ServerProof(token, session, cnonce, &ch.Nonce, w)
		if !wire.ProofEqual(&want, &w.Proof) {
			return nil, &opError{kind: ErrAuthFailed, msg: "the server's proof does not verify: it does not hold the token (or a man in the middle altered the handshake)"}
		}
	}
	return w, nil
}
