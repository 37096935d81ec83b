package ticketing

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"testing/iotest"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// The language-neutral vectors (protocol/vectors.json) and code tables (protocol/constants.json)
// that every client checks itself against, read at test time.

type vectorFile struct {
	Requests []struct {
		Name   string `json:"name"`
		Fields struct {
			Op      string `json:"op"`
			Flags   uint8  `json:"flags"`
			ID      string `json:"id"`
			Token   string `json:"token"`
			LeaseMs uint32 `json:"lease_ms"`
			WaitMs  uint32 `json:"wait_ms"`
			KeyHex  string `json:"key_hex"`
		} `json:"fields"`
		Hex string `json:"hex"`
	} `json:"requests"`
	Responses []struct {
		Name   string `json:"name"`
		Fields struct {
			Op      string `json:"op"`
			Status  string `json:"status"`
			ID      string `json:"id"`
			Token   string `json:"token"`
			LeaseMs uint32 `json:"lease_ms"`
			Detail  uint32 `json:"detail"`
			DataHex string `json:"data_hex"`
		} `json:"fields"`
		Hex string `json:"hex"`
	} `json:"responses"`
	Handshake []handshakeVector `json:"handshake"`
	Auth      []struct {
		Name           string `json:"name"`
		TokenUTF8      string `json:"token_utf8"`
		SessionIDHex   string `json:"session_id_hex"`
		ClientNonceHex string `json:"client_nonce_hex"`
		ServerNonceHex string `json:"server_nonce_hex"`
		WelcomeFlags   uint8  `json:"welcome_flags"`
		GraceMs        uint32 `json:"session_grace_ms"`
		StateIDHex     string `json:"state_id_hex"`
		ClientProofHex string `json:"client_proof_hex"`
		ServerProofHex string `json:"server_proof_hex"`
	} `json:"auth"`
	Malformed []struct {
		Name   string `json:"name"`
		Kind   string `json:"kind"`
		MaxVar int    `json:"max_var"`
		Hex    string `json:"hex"`
		Error  string `json:"error"`
	} `json:"malformed"`
}

type handshakeVector struct {
	Name         string `json:"name"`
	Direction    string `json:"direction"`
	Op           string `json:"op"`
	Version      uint8  `json:"version"`
	Flags        uint16 `json:"flags"`
	Status       string `json:"status"`
	Detail       uint32 `json:"detail"`
	SessionIDHex string `json:"session_id_hex"`
	NonceHex     string `json:"nonce_hex"`
	ProofHex     string `json:"proof_hex"`
	GraceMs      uint32 `json:"session_grace_ms"`
	StateIDHex   string `json:"state_id_hex"`
	DataHex      string `json:"data_hex"`
	Hex          string `json:"hex"`
}

func protocolFile(name string) string { return filepath.Join("..", "..", "protocol", name) }

func loadVectors(t *testing.T) *vectorFile {
	t.Helper()
	b, err := os.ReadFile(protocolFile("vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Requests) == 0 || len(v.Responses) == 0 || len(v.Handshake) == 0 || len(v.Auth) == 0 || len(v.Malformed) == 0 {
		t.Fatal("vectors.json: a list is empty")
	}
	return &v
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

func u64(t testing.TB, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (v *vectorFile) response(t *testing.T, name string) []byte {
	t.Helper()
	for _, r := range v.Responses {
		if r.Name == name {
			return unhex(t, r.Hex)
		}
	}
	t.Fatalf("no response vector %q", name)
	return nil
}

func (v *vectorFile) request(t *testing.T, name string) []byte {
	t.Helper()
	for _, r := range v.Requests {
		if r.Name == name {
			return unhex(t, r.Hex)
		}
	}
	t.Fatalf("no request vector %q", name)
	return nil
}

func (v *vectorFile) hs(t *testing.T, name string) handshakeVector {
	t.Helper()
	for _, h := range v.Handshake {
		if h.Name == name {
			return h
		}
	}
	t.Fatalf("no handshake vector %q", name)
	return handshakeVector{}
}

func opByName(t *testing.T, name string) wire.Op {
	t.Helper()
	for _, o := range wire.Ops {
		if o.Name == name {
			return wire.Op(o.Value)
		}
	}
	t.Fatalf("unknown op %q", name)
	return 0
}

func statusByName(t *testing.T, name string) wire.Status {
	t.Helper()
	for _, s := range wire.Statuses {
		if s.Name == name {
			return wire.Status(s.Value)
		}
	}
	t.Fatalf("unknown status %q", name)
	return 0
}

// TestConstants checks every code table of protocol/constants.json against what the client uses.
func TestConstants(t *testing.T) {
	b, err := os.ReadFile(protocolFile("constants.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tables struct {
		Version        int            `json:"version"`
		Sizes          map[string]int `json:"sizes"`
		Ops            []wire.Named   `json:"ops"`
		Statuses       []wire.Named   `json:"statuses"`
		InvalidFields  []wire.Named   `json:"invalid_fields"`
		BusyLimits     []wire.Named   `json:"busy_limits"`
		ExpiredReasons []wire.Named   `json:"expired_reasons"`
		GoawayReasons  []wire.Named   `json:"goaway_reasons"`
		InspectFlags   []wire.Named   `json:"inspect_flags"`
		ClientRules    map[string]int `json:"client_rules"`
	}
	if err := json.Unmarshal(b, &tables); err != nil {
		t.Fatal(err)
	}
	if tables.Version != wire.Version {
		t.Errorf("constants.json version %d, client %d", tables.Version, wire.Version)
	}

	// Statuses: the client's exported codes, their names and sentinels.
	mine := map[string]Status{
		"OK": StatusOK, "TIMED_OUT": StatusTimedOut, "NOT_HELD": StatusNotHeld, "INVALID": StatusInvalid,
		"NOT_LEADER": StatusNotLeader, "BUSY": StatusBusy, "SHUTTING_DOWN": StatusShuttingDown,
		"AUTH_FAILED": StatusAuthFailed, "UNSUPPORTED_VERSION": StatusUnsupportedVersion, "CANCELLED": StatusCancelled,
	}
	if len(tables.Statuses) != len(mine) {
		t.Errorf("constants.json has %d statuses, the client %d", len(tables.Statuses), len(mine))
	}
	for _, s := range tables.Statuses {
		st, ok := mine[s.Name]
		if !ok || uint32(st) != s.Value || st.String() != s.Name {
			t.Errorf("status %s = %d in constants.json; client has %d %q (%v)", s.Name, s.Value, st, st.String(), ok)
			continue
		}
		if st != StatusOK {
			if st.sentinel() == nil || !errors.Is(&StatusError{Op: "ACQUIRE", Status: st}, st.sentinel()) {
				t.Errorf("status %s has no sentinel error", s.Name)
			}
		}
	}
	if unknown := (&StatusError{Op: "PING", Status: 200}); errors.Is(unknown, ErrNotHeld) || !bytes.Contains([]byte(unknown.Error()), []byte("0xc8")) {
		t.Errorf("unknown status: %v", unknown)
	}

	// Ops: every op the client sends or receives, by name.
	ops := map[string]wire.Op{
		"HELLO": wire.OpHello, "CHALLENGE": wire.OpChallenge, "AUTH": wire.OpAuth, "WELCOME": wire.OpWelcome,
		"ACQUIRE": wire.OpAcquire, "RELEASE": wire.OpRelease, "EXTEND": wire.OpExtend, "CANCEL": wire.OpCancel,
		"PING": wire.OpPing, "INSPECT": wire.OpInspect, "ACK": wire.OpAck, "EXPIRED": wire.OpExpired, "GOAWAY": wire.OpGoaway,
	}
	if len(tables.Ops) != len(ops) {
		t.Errorf("constants.json has %d ops, the client knows %d", len(tables.Ops), len(ops))
	}
	for _, o := range tables.Ops {
		if op, ok := ops[o.Name]; !ok || uint32(op) != o.Value {
			t.Errorf("op %s = %d in constants.json; client uses %d", o.Name, o.Value, op)
		}
	}

	// Field and limit codes: the names the client's errors show.
	for _, f := range tables.InvalidFields {
		if n := (&StatusError{Status: StatusInvalid, Detail: f.Value}).DetailName(); n != f.Name {
			t.Errorf("INVALID detail %d: client names it %q, constants.json %q", f.Value, n, f.Name)
		}
	}
	for _, l := range tables.BusyLimits {
		if n := (&StatusError{Status: StatusBusy, Detail: l.Value}).DetailName(); n != l.Name {
			t.Errorf("BUSY detail %d: client names it %q, constants.json %q", l.Value, n, l.Name)
		}
	}
	// EXPIRED reasons map onto the lost reasons.
	reasons := map[string]uint32{"LEASE": wire.ExpiredLease, "STOPPING": wire.ExpiredStopping}
	for _, r := range tables.ExpiredReasons {
		if v, ok := reasons[r.Name]; !ok || v != r.Value {
			t.Errorf("EXPIRED reason %s = %d; client uses %d", r.Name, r.Value, v)
		}
	}
	goaway := map[string]uint32{"LEADERSHIP": wire.GoawayLeadership, "STOPPING": wire.GoawayStopping}
	for _, r := range tables.GoawayReasons {
		if v, ok := goaway[r.Name]; !ok || v != r.Value {
			t.Errorf("GOAWAY reason %s = %d; client uses %d", r.Name, r.Value, v)
		}
	}
	flags := map[string]uint32{"HELD": wire.InspectHeld, "TOKEN_MATCH": wire.InspectTokenMatch, "SESSION": wire.InspectSession, "STALLED": wire.InspectStalled,
		"STARTUP": wire.InspectStartup}
	if len(tables.InspectFlags) != len(flags) {
		t.Errorf("constants.json has %d INSPECT flags, the client knows %d", len(tables.InspectFlags), len(flags))
	}
	for _, f := range tables.InspectFlags {
		if v, ok := flags[f.Name]; !ok || v != f.Value {
			t.Errorf("INSPECT flag %s = %d; client uses %d", f.Name, f.Value, v)
		}
	}
	sizes := map[string]int{
		"AUTH": wire.AuthSize, "CHALLENGE": wire.ChallengeSize, "CHALLENGE_AUTH_REQUIRED": int(wire.ChallengeAuthRequired),
		"HEADER": wire.HeaderSize, "HELLO": wire.HelloSize, "INSPECT_DATA": wire.InspectDataSize,
		"MAX_CHALLENGE_DATA": wire.MaxChallengeData, "MAX_DATA_LEN": wire.MaxDataLen, "MAX_KEY_LEN": MaxKeyLen,
		"NONCE": wire.NonceSize, "PROOF": wire.ProofSize, "SESSION_ID": wire.SessionIDSize, "STATE_ID": wire.StateIDSize,
		"WAIT_FOREVER": int(wire.WaitForever), "WELCOME": wire.WelcomeSize, "WELCOME_RESUMED": int(wire.WelcomeResumed),
	}
	for name, v := range tables.Sizes {
		if mv, ok := sizes[name]; !ok || mv != v {
			t.Errorf("size %s = %d in constants.json; client uses %d (%v)", name, v, mv, ok)
		}
	}
	rules := map[string]int{"ACK_EVERY": wire.AckEvery, "CLOCK_RATE_BOUND_PPM": wire.ClockRateBoundPPM, "LOST_MARGIN_MS": wire.LostMarginMs,
		"LOST_CHECK_MS": wire.LostCheckMs}
	if len(tables.ClientRules) != len(rules) {
		t.Errorf("constants.json has %d client rules, the client follows %d", len(tables.ClientRules), len(rules))
	}
	for name, v := range tables.ClientRules {
		if mv, ok := rules[name]; !ok || mv != v {
			t.Errorf("client rule %s = %d in constants.json; client uses %d (%v)", name, v, mv, ok)
		}
	}
	if got := shrink(1000 * time.Second); got != 998*time.Second {
		t.Errorf("clock-rate allowance: 1000s becomes %v, want 998s", got)
	}
	if MaxLease != time.Duration(math.MaxUint32-1)*time.Millisecond {
		t.Errorf("MaxLease %v", MaxLease)
	}
}

// TestVectorRequestsEncodeDecode: every request vector's fields encode to its bytes and its bytes
// decode to its fields.
func TestVectorRequestsEncodeDecode(t *testing.T) {
	v := loadVectors(t)
	for _, vec := range v.Requests {
		f := vec.Fields
		want := wire.Request{Op: opByName(t, f.Op), Flags: f.Flags, ID: u64(t, f.ID), Token: u64(t, f.Token), Lease: f.LeaseMs, WaitMs: f.WaitMs, Key: unhex(t, f.KeyHex)}
		if got := hex.EncodeToString(wire.AppendRequest(nil, &want)); got != vec.Hex {
			t.Errorf("%s: encodes to %s, want %s", vec.Name, got, vec.Hex)
		}
		var got wire.Request
		n, err := wire.DecodeRequest(unhex(t, vec.Hex), wire.MaxKeyLen, &got)
		if err != nil || n != len(vec.Hex)/2 || got.Op != want.Op || got.Flags != want.Flags || got.ID != want.ID ||
			got.Token != want.Token || got.Lease != want.Lease || got.WaitMs != want.WaitMs || !bytes.Equal(got.Key, want.Key) {
			t.Errorf("%s: decodes to %+v (%v), want %+v", vec.Name, got, err, want)
		}
	}
}

// TestVectorResponsesEncodeDecode decodes every response vector through the client's frame
// reader, one by one, all in one stream, and one byte at a time; and checks that the fields
// encode back to the bytes (what the fake server of these tests sends).
func TestVectorResponsesEncodeDecode(t *testing.T) {
	v := loadVectors(t)
	var stream []byte
	check := func(t *testing.T, i int, r *wire.Response) {
		t.Helper()
		f := v.Responses[i].Fields
		if r.Op.String() != f.Op || r.Status.String() != f.Status || r.ID != u64(t, f.ID) || r.Token != u64(t, f.Token) ||
			r.Lease != f.LeaseMs || r.Detail != f.Detail || hex.EncodeToString(r.Data) != f.DataHex {
			t.Errorf("%s: decoded %+v, want %+v", v.Responses[i].Name, *r, f)
		}
	}
	for i, vec := range v.Responses {
		b := unhex(t, vec.Hex)
		stream = append(stream, b...)
		var r wire.Response
		if _, err := readResponse(bufio.NewReader(bytes.NewReader(b)), nil, wire.MaxDataLen, &r); err != nil {
			t.Fatalf("%s: %v", vec.Name, err)
		}
		check(t, i, &r)
		f := vec.Fields
		enc := wire.AppendResponse(nil, &wire.Response{Op: opOrUnknown(t, f.Op), Status: statusByName(t, f.Status), ID: u64(t, f.ID),
			Token: u64(t, f.Token), Lease: f.LeaseMs, Detail: f.Detail, Data: unhex(t, f.DataHex)})
		if !bytes.Equal(enc, b) {
			t.Errorf("%s: fields encode to %x", vec.Name, enc)
		}
	}
	for _, rd := range []io.Reader{bytes.NewReader(stream), iotest.OneByteReader(bytes.NewReader(stream))} {
		br := bufio.NewReaderSize(rd, 16)
		var buf []byte
		for i := range v.Responses {
			var r wire.Response
			var err error
			if buf, err = readResponse(br, buf, wire.MaxDataLen, &r); err != nil {
				t.Fatalf("stream frame %d: %v", i, err)
			}
			check(t, i, &r)
		}
		if _, err := readResponse(br, buf, wire.MaxDataLen, new(wire.Response)); err != io.EOF {
			t.Fatalf("after the last frame: %v, want EOF", err)
		}
	}
}

// opOrUnknown reads an op name as written by the vectors ("0x7f" for an unknown op).
func opOrUnknown(t *testing.T, name string) wire.Op {
	if len(name) > 2 && name[:2] == "0x" {
		n, err := strconv.ParseUint(name[2:], 16, 8)
		if err != nil {
			t.Fatal(err)
		}
		return wire.Op(n)
	}
	return opByName(t, name)
}

// TestVectorMalformed: frames that break the format are errors (an incomplete one means "read
// more"), never a hang or a panic; an oversize length is refused from its 4 bytes alone.
func TestVectorMalformed(t *testing.T) {
	v := loadVectors(t)
	for _, m := range v.Malformed {
		b := unhex(t, m.Hex)
		// The client's stream reader (requests and responses share the header layout).
		var r wire.Response
		_, err := readResponse(bufio.NewReader(bytes.NewReader(b)), nil, m.MaxVar, &r)
		switch m.Error {
		case "short":
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("%s: %v, want an incomplete frame", m.Name, err)
			}
		case "length", "too_large":
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("%s: %v, want ErrProtocol", m.Name, err)
			}
		default:
			t.Errorf("%s: unknown error kind %q", m.Name, m.Error)
		}
		// The buffer decoders.
		want := map[string]error{"short": wire.ErrShort, "length": wire.ErrLength, "too_large": wire.ErrTooLarge}[m.Error]
		var derr error
		if m.Kind == "request" {
			_, derr = wire.DecodeRequest(b, m.MaxVar, new(wire.Request))
		} else {
			_, derr = wire.DecodeResponse(b, m.MaxVar, new(wire.Response))
		}
		if derr != want {
			t.Errorf("%s (%s): decoder says %v, want %v", m.Name, m.Kind, derr, want)
		}
	}
}

// TestVectorAuth: the proofs the client computes are those of every auth vector.
func TestVectorAuth(t *testing.T) {
	v := loadVectors(t)
	for _, a := range v.Auth {
		var s [16]byte
		var cn, sn [32]byte
		copy(s[:], unhex(t, a.SessionIDHex))
		copy(cn[:], unhex(t, a.ClientNonceHex))
		copy(sn[:], unhex(t, a.ServerNonceHex))
		cp := wire.ClientProof([]byte(a.TokenUTF8), &s, &cn, &sn)
		w := wire.Welcome{Status: wire.StatusOK, Flags: a.WelcomeFlags, GraceMs: a.GraceMs}
		copy(w.StateID[:], unhex(t, a.StateIDHex))
		sp := wire.ServerProof([]byte(a.TokenUTF8), &s, &cn, &sn, &w)
		if hex.EncodeToString(cp[:]) != a.ClientProofHex || hex.EncodeToString(sp[:]) != a.ServerProofHex {
			t.Errorf("%s: proofs %x %x", a.Name, cp, sp)
		}
	}
}

// TestVectorHandshakeFrames: every handshake vector's bytes decode to its fields and its fields
// encode to its bytes.
func TestVectorHandshakeFrames(t *testing.T) {
	v := loadVectors(t)
	for _, h := range v.Handshake {
		b := unhex(t, h.Hex)
		var enc []byte
		switch h.Op {
		case "HELLO":
			var d wire.Hello
			if err := wire.DecodeHello(b, &d); err != nil || d.Version != h.Version || d.Flags != h.Flags ||
				hex.EncodeToString(d.SessionID[:]) != h.SessionIDHex || hex.EncodeToString(d.Nonce[:]) != h.NonceHex {
				t.Errorf("%s: %+v %v", h.Name, d, err)
			}
			enc = wire.AppendHello(nil, &d)
		case "CHALLENGE":
			var d wire.Challenge
			if err := wire.DecodeChallenge(b, &d); err != nil || d.Status.String() != h.Status || d.Version != h.Version ||
				uint16(d.Flags) != h.Flags || d.Detail != h.Detail || hex.EncodeToString(d.Nonce[:]) != h.NonceHex || hex.EncodeToString(d.Data) != h.DataHex {
				t.Errorf("%s: %+v %v", h.Name, d, err)
			}
			enc = wire.AppendChallenge(nil, &d)
		case "AUTH":
			var d wire.Auth
			if err := wire.DecodeAuth(b, &d); err != nil || hex.EncodeToString(d.Proof[:]) != h.ProofHex {
				t.Errorf("%s: %+v %v", h.Name, d, err)
			}
			enc = wire.AppendAuth(nil, &d)
		case "WELCOME":
			var d wire.Welcome
			if err := wire.DecodeWelcome(b, &d); err != nil || d.Status.String() != h.Status || uint16(d.Flags) != h.Flags ||
				d.Detail != h.Detail || d.GraceMs != h.GraceMs || hex.EncodeToString(d.StateID[:]) != h.StateIDHex ||
				hex.EncodeToString(d.Proof[:]) != h.ProofHex {
				t.Errorf("%s: %+v %v", h.Name, d, err)
			}
			enc = wire.AppendWelcome(nil, &d)
		default:
			t.Fatalf("%s: unknown op %q", h.Name, h.Op)
		}
		if !bytes.Equal(enc, b) {
			t.Errorf("%s: re-encodes to %x", h.Name, enc)
		}
	}
}

// pipePeer is the server end of a net.Pipe replaying handshake vectors to the client's
// handshake.
type pipePeer struct {
	t  *testing.T
	nc net.Conn
}

func (p *pipePeer) read(n int) []byte {
	p.t.Helper()
	p.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(p.nc, b); err != nil {
		p.t.Fatalf("pipe: reading %d bytes: %v", n, err)
	}
	return b
}

func (p *pipePeer) write(b []byte) {
	p.t.Helper()
	p.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := p.nc.Write(b); err != nil {
		p.t.Fatalf("pipe: write: %v", err)
	}
}

// TestVectorHandshake runs the client's handshake against the server frames of the vectors, in
// every combination a client meets, and checks the frames it sends byte for byte.
func TestVectorHandshake(t *testing.T) {
	v := loadVectors(t)
	token := []byte(v.Auth[0].TokenUTF8)
	stateID := unhex(t, v.Auth[0].StateIDHex)
	for _, tc := range []struct {
		name      string
		token     []byte
		challenge string
		auth      string // the AUTH vector the client must send; "" = it must send nothing more
		welcome   string
		want      error
		resumed   bool
		leader    string // a NOT_LEADER hint expected
		msg       string
	}{
		{name: "new session", token: token, challenge: "challenge_auth", auth: "auth", welcome: "welcome_new_session"},
		{name: "resumed", token: token, challenge: "challenge_auth", auth: "auth", welcome: "welcome_resumed", resumed: true},
		{name: "no auth", challenge: "challenge_no_auth", auth: "auth_no_auth", welcome: "welcome_no_auth"},
		{name: "unsupported version", challenge: "challenge_unsupported_version", want: ErrUnsupportedVersion, msg: "version 1"},
		{name: "busy", challenge: "challenge_busy_connections", want: ErrBusy, msg: "too many connections"},
		{name: "invalid session", challenge: "challenge_invalid_session", want: ErrInvalid, msg: "session id must be non-zero"},
		{name: "not leader", challenge: "challenge_not_leader", want: ErrNotLeader, leader: "127.0.0.2:7070"},
		{name: "not leader unknown", challenge: "challenge_not_leader_unknown", want: ErrNotLeader},
		{name: "wrong token", token: token, challenge: "challenge_auth", auth: "auth", welcome: "welcome_auth_failed", want: ErrAuthFailed, msg: "rejected the token"},
		{name: "server requires a token", challenge: "challenge_auth", auth: "auth_no_auth", welcome: "welcome_auth_failed", want: ErrAuthFailed, msg: "requires a token"},
		{name: "server without auth refused", token: token, challenge: "challenge_no_auth", want: ErrAuthFailed, msg: "does not require a token"},
		{name: "server proof wrong", token: token, challenge: "challenge_auth", auth: "auth", welcome: "welcome_no_auth", want: ErrAuthFailed, msg: "proof does not verify"},
		{name: "sessions busy", challenge: "challenge_no_auth", auth: "auth_no_auth", welcome: "welcome_busy_sessions", want: ErrBusy, msg: "SESSIONS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cside, sside := net.Pipe()
			defer cside.Close()
			defer sside.Close()
			p := &pipePeer{t: t, nc: sside}
			var session [16]byte
			var nonce [32]byte
			copy(session[:], unhex(t, v.Auth[0].SessionIDHex))
			copy(nonce[:], unhex(t, v.Auth[0].ClientNonceHex))
			type out struct {
				w   *wire.Welcome
				err error
			}
			done := make(chan out, 1)
			go func() {
				w, err := handshake(cside, &session, &nonce, tc.token, tc.token != nil)
				cside.Close()
				done <- out{w, err}
			}()
			if got := p.read(wire.HelloSize); hex.EncodeToString(got) != v.hs(t, "hello").Hex {
				t.Fatalf("HELLO %x", got)
			}
			p.write(unhex(t, v.hs(t, tc.challenge).Hex))
			if tc.auth != "" {
				if got := p.read(wire.AuthSize); hex.EncodeToString(got) != v.hs(t, tc.auth).Hex {
					t.Fatalf("AUTH %x, want %s", got, tc.auth)
				}
				p.write(unhex(t, v.hs(t, tc.welcome).Hex))
			}
			o := <-done
			if tc.want == nil {
				if o.err != nil {
					t.Fatalf("handshake: %v", o.err)
				}
				if (o.w.Flags&wire.WelcomeResumed != 0) != tc.resumed || o.w.GraceMs != 5000 || !bytes.Equal(o.w.StateID[:], stateID) {
					t.Fatalf("WELCOME %+v", o.w)
				}
				return
			}
			if !errors.Is(o.err, tc.want) {
				t.Fatalf("handshake: %v, want %v", o.err, tc.want)
			}
			var re *redirectError
			if tc.want == ErrNotLeader && (!errors.As(o.err, &re) || re.leader != tc.leader) {
				t.Fatalf("leader hint: %v, want %q", o.err, tc.leader)
			}
			if tc.msg != "" && !bytes.Contains([]byte(o.err.Error()), []byte(tc.msg)) {
				t.Errorf("error %q does not say %q", o.err, tc.msg)
			}
			if tc.auth == "" {
				// The client sent nothing after HELLO.
				sside.SetReadDeadline(time.Now().Add(time.Second))
				if n, err := sside.Read(make([]byte, 1)); n != 0 || err == nil {
					t.Errorf("client sent more after refusing (%d, %v)", n, err)
				}
			}
		})
	}
}

// setNextID makes id the next request id the client uses.
func setNextID(c *Client, id uint64) {
	c.mu.Lock()
	c.nextID = id - 1
	c.mu.Unlock()
}

// dialFake connects a client to a fake server, heartbeat off unless opts turn it on.
func dialFake(t *testing.T, fs *fakeServer, opts ...Option) (*Client, *fakeConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c, err := Dial(ctx, append([]Option{WithEndpoints(fs.Addr), WithHeartbeat(0), WithBackoff(5*time.Millisecond, 50*time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, fs.next()
}

// TestVectorRequests drives every request vector through the public API, checks the bytes the
// client writes, and answers with the response vectors, checking what the API returns.
func TestVectorRequests(t *testing.T) {
	v := loadVectors(t)
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	ctx := context.Background()
	seen := map[string]bool{}
	expect := func(name string) wire.Request {
		t.Helper()
		r := fc.next()
		if got := wire.AppendRequest(nil, &r); !bytes.Equal(got, v.request(t, name)) {
			t.Fatalf("%s: client sent\n%x\nwant\n%x", name, got, v.request(t, name))
		}
		seen[name] = true
		return r
	}

	// acquire -> acquire_ok; then EXPIRED (LEASE) for its token.
	setNextID(c, 1)
	var lk *Lock
	start := time.Now()
	ch := async(func() (err error) {
		lk, err = c.Acquire(ctx, "order-1234", 30*time.Second, WithWaitTimeout(5*time.Second))
		return
	})
	expect("acquire")
	fc.write(v.response(t, "acquire_ok"))
	if err := waitErr(t, ch); err != nil || lk.Token() != 7 || lk.Lease() != 30*time.Second || lk.Key() != "order-1234" {
		t.Fatalf("acquire: %v %+v", err, lk)
	}
	// deadline = t_send + 30000 ms · 0.998 = t_send + 29.94s, t_send between start and now.
	checkDeadline(t, lk, start, 29940*time.Millisecond)
	fc.write(v.response(t, "expired_lease"))
	waitLost(t, lk, ReasonExpired)

	// acquire_try_once -> acquire_timed_out: TryAcquire reports "not acquired" as a nil lock.
	setNextID(c, 2)
	ch = async(func() error {
		l, err := c.TryAcquire(ctx, "daily-batch", 10*time.Second)
		if l != nil {
			return errors.New("TryAcquire returned a lock")
		}
		return err
	})
	expect("acquire_try_once")
	fc.write(v.response(t, "acquire_timed_out"))
	if err := waitErr(t, ch); err != nil {
		t.Fatalf("try once: %v", err)
	}
	// The same answer to an Acquire with a wait of 0 is ErrNotAcquired.
	setNextID(c, 2)
	ch = async(func() error {
		_, err := c.Acquire(ctx, "daily-batch", 10*time.Second, WithWaitTimeout(0))
		return err
	})
	expect("acquire_try_once")
	fc.write(v.response(t, "acquire_timed_out"))
	if err := waitErr(t, ch); !errors.Is(err, ErrNotAcquired) || IsRetryable(err) {
		t.Fatalf("acquire with wait 0: %v", err)
	}

	// acquire_wait_forever -> acquire_ok_after_wait: deadline = t_send + (1500 + 1) ms · 0.998.
	setNextID(c, 3)
	start = time.Now()
	ch = async(func() (err error) { lk, err = c.Acquire(ctx, "k", time.Millisecond); return })
	expect("acquire_wait_forever")
	fc.write(v.response(t, "acquire_ok_after_wait"))
	if err := waitErr(t, ch); err != nil || lk.Token() != 8 || lk.Lease() != time.Millisecond {
		t.Fatalf("acquire after wait: %v", err)
	}
	checkDeadline(t, lk, start, shrink(1501*time.Millisecond))

	// acquire_binary_key: any bytes are a key.
	setNextID(c, 4)
	ch = async(func() (err error) {
		lk, err = c.Acquire(ctx, string(unhex(t, "00ff10c3bc")), 500*time.Millisecond, WithWaitTimeout(250*time.Millisecond))
		return
	})
	r := expect("acquire_binary_key")
	fc.reply(wire.Response{Op: wire.OpAcquire, ID: r.ID, Token: 9, Lease: 500})
	if err := waitErr(t, ch); err != nil || lk.Token() != 9 {
		t.Fatalf("binary key: %v", err)
	}

	// release -> release_ok, then release_not_held.
	setNextID(c, 5)
	ch = async(func() error { return c.Release(ctx, "order-1234", 42) })
	expect("release")
	fc.write(v.response(t, "release_ok"))
	if err := waitErr(t, ch); err != nil {
		t.Fatalf("release: %v", err)
	}
	setNextID(c, 5)
	ch = async(func() error { return c.Release(ctx, "order-1234", 42) })
	expect("release")
	fc.write(v.response(t, "release_not_held"))
	if err := waitErr(t, ch); !errors.Is(err, ErrNotHeld) || err.Error() != `ticketing: release "order-1234" token 42: not held: the token does not hold the key (NOT_HELD)` {
		t.Fatalf("release not held: %v", err)
	}

	// release_max_values
	setNextID(c, math.MaxUint64)
	ch = async(func() error { return c.Release(ctx, "account-77", math.MaxUint64-1) })
	expect("release_max_values")
	fc.reply(wire.Response{Op: wire.OpRelease, ID: math.MaxUint64})
	if err := waitErr(t, ch); err != nil {
		t.Fatalf("release max: %v", err)
	}

	// extend -> extend_ok: deadline = t_send + 60 s · 0.998.
	setNextID(c, 6)
	var dl time.Time
	start = time.Now()
	ch = async(func() (err error) { dl, err = c.Extend(ctx, "order-1234", 42, time.Minute); return })
	expect("extend")
	fc.write(v.response(t, "extend_ok"))
	if err := waitErr(t, ch); err != nil || dl.Before(start.Add(shrink(time.Minute))) || dl.After(time.Now().Add(shrink(time.Minute))) {
		t.Fatalf("extend: %v, deadline in %v", err, time.Until(dl))
	}

	// ping -> ping_ok
	setNextID(c, 8)
	ch = async(func() error { return c.Ping(ctx) })
	expect("ping")
	fc.write(v.response(t, "ping_ok"))
	if err := waitErr(t, ch); err != nil {
		t.Fatalf("ping: %v", err)
	}

	// inspect -> every INSPECT answer: the token is shown only with TOKEN_MATCH or SESSION.
	for _, tc := range []struct {
		vec, req string
		id       uint64
		verify   bool
		want     KeyInfo
	}{
		{"inspect_held_by_other", "inspect", 9, false, KeyInfo{Key: "order-1234", Held: true, LeaseLeft: 25 * time.Second, HeldFor: 5 * time.Second, Waiters: 3}},
		{"inspect_held_token_match", "inspect_with_token", 10, true, KeyInfo{Key: "order-1234", Held: true, Token: 42, Mine: true, TokenMatch: true, LeaseLeft: 25 * time.Second, HeldFor: 5 * time.Second}},
		{"inspect_lock_delay", "inspect", 9, false, KeyInfo{Key: "order-1234", Waiters: 1, LockDelayLeft: 750 * time.Millisecond}},
		{"inspect_free", "inspect", 9, false, KeyInfo{Key: "order-1234"}},
	} {
		setNextID(c, tc.id)
		var info KeyInfo
		var held bool
		ch = async(func() (err error) {
			if tc.verify {
				held, err = c.Verify(ctx, "order-1234", 42)
				return
			}
			info, err = c.Inspect(ctx, "order-1234")
			return
		})
		expect(tc.req)
		fc.write(v.response(t, tc.vec))
		if err := waitErr(t, ch); err != nil {
			t.Fatalf("%s: %v", tc.vec, err)
		}
		if tc.verify {
			if !held {
				t.Errorf("%s: Verify false", tc.vec)
			}
			continue
		}
		if info != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.vec, info, tc.want)
		}
	}

	// acquire_big_token: the largest values decode.
	setNextID(c, math.MaxUint64)
	ch = async(func() (err error) { lk, err = c.Acquire(ctx, "k", time.Second); return })
	fc.nextOp(wire.OpAcquire)
	fc.write(v.response(t, "acquire_big_token"))
	if err := waitErr(t, ch); err != nil || lk.Token() != math.MaxUint64-1 || lk.Lease() != time.Duration(math.MaxUint32)*time.Millisecond {
		t.Fatalf("big token: %v", err)
	}

	// Error answers.
	for _, tc := range []struct {
		id     uint64
		vec    string
		call   func() error
		target error
		detail string
		msg    string
	}{
		{9, "invalid_key", func() error { _, err := c.Acquire(ctx, "x", time.Second); return err }, ErrInvalid, "KEY", "key empty or longer than the server's max key length"},
		{10, "invalid_op", func() error { return c.Ping(ctx) }, ErrInvalid, "OP", "unknown operation"},
		{3, "invalid_request_id_used", func() error { return c.Release(ctx, "x", 1) }, ErrInvalid, "REQUEST_ID", "request id already used on this connection"},
		{11, "busy_waiters_per_key", func() error { _, err := c.Acquire(ctx, "x", time.Second); return err }, ErrBusy, "WAITERS_PER_KEY", "too many waiters on this key"},
		{12, "busy_storage", func() error { _, err := c.Acquire(ctx, "x", time.Second); return err }, ErrBusy, "STORAGE", "tokens or restart horizon cannot be made durable"},
		{13, "shutting_down", func() error { _, err := c.Acquire(ctx, "x", time.Second); return err }, ErrShuttingDown, "", "server shutting down"},
	} {
		setNextID(c, tc.id)
		ch := async(tc.call)
		fc.next()
		fc.write(v.response(t, tc.vec))
		err := waitErr(t, ch)
		var se *StatusError
		if !errors.Is(err, tc.target) || !errors.As(err, &se) || se.DetailName() != tc.detail || se.Message != tc.msg {
			t.Errorf("%s: %v", tc.vec, err)
		}
	}

	// acquire_retry_not_held is TestResumeRetriedAcquireNotHeld's; cancel, ack: TestVectorCancel,
	// TestAck (an ACK's x is computed by the client; its encoding is checked above).
	for _, r := range v.Requests {
		if !seen[r.Name] && r.Name != "cancel" && r.Name != "ack" {
			t.Errorf("request vector %q is not produced by any client call here", r.Name)
		}
	}
}

// TestVectorCancel: a cancelled Acquire sends the CANCEL vector; when the answer is CANCELLED it
// returns a cancellation; when the acquire was granted before the cancel arrived, it releases
// the lock.
func TestVectorCancel(t *testing.T) {
	v := loadVectors(t)
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	for _, granted := range []bool{false, true} {
		setNextID(c, 1)
		ctx, cancel := context.WithCancel(context.Background())
		ch := async(func() error { _, err := c.Acquire(ctx, "order-1234", 30*time.Second); return err })
		fc.nextOp(wire.OpAcquire) // id 1
		setNextID(c, 7)
		cancel()
		r := fc.nextOp(wire.OpCancel)
		if got := wire.AppendRequest(nil, &r); !bytes.Equal(got, v.request(t, "cancel")) {
			t.Fatalf("CANCEL %x", got)
		}
		if granted {
			fc.write(v.response(t, "acquire_ok")) // granted (token 7) before the CANCEL arrived
			fc.write(v.response(t, "cancel_nothing_pending"))
			rel := fc.nextOp(wire.OpRelease)
			if rel.Token != 7 || string(rel.Key) != "order-1234" {
				t.Fatalf("after a late grant the client sent %+v, want RELEASE of token 7", rel)
			}
			fc.ok(rel, 0)
		} else {
			fc.write(v.response(t, "acquire_cancelled"))
			fc.write(v.response(t, "cancel_ok"))
		}
		if err := waitErr(t, ch); !errors.Is(err, context.Canceled) || !errors.Is(err, ErrCancelled) {
			t.Fatalf("granted=%v: Acquire returned %v, want a cancellation", granted, err)
		}
	}
	// Nothing else is in flight: a PING is the next frame.
	ch := async(func() error { return c.Ping(context.Background()) })
	fc.ok(fc.nextOp(wire.OpPing), 0)
	if err := waitErr(t, ch); err != nil {
		t.Fatal(err)
	}
	// The server withdrawing an acquire by itself (CANCELLED without our CANCEL) is ErrCancelled.
	ch = async(func() error { _, err := c.Acquire(context.Background(), "order-1234", time.Second); return err })
	r := fc.nextOp(wire.OpAcquire)
	fc.reply(wire.Response{Op: wire.OpAcquire, Status: wire.StatusCancelled, ID: r.ID})
	if err := waitErr(t, ch); !errors.Is(err, ErrCancelled) {
		t.Fatalf("CANCELLED: %v", err)
	}
}

// checkDeadline checks that lk's deadline is t_send + span, for a t_send between start and now.
func checkDeadline(t *testing.T, lk *Lock, start time.Time, span time.Duration) {
	t.Helper()
	if dl := lk.Deadline(); dl.Before(start.Add(span)) || dl.After(time.Now().Add(span)) {
		t.Errorf("deadline = start + %v, want t_send + %v", dl.Sub(start), span)
	}
}

// async runs f in a goroutine and returns a channel with its error.
func async(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

func waitErr(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(bound):
		buf := make([]byte, 1<<20)
		t.Fatalf("call did not return; goroutines:\n%s", buf[:runtime.Stack(buf, true)])
		return nil
	}
}

// waitLost waits until lk is lost and checks the reason.
func waitLost(t *testing.T, lk *Lock, reason LostReason) {
	t.Helper()
	select {
	case <-lk.Lost():
	case <-time.After(bound):
		t.Fatalf("lock %s never lost", lk)
	}
	var le *LockLostError
	if err := lk.Err(); !errors.Is(err, ErrLockLost) || !errors.As(err, &le) || le.Reason != reason {
		t.Fatalf("Err() = %v, want reason %q", err, reason)
	}
}
