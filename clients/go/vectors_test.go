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
	"strconv"
	"testing"
	"testing/iotest"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
)

// The language-neutral vectors (protocol/vectors.json) and code tables (protocol/constants.json)
// that every client checks itself against.

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
	Handshake []struct {
		Name         string `json:"name"`
		Op           string `json:"op"`
		Status       string `json:"status"`
		Version      uint8  `json:"version"`
		Flags        uint8  `json:"flags"`
		SessionIDHex string `json:"session_id_hex"`
		NonceHex     string `json:"nonce_hex"`
		ProofHex     string `json:"proof_hex"`
		Hex          string `json:"hex"`
	} `json:"handshake"`
	Auth []struct {
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

func loadVectors(t *testing.T) *vectorFile {
	t.Helper()
	b, err := os.ReadFile("../../protocol/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
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

func (v *vectorFile) request(t *testing.T, name string) string {
	t.Helper()
	for _, r := range v.Requests {
		if r.Name == name {
			return r.Hex
		}
	}
	t.Fatalf("no request vector %q", name)
	return ""
}

func (v *vectorFile) handshake(t *testing.T, name string) []byte {
	t.Helper()
	for _, h := range v.Handshake {
		if h.Name == name {
			return unhex(t, h.Hex)
		}
	}
	t.Fatalf("no handshake vector %q", name)
	return nil
}

// TestConstants checks the client's status codes against protocol/constants.json, and that every
// non-OK status maps to a sentinel error.
func TestConstants(t *testing.T) {
	b, err := os.ReadFile("../../protocol/constants.json")
	if err != nil {
		t.Fatal(err)
	}
	var tables struct {
		Statuses []wire.Named `json:"statuses"`
		Ops      []wire.Named `json:"ops"`
	}
	if err := json.Unmarshal(b, &tables); err != nil {
		t.Fatal(err)
	}
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
		if !ok || uint32(st) != s.Value {
			t.Errorf("status %s = %d in constants.json; client has %d (%v)", s.Name, s.Value, st, ok)
			continue
		}
		if st.String() != s.Name {
			t.Errorf("Status(%d).String() = %q, want %q", st, st.String(), s.Name)
		}
		if st != StatusOK && st.sentinel() == nil {
			t.Errorf("status %s has no sentinel error", s.Name)
		}
		if st != StatusOK {
			err := &StatusError{Op: "ACQUIRE", Status: st}
			if !errors.Is(err, st.sentinel()) {
				t.Errorf("StatusError %s does not match its sentinel", s.Name)
			}
		}
	}
	ops := map[string]wire.Op{"ACQUIRE": wire.OpAcquire, "RELEASE": wire.OpRelease, "EXTEND": wire.OpExtend,
		"CANCEL": wire.OpCancel, "PING": wire.OpPing, "INSPECT": wire.OpInspect, "EXPIRED": wire.OpExpired, "HELLO": wire.OpHello,
		"CHALLENGE": wire.OpChallenge, "AUTH": wire.OpAuth, "WELCOME": wire.OpWelcome}
	for _, o := range tables.Ops {
		if op, ok := ops[o.Name]; !ok || uint32(op) != o.Value {
			t.Errorf("op %s = %d in constants.json; client uses %d", o.Name, o.Value, op)
		}
	}
	if unknown := (&StatusError{Op: "PING", Status: 200}); errors.Is(unknown, ErrNotHeld) || unknown.Error() == "" {
		t.Errorf("unknown status: %v", unknown)
	}
}

// TestVectorResponsesDecode decodes every response vector through the client's frame reader,
// one by one, all in one stream, and one byte at a time.
func TestVectorResponsesDecode(t *testing.T) {
	v := loadVectors(t)
	var stream []byte
	check := func(t *testing.T, i int, r *wire.Response) {
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
		if _, err := readResponse(bufio.NewReader(bytes.NewReader(b)), nil, &r); err != nil {
			t.Fatalf("%s: %v", vec.Name, err)
		}
		check(t, i, &r)
	}
	for _, rd := range []io.Reader{bytes.NewReader(stream), iotest.OneByteReader(bytes.NewReader(stream))} {
		br := bufio.NewReaderSize(rd, 16)
		var buf []byte
		for i := range v.Responses {
			var r wire.Response
			var err error
			if buf, err = readResponse(br, buf, &r); err != nil {
				t.Fatalf("stream frame %d: %v", i, err)
			}
			check(t, i, &r)
		}
		if _, err := readResponse(br, buf, new(wire.Response)); err != io.EOF {
			t.Fatalf("after the last frame: %v, want EOF", err)
		}
	}
}

// TestVectorMalformed: frames that break the format are errors, never a hang or a panic.
func TestVectorMalformed(t *testing.T) {
	v := loadVectors(t)
	for _, m := range v.Malformed {
		b := unhex(t, m.Hex)
		var r wire.Response
		_, err := readResponse(bufio.NewReader(bytes.NewReader(b)), nil, &r)
		switch m.Error {
		case "short":
			if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
				t.Errorf("%s: %v, want an incomplete frame", m.Name, err)
			}
		default: // "length", "too_large": a broken stream
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("%s: %v, want ErrProtocol", m.Name, err)
			}
		}
	}
}

// pipeServer is the server end of a net.Pipe that replays vectors to a client.
type pipeServer struct {
	t    *testing.T
	nc   net.Conn
	br   *bufio.Reader
	seen map[string]bool // request vectors matched
}

func (p *pipeServer) read(n int) []byte {
	p.t.Helper()
	p.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(p.br, b); err != nil {
		p.t.Fatalf("pipe server: reading %d bytes: %v", n, err)
	}
	return b
}

// frame reads one request frame.
func (p *pipeServer) frame() []byte {
	p.t.Helper()
	h := p.read(4)
	n, _ := wire.FrameLen(h)
	return append(h, p.read(n-4)...)
}

func (p *pipeServer) expect(name, wantHex string) []byte {
	p.t.Helper()
	got := p.frame()
	if hex.EncodeToString(got) != wantHex {
		p.t.Fatalf("%s: client sent\n%x\nwant\n%s", name, got, wantHex)
	}
	if p.seen == nil {
		p.seen = map[string]bool{}
	}
	p.seen[name] = true
	return got
}

func (p *pipeServer) write(b []byte) {
	p.t.Helper()
	p.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := p.nc.Write(b); err != nil {
		p.t.Fatalf("pipe server: write: %v", err)
	}
}

// vectorSession and vectorNonce are the session id and client nonce of the vectors.
func vectorIDs(t *testing.T, v *vectorFile) (s [16]byte, n [32]byte) {
	copy(s[:], unhex(t, v.Auth[0].SessionIDHex))
	copy(n[:], unhex(t, v.Auth[0].ClientNonceHex))
	return
}

// newPipeClient returns a client connected over net.Pipe to a pipeServer, after a handshake
// with auth that is checked byte for byte against the vectors.
func newPipeClient(t *testing.T, v *vectorFile, opts ...Option) (*Client, *pipeServer) {
	t.Helper()
	cside, sside := net.Pipe()
	p := &pipeServer{t: t, nc: sside, br: bufio.NewReader(sside)}
	c := newClient(append([]Option{WithToken(v.Auth[0].TokenUTF8)}, opts...))
	var nonce [32]byte
	c.session, nonce = vectorIDs(t, v)
	done := make(chan error, 1)
	go func() { done <- handshake(cside, &c.session, &nonce, c.opts.token, true) }()
	if got := p.read(wire.HelloSize); !bytes.Equal(got, v.handshake(t, "hello")) {
		t.Fatalf("HELLO %x", got)
	}
	p.write(v.handshake(t, "challenge_auth"))
	if got := p.read(wire.AuthSize); !bytes.Equal(got, v.handshake(t, "auth")) {
		t.Fatalf("AUTH %x", got)
	}
	p.write(v.handshake(t, "welcome_auth"))
	if err := <-done; err != nil {
		t.Fatalf("handshake: %v", err)
	}
	c.conn = newConn(c, cside, "pipe", 0)
	t.Cleanup(func() { c.Close(); sside.Close() })
	return c, p
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
	case <-time.After(5 * time.Second):
		t.Fatal("call did not return")
		return nil
	}
}

// TestVectorRequests drives every request vector through the public API over a pipe, checks the
// bytes the client writes, and answers with the response vectors, checking what the API returns.
func TestVectorRequests(t *testing.T) {
	v := loadVectors(t)
	c, p := newPipeClient(t, v)
	ctx := context.Background()
	setID := func(next uint64) { c.nextID.Store(next - 1) }

	// acquire -> acquire_ok; then the EXPIRED notice for its token.
	setID(1)
	var lk *Lock
	ch := async(func() (err error) {
		lk, err = c.Acquire(ctx, "order-1234", 30*time.Second, WithWaitTimeout(5*time.Second))
		return
	})
	p.expect("acquire", v.request(t, "acquire"))
	p.write(v.response(t, "acquire_ok"))
	if err := waitErr(t, ch); err != nil || lk.Token() != 7 || lk.Lease() != 30*time.Second || lk.Key() != "order-1234" {
		t.Fatalf("acquire: %v %+v", err, lk)
	}
	if d := time.Until(lk.Deadline()); d <= 29*time.Second || d > 30*time.Second {
		t.Errorf("deadline in %v, want just under 30s", d)
	}
	p.write(v.response(t, "expired_notice"))
	select {
	case <-lk.Lost():
		if !errors.Is(lk.Err(), ErrLockLost) {
			t.Errorf("Err = %v", lk.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("EXPIRED notice did not close Lost")
	}

	// acquire_try_once -> acquire_timed_out
	setID(2)
	ch = async(func() error { _, err := c.TryAcquire(ctx, "daily-batch", 10*time.Second); return err })
	p.expect("acquire_try_once", v.request(t, "acquire_try_once"))
	p.write(v.response(t, "acquire_timed_out"))
	if err := waitErr(t, ch); !errors.Is(err, ErrNotAcquired) || IsRetryable(err) {
		t.Fatalf("try once: %v", err)
	}

	// acquire_wait_forever -> acquire_ok_after_wait: deadline = t_send + 1500 ms + 1 ms
	setID(3)
	start := time.Now()
	ch = async(func() (err error) { lk, err = c.Acquire(ctx, "k", time.Millisecond); return })
	p.expect("acquire_wait_forever", v.request(t, "acquire_wait_forever"))
	p.write(v.response(t, "acquire_ok_after_wait"))
	if err := waitErr(t, ch); err != nil || lk.Token() != 8 || lk.Lease() != time.Millisecond {
		t.Fatalf("acquire after wait: %v", err)
	}
	if d := lk.Deadline().Sub(start); d < 1501*time.Millisecond || lk.Deadline().After(time.Now().Add(1501*time.Millisecond)) {
		t.Errorf("deadline = start + %v, want t_send + 1500ms queued + 1ms lease", d)
	}

	// acquire_binary_key: any bytes are a key.
	setID(4)
	ch = async(func() (err error) {
		lk, err = c.Acquire(ctx, string(unhex(t, "00ff10c3bc")), 500*time.Millisecond, WithWaitTimeout(250*time.Millisecond))
		return
	})
	p.expect("acquire_binary_key", v.request(t, "acquire_binary_key"))
	p.write(wire.AppendResponse(nil, &wire.Response{Op: wire.OpAcquire, ID: 4, Token: 9, Lease: 500}))
	if err := waitErr(t, ch); err != nil || lk.Token() != 9 {
		t.Fatalf("binary key: %v", err)
	}

	// release -> release_ok, then release_not_held.
	setID(5)
	ch = async(func() error { return c.Release(ctx, "order-1234", 42) })
	p.expect("release", v.request(t, "release"))
	p.write(v.response(t, "release_ok"))
	if err := waitErr(t, ch); err != nil {
		t.Fatalf("release: %v", err)
	}
	setID(5)
	ch = async(func() error { return c.Release(ctx, "order-1234", 42) })
	p.expect("release", v.request(t, "release"))
	p.write(v.response(t, "release_not_held"))
	if err := waitErr(t, ch); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("release not held: %v", err)
	}

	// release_max_values
	setID(math.MaxUint64)
	ch = async(func() error { return c.Release(ctx, "account-77", math.MaxUint64-1) })
	p.expect("release_max_values", v.request(t, "release_max_values"))
	p.write(wire.AppendResponse(nil, &wire.Response{Op: wire.OpRelease, ID: math.MaxUint64}))
	if err := waitErr(t, ch); err != nil {
		t.Fatalf("release max: %v", err)
	}

	// extend -> extend_ok
	setID(6)
	var dl time.Time
	start = time.Now()
	ch = async(func() (err error) { dl, err = c.Extend(ctx, "order-1234", 42, time.Minute); return })
	p.expect("extend", v.request(t, "extend"))
	p.write(v.response(t, "extend_ok"))
	if err := waitErr(t, ch); err != nil || dl.Before(start.Add(time.Minute)) || dl.After(time.Now().Add(time.Minute)) {
		t.Fatalf("extend: %v, deadline %v", err, dl)
	}

	// ping -> ping_ok
	setID(8)
	ch = async(func() error { return c.Ping(ctx) })
	p.expect("ping", v.request(t, "ping"))
	p.write(v.response(t, "ping_ok"))
	if err := waitErr(t, ch); err != nil {
		t.Fatalf("ping: %v", err)
	}

	// inspect -> inspect_held, inspect_free
	for _, tc := range []struct {
		vec  string
		want KeyInfo
	}{
		{"inspect_held", KeyInfo{Key: "order-1234", Held: true, Token: 7, LeaseLeft: 25 * time.Second, HeldFor: 5 * time.Second, Waiters: 3}},
		{"inspect_free", KeyInfo{Key: "order-1234"}},
	} {
		setID(9)
		var info KeyInfo
		ch = async(func() (err error) { info, err = c.Inspect(ctx, "order-1234"); return })
		p.expect("inspect", v.request(t, "inspect"))
		p.write(v.response(t, tc.vec))
		if err := waitErr(t, ch); err != nil || info != tc.want {
			t.Fatalf("%s: %v %+v, want %+v", tc.vec, err, info, tc.want)
		}
	}

	// acquire_big_token: the largest values decode.
	setID(math.MaxUint64)
	ch = async(func() (err error) { lk, err = c.Acquire(ctx, "k", time.Second); return })
	p.frame()
	p.write(v.response(t, "acquire_big_token"))
	if err := waitErr(t, ch); err != nil || lk.Token() != math.MaxUint64-1 || lk.Lease() != time.Duration(math.MaxUint32)*time.Millisecond {
		t.Fatalf("big token: %v", err)
	}

	for _, r := range v.Requests {
		if !p.seen[r.Name] && r.Name != "cancel" { // cancel: TestVectorCancel
			t.Errorf("request vector %q is not produced by any client call here", r.Name)
		}
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
		{9, "invalid_key", func() error { _, err := c.Acquire(ctx, "x", time.Second); return err }, ErrInvalid, "KEY", "key longer than 256 bytes"},
		{10, "invalid_op", func() error { return c.Ping(ctx) }, ErrInvalid, "OP", "unknown operation"},
		{11, "busy_waiters_per_key", func() error { _, err := c.Acquire(ctx, "x", time.Second); return err }, ErrBusy, "WAITERS_PER_KEY", "too many waiters on this key"},
	} {
		setID(tc.id)
		ch := async(tc.call)
		p.frame()
		p.write(v.response(t, tc.vec))
		err := waitErr(t, ch)
		var se *StatusError
		if !errors.Is(err, tc.target) || !errors.As(err, &se) || se.DetailName() != tc.detail || se.Message != tc.msg {
			t.Errorf("%s: %v", tc.vec, err)
		}
	}
}

// TestVectorCancel: a cancelled Acquire sends the CANCEL vector; when the answer is CANCELLED it
// returns ctx.Err(); when the acquire was granted before the cancel arrived, it releases the lock.
func TestVectorCancel(t *testing.T) {
	v := loadVectors(t)
	c, p := newPipeClient(t, v)
	for _, granted := range []bool{false, true} {
		c.nextID.Store(0)
		ctx, cancel := context.WithCancel(context.Background())
		ch := async(func() error { _, err := c.Acquire(ctx, "order-1234", 30*time.Second); return err })
		p.frame() // ACQUIRE id 1
		c.nextID.Store(6)
		cancel()
		p.expect("cancel", v.request(t, "cancel"))
		if granted {
			p.write(v.response(t, "acquire_ok")) // granted (token 7) before the CANCEL arrived
			p.write(v.response(t, "cancel_nothing_pending"))
			rel := p.frame()
			var r wire.Request
			if _, err := wire.DecodeRequest(rel, 256, &r); err != nil || r.Op != wire.OpRelease || r.Token != 7 || string(r.Key) != "order-1234" {
				t.Fatalf("after a late grant the client sent %x, want RELEASE of token 7", rel)
			}
			p.write(wire.AppendResponse(nil, &wire.Response{Op: wire.OpRelease, ID: r.ID}))
		} else {
			p.write(v.response(t, "acquire_cancelled"))
			p.write(v.response(t, "cancel_ok"))
		}
		if err := waitErr(t, ch); !errors.Is(err, context.Canceled) {
			t.Fatalf("granted=%v: Acquire returned %v, want context.Canceled", granted, err)
		}
	}
	// Nothing else is in flight: a PING is the next frame.
	c.nextID.Store(7)
	ch := async(func() error { return c.Ping(context.Background()) })
	p.expect("ping", v.request(t, "ping"))
	p.write(v.response(t, "ping_ok"))
	if err := waitErr(t, ch); err != nil {
		t.Fatal(err)
	}
}

// TestVectorRedirect: NOT_LEADER and SHUTTING_DOWN retire the connection and (retries exhausted)
// surface as retryable errors; NOT_LEADER's hint becomes the next endpoint tried.
func TestVectorRedirect(t *testing.T) {
	v := loadVectors(t)
	for _, tc := range []struct {
		vec    string
		id     uint64
		target error
	}{{"not_leader", 12, ErrNotLeader}, {"shutting_down", 13, ErrShuttingDown}} {
		c, p := newPipeClient(t, v, WithMaxRetries(0))
		c.nextID.Store(tc.id - 1)
		ch := async(func() error { _, err := c.Acquire(context.Background(), "x", time.Second); return err })
		p.frame()
		p.write(v.response(t, tc.vec))
		err := waitErr(t, ch)
		if !errors.Is(err, tc.target) || !IsRetryable(err) {
			t.Fatalf("%s: %v", tc.vec, err)
		}
		c.mu.Lock()
		hint, cur := c.hint, c.conn
		c.mu.Unlock()
		if cur != nil {
			t.Errorf("%s: connection still in use", tc.vec)
		}
		if tc.target == ErrNotLeader && hint != "127.0.0.2:7070" {
			t.Errorf("leader hint %q", hint)
		}
	}
}

// TestVectorHandshake runs the handshake vectors in every combination a client meets.
func TestVectorHandshake(t *testing.T) {
	v := loadVectors(t)
	token := []byte(v.Auth[0].TokenUTF8)
	for _, tc := range []struct {
		name      string
		token     []byte
		hasToken  bool
		challenge string
		auth      string // expected AUTH vector; "" = the client must not send one
		welcome   string
		want      error
	}{
		{"auth", token, true, "challenge_auth", "auth", "welcome_auth", nil},
		{"no auth", nil, false, "challenge_no_auth", "auth_no_auth", "welcome_no_auth", nil},
		{"unsupported version", nil, false, "challenge_unsupported_version", "", "", ErrUnsupportedVersion},
		{"wrong token", token, true, "challenge_auth", "auth", "welcome_auth_failed", ErrAuthFailed},
		{"server requires a token", nil, false, "challenge_auth", "auth_no_auth", "welcome_auth_failed", ErrAuthFailed},
		{"server without auth refused", token, true, "challenge_no_auth", "", "", ErrAuthFailed},
		{"server proof wrong", token, true, "challenge_auth", "auth", "welcome_no_auth", ErrAuthFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cside, sside := net.Pipe()
			defer cside.Close()
			defer sside.Close()
			p := &pipeServer{t: t, nc: sside, br: bufio.NewReader(sside)}
			session, nonce := vectorIDs(t, v)
			done := make(chan error, 1)
			go func() {
				err := handshake(cside, &session, &nonce, tc.token, tc.hasToken)
				cside.Close()
				done <- err
			}()
			if got := p.read(wire.HelloSize); !bytes.Equal(got, v.handshake(t, "hello")) {
				t.Fatalf("HELLO %x", got)
			}
			p.write(v.handshake(t, tc.challenge))
			if tc.auth != "" {
				if got := p.read(wire.AuthSize); !bytes.Equal(got, v.handshake(t, tc.auth)) {
					t.Fatalf("AUTH %x, want %s", got, tc.auth)
				}
				p.write(v.handshake(t, tc.welcome))
			}
			err := <-done
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("handshake: %v, want %v", err, tc.want)
			}
			if tc.name == "server requires a token" && !bytes.Contains([]byte(err.Error()), []byte("requires a token")) {
				t.Errorf("error %q does not say the server requires a token", err)
			}
			if tc.auth == "" {
				// The client sent nothing after HELLO.
				sside.SetReadDeadline(time.Now().Add(time.Second))
				if n, err := p.br.Read(make([]byte, 1)); n != 0 || err == nil {
					t.Errorf("client sent more after refusing (%d, %v)", n, err)
				}
			}
		})
	}
}

// TestVectorAuth: the proofs the client computes are those of the auth vector.
func TestVectorAuth(t *testing.T) {
	v := loadVectors(t)
	a := v.Auth[0]
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
		t.Fatalf("proofs %x %x", cp, sp)
	}
}
