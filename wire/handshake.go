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

// Challenge is the server's answer to HELLO. A status other than OK is followed by close.
type Challenge struct {
	Status  Status // OK; UNSUPPORTED_VERSION, INVALID, BUSY, SHUTTING_DOWN, NOT_LEADER
	Version uint8  // the server's protocol version
	Flags   uint8  // ChallengeAuthRequired
	Detail  uint32 // INVALID: Field*; BUSY: Limit*; else 0
	Nonce   [NonceSize]byte
	Data    []byte // NOT_LEADER: the leader's client address (may be empty); errors: a message; at most MaxChallengeData
}

// Auth carries the client's proof (all zero when the server does not require auth).
type Auth struct {
	Proof [ProofSize]byte
}

// Welcome ends the handshake: status OK with the session's state, or AUTH_FAILED, BUSY,
// SHUTTING_DOWN or NOT_LEADER, after which the server closes.
type Welcome struct {
	Status  Status
	Flags   uint8  // WelcomeResumed
	Detail  uint32 // BUSY: Limit*; else 0
	GraceMs uint32 // how long the server keeps a detached session, ms
	StateID [StateIDSize]byte
	Proof   [ProofSize]byte // covers bytes 5..31 of the frame (see ServerProof)
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

// AppendChallenge appends a CHALLENGE frame. Data beyond MaxChallengeData is cut.
func AppendChallenge(dst []byte, c *Challenge) []byte {
	data := c.Data
	if len(data) > MaxChallengeData {
		data = data[:MaxChallengeData]
	}
	dst = be.AppendUint32(dst, uint32(ChallengeSize-4+len(data)))
	dst = append(dst, byte(OpChallenge), byte(c.Status), c.Version, c.Flags)
	dst = be.AppendUint32(dst, c.Detail)
	dst = be.AppendUint16(dst, uint16(len(data)))
	dst = append(dst, 0, 0)
	dst = append(dst, c.Nonce[:]...)
	return append(dst, data...)
}

// ChallengeLen checks the length field at the start of b (4 bytes at least) and returns the
// whole CHALLENGE frame's size, or ErrLength.
func ChallengeLen(b []byte) (int, error) {
	n, err := FrameLen(b)
	if err != nil {
		return 0, err
	}
	if n < ChallengeSize || n > ChallengeSize+MaxChallengeData {
		return 0, ErrLength
	}
	return n, nil
}

// DecodeChallenge decodes a CHALLENGE frame occupying exactly b. c.Data aliases b.
func DecodeChallenge(b []byte, c *Challenge) error {
	n, err := ChallengeLen(b)
	if err != nil {
		return err
	}
	if len(b) != n || int(be.Uint16(b[12:])) != n-ChallengeSize {
		return ErrLength
	}
	if Op(b[4]) != OpChallenge {
		return ErrWrongOp
	}
	c.Status = Status(b[5])
	c.Version = b[6]
	c.Flags = b[7]
	c.Detail = be.Uint32(b[8:])
	copy(c.Nonce[:], b[16:48])
	c.Data = b[ChallengeSize:n:n]
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
	dst = appendWelcomeSigned(dst, w)
	return append(dst, w.Proof[:]...)
}

// appendWelcomeSigned appends bytes 0..31 of a WELCOME frame: everything but the proof.
func appendWelcomeSigned(dst []byte, w *Welcome) []byte {
	dst = be.AppendUint32(dst, WelcomeSize-4)
	dst = append(dst, byte(OpWelcome), byte(w.Status), w.Flags, 0)
	dst = be.AppendUint32(dst, w.Detail)
	dst = be.AppendUint32(dst, w.GraceMs)
	return append(dst, w.StateID[:]...)
}

// DecodeWelcome decodes a WELCOME frame occupying exactly b.
func DecodeWelcome(b []byte, w *Welcome) error {
	if err := fixedFrame(b, WelcomeSize, OpWelcome); err != nil {
		return err
	}
	w.Status = Status(b[5])
	w.Flags = b[6]
	w.Detail = be.Uint32(b[8:])
	w.GraceMs = be.Uint32(b[12:])
	copy(w.StateID[:], b[16:32])
	copy(w.Proof[:], b[32:64])
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
	m := hmac.New(sha256.New, token)
	m.Write([]byte(clientLabel))
	m.Write(session[:])
	m.Write(clientNonce[:])
	m.Write(serverNonce[:])
	var out [ProofSize]byte
	m.Sum(out[:0])
	return out
}

// ServerProof is HMAC-SHA256(token, "ticketing/1 server" || session id || client nonce ||
// server nonce || WELCOME bytes 5..31): the 27 bytes status, flags, reserved, detail,
// session_grace_ms and state_id, exactly as w encodes them. A man in the middle can therefore
// forge neither "same state" nor "resumed".
func ServerProof(token []byte, session *[SessionIDSize]byte, clientNonce, serverNonce *[NonceSize]byte, w *Welcome) [ProofSize]byte {
	var signed [32]byte
	appendWelcomeSigned(signed[:0], w)
	m := hmac.New(sha256.New, token)
	m.Write([]byte(serverLabel))
	m.Write(session[:])
	m.Write(clientNonce[:])
	m.Write(serverNonce[:])
	m.Write(signed[5:32])
	var out [ProofSize]byte
	m.Sum(out[:0])
	return out
}

// ProofEqual compares two proofs in constant time.
func ProofEqual(a, b *[ProofSize]byte) bool { return hmac.Equal(a[:], b[:]) }
