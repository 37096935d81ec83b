package wire

import (
	"crypto/hmac"
	"crypto/sha256"
)

// Hello is the client's first frame.
type Hello struct {
	Version   uint8
	Flags     uint16 // reserved, 0
	SessionID [SessionIDSize]byte
	Nonce     [NonceSize]byte
}

// Challenge is the server's answer to HELLO.
type Challenge struct {
	Status  Status // OK, UNSUPPORTED_VERSION or BUSY (then the server closes)
	Version uint8  // the server's protocol version
	Flags   uint8  // ChallengeAuthRequired
	Nonce   [NonceSize]byte
}

// Auth carries the client's proof (all zero when the server does not require auth).
type Auth struct {
	Proof [ProofSize]byte
}

// Welcome ends the handshake: status OK with the server's proof (zero without auth), or
// AUTH_FAILED / SHUTTING_DOWN, after which the server closes.
type Welcome struct {
	Status Status
	Proof  [ProofSize]byte
}

// AppendHello appends a HELLO frame.
func AppendHello(dst []byte, h *Hello) []byte {
	dst = be.AppendUint32(dst, HelloSize-4)
	dst = append(dst, byte(OpHello), h.Version)
	dst = be.AppendUint16(dst, h.Flags)
	dst = append(dst, h.SessionID[:]...)
	return append(dst, h.Nonce[:]...)
}

// DecodeHello decodes a HELLO frame occupying exactly b.
func DecodeHello(b []byte, h *Hello) error {
	if err := fixedFrame(b, HelloSize, OpHello); err != nil {
		return err
	}
	h.Version = b[5]
	h.Flags = be.Uint16(b[6:])
	copy(h.SessionID[:], b[8:24])
	copy(h.Nonce[:], b[24:56])
	return nil
}

// AppendChallenge appends a CHALLENGE frame.
func AppendChallenge(dst []byte, c *Challenge) []byte {
	dst = be.AppendUint32(dst, ChallengeSize-4)
	dst = append(dst, byte(OpChallenge), byte(c.Status), c.Version, c.Flags)
	return append(dst, c.Nonce[:]...)
}

// DecodeChallenge decodes a CHALLENGE frame occupying exactly b.
func DecodeChallenge(b []byte, c *Challenge) error {
	if err := fixedFrame(b, ChallengeSize, OpChallenge); err != nil {
		return err
	}
	c.Status = Status(b[5])
	c.Version = b[6]
	c.Flags = b[7]
	copy(c.Nonce[:], b[8:40])
	return nil
}

// AppendAuth appends an AUTH frame.
func AppendAuth(dst []byte, a *Auth) []byte {
	dst = be.AppendUint32(dst, AuthSize-4)
	dst = append(dst, byte(OpAuth), 0, 0, 0)
	return append(dst, a.Proof[:]...)
}

// DecodeAuth decodes an AUTH frame occupying exactly b.
func DecodeAuth(b []byte, a *Auth) error {
	if err := fixedFrame(b, AuthSize, OpAuth); err != nil {
		return err
	}
	copy(a.Proof[:], b[8:40])
	return nil
}

// AppendWelcome appends a WELCOME frame.
func AppendWelcome(dst []byte, w *Welcome) []byte {
	dst = be.AppendUint32(dst, WelcomeSize-4)
	dst = append(dst, byte(OpWelcome), byte(w.Status), 0, 0)
	return append(dst, w.Proof[:]...)
}

// DecodeWelcome decodes a WELCOME frame occupying exactly b.
func DecodeWelcome(b []byte, w *Welcome) error {
	if err := fixedFrame(b, WelcomeSize, OpWelcome); err != nil {
		return err
	}
	w.Status = Status(b[5])
	copy(w.Proof[:], b[8:40])
	return nil
}

func fixedFrame(b []byte, size int, op Op) error {
	if len(b) < 5 {
		return ErrShort
	}
	if int(be.Uint32(b))+4 != size || len(b) != size {
		return ErrLength
	}
	if Op(b[4]) != op {
		return ErrWrongOp
	}
	return nil
}

// Labels that separate the two proofs, so one can never be replayed as the other.
const (
	clientLabel = "ticketing/1 client"
	serverLabel = "ticketing/1 server"
)

// ClientProof is HMAC-SHA256(token, "ticketing/1 client" || session id || client nonce || server nonce).
func ClientProof(token []byte, session *[SessionIDSize]byte, clientNonce, serverNonce *[NonceSize]byte) [ProofSize]byte {
	return proof(token, clientLabel, session, clientNonce, serverNonce)
}

// ServerProof is HMAC-SHA256(token, "ticketing/1 server" || session id || client nonce || server nonce).
func ServerProof(token []byte, session *[SessionIDSize]byte, clientNonce, serverNonce *[NonceSize]byte) [ProofSize]byte {
	return proof(token, serverLabel, session, clientNonce, serverNonce)
}

func proof(token []byte, label string, session *[SessionIDSize]byte, cn, sn *[NonceSize]byte) [ProofSize]byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(label))
	m.Write(session[:])
	m.Write(cn[:])
	m.Write(sn[:])
	var out [ProofSize]byte
	m.Sum(out[:0])
	return out
}

// ProofEqual compares two proofs in constant time.
func ProofEqual(a, b *[ProofSize]byte) bool { return hmac.Equal(a[:], b[:]) }
