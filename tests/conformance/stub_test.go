package conformance

// The stub driver: a small reference client written directly on the wire package, speaking the
// driver protocol of DRIVER.md. It is not a shipped client; it lets the runner be tested
// without any client's driver (TICKETING_CONFORMANCE_DRIVERS=stub), and it can be broken on
// purpose to show that a misbehaving driver fails the run:
//
//	TICKETING_CONFORMANCE_STUB_BREAK=cancel  a cancelled acquire is answered "cancelled" without
//	                                          withdrawing the waiter (cancel_waiting fails)
//	TICKETING_CONFORMANCE_STUB_BREAK=lost    no lost event is ever written (lost_on_expiry fails)
//	TICKETING_CONFORMANCE_STUB_BREAK=ack     no ACK is ever sent (ack_outcomes fails)
//
// The test binary runs as the stub when started with TICKETING_CONFORMANCE_STUB=1 (TestMain).

import (
	"bufio"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ticketing/ticketing/wire"
)

const stubDriverEnv = "TICKETING_CONFORMANCE_STUB"

// stubError is a failure with a DRIVER.md error kind.
type stubError struct {
	kind, msg, reason string
}

func (e *stubError) Error() string { return e.kind + ": " + e.msg }

func errKind(kind, format string, args ...any) *stubError {
	return &stubError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

func lockLostErr(reason string) *stubError {
	return &stubError{kind: "lock_lost", msg: "lock lost: " + strings.ReplaceAll(reason, "_", " "), reason: reason}
}

type stubDriver struct {
	out   io.Writer
	logw  io.Writer
	brk   string
	omu   sync.Mutex
	mu    sync.Mutex
	cls   map[string]*stubClient
	locks map[string]*stubLock
	acqs  map[int64]chan struct{} // pending acquires by command id: closing cancels
	wg    sync.WaitGroup
}

func runStubDriver(in io.Reader, out, logw io.Writer) int {
	d := &stubDriver{out: out, logw: logw, brk: os.Getenv("TICKETING_CONFORMANCE_STUB_BREAK"),
		cls: map[string]*stubClient{}, locks: map[string]*stubLock{}, acqs: map[int64]chan struct{}{}}
	fmt.Fprintf(logw, "stub driver started (break=%q)\n", d.brk)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		line := append([]byte(nil), sc.Bytes()...)
		var m map[string]json.RawMessage
		if err := json.Unmarshal(line, &m); err != nil {
			fmt.Fprintf(logw, "bad command %q: %v\n", line, err)
			continue
		}
		var id int64
		var op string
		json.Unmarshal(m["id"], &id)
		json.Unmarshal(m["op"], &op)
		if op == "exit" {
			d.reset()
			d.reply(id, nil, nil)
			return 0
		}
		if op == "acquire" {
			d.mu.Lock()
			d.acqs[id] = make(chan struct{})
			d.mu.Unlock()
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			res, err := d.handle(id, op, args(m))
			d.reply(id, res, err)
		}()
	}
	d.reset()
	return 0
}

func (d *stubDriver) write(v any) {
	b, _ := json.Marshal(v)
	d.omu.Lock()
	defer d.omu.Unlock()
	d.out.Write(append(b, '\n'))
}

func (d *stubDriver) reply(id int64, res map[string]any, err error) {
	m := map[string]any{"id": id}
	if err != nil {
		var se *stubError
		if !errors.As(err, &se) {
			se = &stubError{kind: "other", msg: err.Error()}
		}
		e := map[string]any{"kind": se.kind, "message": se.msg}
		if se.reason != "" {
			e["reason"] = se.reason
		}
		m["ok"], m["error"] = false, e
	} else {
		m["ok"] = true
		for k, v := range res {
			m[k] = v
		}
	}
	d.write(m)
}

func (d *stubDriver) logf(format string, a ...any) { fmt.Fprintf(d.logw, format+"\n", a...) }

// args are a command's arguments.
type args map[string]json.RawMessage

func (a args) str(k string) string { var s string; json.Unmarshal(a[k], &s); return s }
func (a args) null(k string) bool  { v, ok := a[k]; return !ok || string(v) == "null" }
func (a args) flag(k string) bool  { var b bool; json.Unmarshal(a[k], &b); return b }

func (a args) num(k string) (float64, error) {
	var f float64
	if err := json.Unmarshal(a[k], &f); err != nil {
		return 0, errKind("invalid_argument", "%s: not a number", k)
	}
	return f, nil
}

func (a args) key() ([]byte, error) {
	if !a.null("key_hex") {
		b, err := hex.DecodeString(a.str("key_hex"))
		if err != nil {
			return nil, errKind("invalid_argument", "key_hex: %v", err)
		}
		return checkKey(b)
	}
	var s string
	if err := json.Unmarshal(a["key"], &s); err != nil {
		return nil, errKind("invalid_argument", "key must be a string")
	}
	return checkKey([]byte(s))
}

func checkKey(k []byte) ([]byte, error) {
	if len(k) == 0 || len(k) > wire.MaxKeyLen {
		return nil, errKind("invalid_argument", "key must be 1..%d bytes, got %d", wire.MaxKeyLen, len(k))
	}
	return k, nil
}

func (a args) lease() (uint32, error) {
	f, err := a.num("lease_ms")
	if err != nil {
		return 0, err
	}
	if math.IsNaN(f) || f < 1 || f >= 1<<32 {
		return 0, errKind("invalid_argument", "lease must be at least 1 ms and below 2^32 ms, got %v ms", f)
	}
	return uint32(f), nil
}

func (a args) wait() (uint32, error) {
	if a.null("wait_ms") {
		return wire.WaitForever, nil
	}
	f, err := a.num("wait_ms")
	if err != nil {
		return 0, err
	}
	if math.IsNaN(f) || f < 0 || f >= float64(wire.WaitForever) {
		return 0, errKind("invalid_argument", "wait timeout must be >= 0 ms, got %v ms", f)
	}
	return uint32(f), nil
}

func (a args) token() (uint64, error) {
	t, err := strconv.ParseUint(a.str("token"), 10, 64)
	if err != nil || t == 0 {
		return 0, errKind("invalid_argument", "token must be a positive 64-bit decimal, got %s", a["token"])
	}
	return t, nil
}

func (d *stubDriver) client(a args) (*stubClient, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.cls[a.str("client")]
	if c == nil {
		return nil, errKind("other", "no client %q", a.str("client"))
	}
	return c, nil
}

func (d *stubDriver) lock(a args) (*stubLock, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.locks[a.str("lock")]
	if l == nil {
		return nil, errKind("other", "no lock %q", a.str("lock"))
	}
	return l, nil
}

func (d *stubDriver) handle(id int64, op string, a args) (map[string]any, error) {
	switch op {
	case "hello":
		return map[string]any{"language": "go (stub)", "client_version": "stub", "features": []string{
			"locks", "cancel", "keepalive", "with_lock", "verify", "refuse_held", "tls", "mtls", "request_timeout", "lost_events"}}, nil
	case "connect":
		c, err := d.connect(a)
		if err != nil {
			return nil, err
		}
		return map[string]any{"session_id": hex.EncodeToString(c.sessionID())}, nil
	case "close":
		c, err := d.client(a)
		if err != nil {
			return nil, err
		}
		c.close()
		return nil, nil
	case "acquire", "try_acquire":
		defer func() { d.mu.Lock(); delete(d.acqs, id); d.mu.Unlock() }()
		return d.acquire(id, op, a)
	case "cancel":
		var target int64
		json.Unmarshal(a["target"], &target)
		d.mu.Lock()
		ch := d.acqs[target]
		if ch != nil {
			close(ch)
			delete(d.acqs, target)
		}
		d.mu.Unlock()
		return nil, nil
	case "release":
		l, err := d.lock(a)
		if err != nil {
			return nil, err
		}
		return nil, l.release()
	case "extend":
		l, err := d.lock(a)
		if err != nil {
			return nil, err
		}
		lease, err := a.lease()
		if err != nil {
			return nil, err
		}
		got, err := l.extend(lease)
		return map[string]any{"lease_ms": got}, err
	case "lock_state":
		l, err := d.lock(a)
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		m := map[string]any{"lost": l.lost, "token": fmt.Sprint(l.token),
			"deadline_in_ms": float64(time.Until(l.deadline)) / float64(time.Millisecond)}
		if l.lost {
			m["reason"] = l.reason
		}
		return m, nil
	case "verify":
		l, err := d.lock(a)
		if err != nil {
			return nil, err
		}
		in, err := l.c.inspect(l.key, l.token)
		if err != nil {
			return nil, err
		}
		return map[string]any{"held": in.tokenMatch()}, nil
	case "release_token":
		c, err := d.client(a)
		if err != nil {
			return nil, err
		}
		key, err := a.key()
		if err != nil {
			return nil, err
		}
		tok, err := a.token()
		if err != nil {
			return nil, err
		}
		f, err := c.do(wire.Request{Op: wire.OpRelease, Key: key, Token: tok}, nil)
		if err != nil {
			return nil, err
		}
		return nil, statusErr(f, "release")
	case "inspect":
		c, err := d.client(a)
		if err != nil {
			return nil, err
		}
		key, err := a.key()
		if err != nil {
			return nil, err
		}
		in, err := c.inspect(key, 0)
		if err != nil {
			return nil, err
		}
		return map[string]any{"held": in.held(), "waiters": in.Waiters, "lease_left_ms": in.LeaseLeft}, nil
	case "ping":
		c, err := d.client(a)
		if err != nil {
			return nil, err
		}
		f, err := c.do(wire.Request{Op: wire.OpPing}, nil)
		if err != nil {
			return nil, err
		}
		return nil, statusErr(f, "ping")
	case "with_lock":
		return nil, d.withLock(a)
	case "reset":
		d.reset()
		return nil, nil
	}
	return nil, errKind("other", "unknown op %q", op)
}

func (d *stubDriver) reset() {
	d.mu.Lock()
	cls := d.cls
	d.cls = map[string]*stubClient{}
	locks := d.locks
	d.locks = map[string]*stubLock{}
	d.mu.Unlock()
	for _, l := range locks {
		l.forget()
	}
	for _, c := range cls {
		c.close()
	}
}

func (d *stubDriver) connect(a args) (*stubClient, error) {
	var eps []string
	if err := json.Unmarshal(a["endpoints"], &eps); err != nil || len(eps) == 0 {
		return nil, errKind("invalid_argument", "endpoints must be a non-empty list")
	}
	ms := func(k string, def time.Duration) time.Duration {
		if a.null(k) {
			return def
		}
		f, _ := a.num(k)
		return time.Duration(f) * time.Millisecond
	}
	c := &stubClient{d: d, name: a.str("client"), endpoints: eps,
		reqTimeout: ms("request_timeout_ms", 10*time.Second), heartbeat: ms("heartbeat_ms", 2*time.Second),
		pending: map[uint64]*stubReq{}, locks: map[uint64]*stubLock{}, done: make(chan struct{}), nextID: 1}
	c.opts.Timeout = ms("dial_timeout_ms", 5*time.Second)
	if !a.null("token") {
		c.opts.Token = a.str("token")
	}
	if !a.null("tls") {
		var t struct{ CA, Cert, Key, ServerName string }
		var raw map[string]string
		json.Unmarshal(a["tls"], &raw)
		t.CA, t.Cert, t.Key, t.ServerName = raw["ca"], raw["cert"], raw["key"], raw["server_name"]
		cfg := &tls.Config{ServerName: t.ServerName, MinVersion: tls.VersionTLS12}
		if t.CA != "" {
			pem, err := os.ReadFile(t.CA)
			if err != nil {
				return nil, errKind("invalid_argument", "tls ca: %v", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			cfg.RootCAs.AppendCertsFromPEM(pem)
		}
		if t.Cert != "" {
			cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
			if err != nil {
				return nil, errKind("invalid_argument", "tls cert: %v", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		c.opts.TLS = cfg
	}
	rand.Read(c.session[:])
	conn, err := c.dialOnce()
	if err != nil {
		return nil, err
	}
	c.stateID = conn.Welcome.StateID
	c.grace = time.Duration(conn.Welcome.GraceMs) * time.Millisecond
	c.attach(conn)
	go c.heartbeatLoop()
	d.mu.Lock()
	d.cls[c.name] = c
	d.mu.Unlock()
	return c, nil
}

// stubClient is one client: a session that survives reconnects.
type stubClient struct {
	d          *stubDriver
	name       string
	endpoints  []string
	opts       rawOptions
	reqTimeout time.Duration
	heartbeat  time.Duration
	done       chan struct{}

	mu         sync.Mutex
	hint       string // a leader's address from GOAWAY or NOT_LEADER: tried first on reconnect
	session    [wire.SessionIDSize]byte
	stateID    [wire.StateIDSize]byte
	grace      time.Duration
	conn       *rawConn
	gen        int
	nextID     uint64
	pending    map[uint64]*stubReq
	locks      map[uint64]*stubLock // held, by token
	closed     bool
	newSession bool // a new session after a restart: its first WELCOME is not a failed resume
	lastRecv   time.Time
	pinging    bool
	answers    int
	acking     bool
}

type stubReq struct {
	req    wire.Request
	sentAt time.Time
	resp   chan rawFrame // one answer
	fail   chan error    // or one failure
}

func (c *stubClient) sessionID() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.session[:]...)
}

// dialOnce tries every endpoint once, the last leader hint first; a follower's CHALLENGE
// NOT_LEADER hint is tried next.
func (c *stubClient) dialOnce() (*rawConn, error) {
	c.mu.Lock()
	o := c.opts
	sess := c.session
	queue := append([]string(nil), c.endpoints...)
	if c.hint != "" {
		queue = append([]string{c.hint}, queue...)
		c.hint = ""
	}
	c.mu.Unlock()
	o.Session = &sess
	var last error
	tried := map[string]bool{}
	for len(queue) > 0 && len(tried) < 2*len(c.endpoints)+2 {
		ep := queue[0]
		queue = queue[1:]
		if tried[ep] {
			continue
		}
		tried[ep] = true
		conn, err := dialRaw(ep, o)
		if err == nil {
			return conn, nil
		}
		var he *handshakeError
		if errors.As(err, &he) && he.Status == wire.StatusNotLeader {
			if he.Msg != "" {
				queue = append([]string{he.Msg}, queue...)
			}
			if last == nil {
				last = errKind("unavailable", "%s: not the leader (leader %q)", ep, he.Msg)
			}
			continue
		}
		last = classifyDial(ep, err, o.Token != "")
		if k := last.(*stubError).kind; k == "auth_failed" || k == "unsupported_version" {
			return nil, last // the same answer everywhere: no other endpoint can do better
		}
	}
	return nil, last
}

func classifyDial(ep string, err error, haveToken bool) error {
	var he *handshakeError
	var ne net.Error
	switch {
	case errors.As(err, &he) && he.Status == wire.StatusAuthFailed:
		if !haveToken {
			return errKind("auth_failed", "%s: server requires a token", ep)
		}
		return errKind("auth_failed", "%s: authentication failed (wrong token?)", ep)
	case errors.As(err, &he):
		return errKind(statusKind(he.Status), "%s: handshake refused: %v", ep, he)
	case errors.Is(err, errNoAuthRequired), errors.Is(err, errBadServerProof):
		return errKind("auth_failed", "%s: %v", ep, err)
	case strings.Contains(err.Error(), "tls:") || strings.Contains(err.Error(), "x509:"):
		return errKind("tls", "%s: %v", ep, err)
	case errors.Is(err, wire.ErrLength):
		return errKind("tls", "%s: not a Ticketing server (is the server using TLS?): %v", ep, err)
	case errors.As(err, &ne) && ne.Timeout():
		return errKind("timeout", "%s: %v", ep, err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return errKind("unavailable", "%s: %v", ep, err)
	}
	return errKind("unavailable", "%s: %v", ep, err)
}

func statusKind(st wire.Status) string {
	switch st {
	case wire.StatusTimedOut:
		return "not_acquired"
	case wire.StatusNotHeld:
		return "not_held"
	case wire.StatusInvalid:
		return "invalid_argument"
	case wire.StatusBusy:
		return "busy"
	case wire.StatusShuttingDown:
		return "shutting_down"
	case wire.StatusAuthFailed:
		return "auth_failed"
	case wire.StatusUnsupportedVersion:
		return "unsupported_version"
	case wire.StatusCancelled:
		return "cancelled"
	}
	return "other"
}

func statusErr(f rawFrame, what string) error {
	if f.Status == wire.StatusOK {
		return nil
	}
	return errKind(statusKind(f.Status), "%s: %s %s", what, f.Status, f.Data)
}

// attach makes conn the client's connection: it re-sends unanswered requests (resumed), or
// fails them (not resumed), or, on a different state id, loses everything and starts a new
// session (the caller dials again).
func (c *stubClient) attach(conn *rawConn) (again bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		conn.close()
		return false
	}
	if conn.Welcome.StateID != c.stateID {
		c.d.logf("%s: state id changed: server restarted", c.name)
		// What was sent to the old state fails; what was never sent goes to the new one, with
		// ids of the new session.
		var unsent []*stubReq
		for id, p := range c.pending {
			if p.sentAt.IsZero() {
				unsent = append(unsent, p)
				delete(c.pending, id)
			}
		}
		c.failAllLocked(errKind("server_restarted", "server restarted (new state id)"))
		locks := c.locks
		c.locks = map[uint64]*stubLock{}
		rand.Read(c.session[:])
		c.stateID, c.nextID, c.newSession = conn.Welcome.StateID, 1, true
		sort.Slice(unsent, func(i, j int) bool { return unsent[i].req.ID < unsent[j].req.ID })
		for _, p := range unsent {
			p.req.ID = c.nextID
			c.nextID++
			c.pending[p.req.ID] = p
		}
		c.mu.Unlock()
		for _, l := range locks {
			l.fireLost("server_restarted")
		}
		conn.close()
		return true
	}
	if c.gen > 0 && !conn.resumed() && !c.newSession {
		c.failAllLocked(errKind("connection_lost", "connection lost and the session could not be resumed"))
	}
	c.newSession = false
	c.gen++
	gen := c.gen
	c.conn = conn
	c.lastRecv = time.Now()
	ids := make([]uint64, 0, len(c.pending))
	for id := range c.pending {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	now := time.Now()
	var reqs []wire.Request
	for _, id := range ids {
		p := c.pending[id]
		if p.sentAt.IsZero() {
			p.sentAt = now // first sent now; a re-send keeps the first send (the deadline counts from it)
		}
		reqs = append(reqs, p.req)
	}
	if len(reqs) > 0 {
		c.d.logf("%s: resumed, re-sending %d requests", c.name, len(reqs))
		conn.write(reqs...)
	}
	c.mu.Unlock()
	conn.run(func(f rawFrame) { c.onFrame(gen, f) }, func(err error) { c.onClose(gen, err) })
	return false
}

func (c *stubClient) failAllLocked(err error) {
	for id, p := range c.pending {
		p.fail <- err
		delete(c.pending, id)
	}
}

func (c *stubClient) onFrame(gen int, f rawFrame) {
	c.mu.Lock()
	if gen != c.gen {
		c.mu.Unlock()
		return
	}
	c.lastRecv = time.Now()
	if f.Op == wire.OpGoaway || f.ID != 0 && f.Status == wire.StatusNotLeader {
		// This node does not serve any more: reconnect (to the hint first) and resume; a
		// request answered NOT_LEADER stays pending and is re-sent there with its id.
		c.hint = string(f.Data)
		conn := c.conn
		c.mu.Unlock()
		c.d.logf("%s: %s (leader %q): reconnecting", c.name, f.Op, f.Data)
		if conn != nil {
			conn.close()
		}
		return
	}
	if f.ID == 0 {
		var l *stubLock
		if f.Op == wire.OpExpired {
			l = c.locks[f.Token]
		}
		c.mu.Unlock()
		if l != nil {
			if f.Detail == wire.ExpiredStopping {
				l.fireLost("server_stopping")
			} else {
				l.fireLost("expired")
			}
		}
		return
	}
	p := c.pending[f.ID]
	delete(c.pending, f.ID)
	c.answers++
	ack := c.answers >= wire.AckEvery && !c.acking && c.d.brk != "ack"
	c.mu.Unlock()
	if p != nil {
		p.resp <- f
	}
	if ack {
		go c.ack()
	}
}

// ack sends ACK(x), x = the lowest id still awaited that is not an ACQUIRE.
func (c *stubClient) ack() {
	c.mu.Lock()
	c.acking, c.answers = true, 0
	x := c.nextID
	for id, p := range c.pending {
		if p.req.Op != wire.OpAcquire && id < x {
			x = id
		}
	}
	c.mu.Unlock()
	c.do(wire.Request{Op: wire.OpAck, Token: x}, nil)
	c.mu.Lock()
	c.acking = false
	c.mu.Unlock()
}

func (c *stubClient) onClose(gen int, err error) {
	c.mu.Lock()
	if gen != c.gen || c.closed {
		c.mu.Unlock()
		return
	}
	c.conn = nil
	c.mu.Unlock()
	c.d.logf("%s: connection lost: %v", c.name, err)
	go c.reconnect(time.Now())
}

func (c *stubClient) reconnect(dropped time.Time) {
	backoff := 50 * time.Millisecond
	failed := false
	for {
		select {
		case <-c.done:
			return
		default:
		}
		conn, err := c.dialOnce()
		if err == nil {
			if again := c.attach(conn); !again {
				return
			}
			continue
		}
		c.mu.Lock()
		if !failed && time.Since(dropped) > c.grace {
			failed = true
			c.failAllLocked(errKind("connection_lost", "connection lost: %v", err))
		}
		c.mu.Unlock()
		select {
		case <-c.done:
			return
		case <-time.After(backoff):
		}
		if backoff *= 2; backoff > 2*time.Second {
			backoff = 2 * time.Second
		}
	}
}

func (c *stubClient) heartbeatLoop() {
	if c.heartbeat <= 0 {
		return
	}
	tick := time.NewTicker(c.heartbeat / 4)
	defer tick.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-tick.C:
		}
		c.mu.Lock()
		due := c.conn != nil && !c.pinging && time.Since(c.lastRecv) > c.heartbeat
		conn := c.conn
		if due {
			c.pinging = true
		}
		c.mu.Unlock()
		if !due {
			continue
		}
		go func() {
			_, err := c.do(wire.Request{Op: wire.OpPing}, nil)
			c.mu.Lock()
			c.pinging = false
			c.mu.Unlock()
			var se *stubError
			if errors.As(err, &se) && se.kind == "timeout" {
				c.d.logf("%s: heartbeat unanswered: closing the connection", c.name)
				conn.close()
			}
		}()
	}
}

// send queues a request (written now if connected, else on the next connection).
func (c *stubClient) send(req wire.Request) (*stubReq, error) {
	p := &stubReq{resp: make(chan rawFrame, 1), fail: make(chan error, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errKind("closed", "client closed")
	}
	req.ID = c.nextID
	c.nextID++
	p.req = req
	c.pending[req.ID] = p
	if c.conn != nil {
		p.sentAt = time.Now()
		c.conn.write(req) // a failed write shows as the connection's end
	}
	return p, nil
}

// await waits for p's answer; timeout 0 waits without limit; cancel (may be nil) gives up.
func (c *stubClient) await(p *stubReq, timeout time.Duration, cancel <-chan struct{}) (rawFrame, error) {
	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	select {
	case f := <-p.resp:
		return f, nil
	case err := <-p.fail:
		return rawFrame{}, err
	case <-tc:
		c.forget(p)
		return rawFrame{}, errKind("timeout", "no answer to %s within %v", p.req.Op, timeout)
	case <-c.done:
		return rawFrame{}, errKind("closed", "client closed")
	case <-cancel:
		return rawFrame{}, errCancelled
	}
}

var errCancelled = errKind("cancelled", "cancelled")

func (c *stubClient) forget(p *stubReq) {
	c.mu.Lock()
	delete(c.pending, p.req.ID)
	c.mu.Unlock()
}

// do sends a request and waits up to the request timeout.
func (c *stubClient) do(req wire.Request, cancel <-chan struct{}) (rawFrame, error) {
	p, err := c.send(req)
	if err != nil {
		return rawFrame{}, err
	}
	return c.await(p, c.reqTimeout, cancel)
}

func (c *stubClient) inspect(key []byte, token uint64) (inspection, error) {
	f, err := c.do(wire.Request{Op: wire.OpInspect, Key: key, Token: token}, nil)
	if err != nil {
		return inspection{}, err
	}
	if err := statusErr(f, "inspect"); err != nil {
		return inspection{}, err
	}
	if len(f.Data) != wire.InspectDataSize {
		return inspection{}, errKind("other", "INSPECT answer with %d data bytes", len(f.Data))
	}
	return inspection{Token: f.Token, LeaseLeft: f.Lease, Waiters: f.Detail, Flags: be32(f.Data[8:])}, nil
}

func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func (c *stubClient) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	close(c.done)
	conn := c.conn
	if conn != nil {
		// Withdraw the acquires still queued: a closed client is never granted a lock.
		var cancels []wire.Request
		for id, p := range c.pending {
			if p.req.Op == wire.OpAcquire && !p.sentAt.IsZero() {
				cancels = append(cancels, wire.Request{Op: wire.OpCancel, ID: c.nextID, Token: id})
				c.nextID++
			}
		}
		if len(cancels) > 0 {
			conn.write(cancels...)
		}
	}
	c.failAllLocked(errKind("closed", "client closed"))
	locks := c.locks
	c.locks = map[uint64]*stubLock{}
	c.mu.Unlock()
	for _, l := range locks {
		l.stopKeepalive()
	}
	if conn != nil {
		conn.close()
	}
}

func (c *stubClient) holds(key []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.locks {
		if string(l.key) == string(key) && !l.isLost() {
			return true
		}
	}
	return false
}

// stubLock is a held lock: its local deadline, keep-alive and lost signal.
type stubLock struct {
	d     *stubDriver
	c     *stubClient
	name  string
	key   []byte
	token uint64
	lease uint32
	quiet bool // no lost events (with_lock's lock has no handle)

	mu       sync.Mutex
	timer    *time.Timer
	deadline time.Time // the local deadline (PROTOCOL.md, "The lost signal")
	extendID uint64    // the EXTEND whose answer set deadline (0: the ACQUIRE's)
	lost     bool
	reason   string
	released bool
	stopKA   chan struct{}
}

// deadlineAfter is PROTOCOL.md's local deadline counted from the request's first send.
func deadlineAfter(first time.Time, detailMs, leaseMs uint32) time.Time {
	total := float64(detailMs+leaseMs) * (1 - 2*float64(wire.ClockRateBoundPPM)/1e6)
	return first.Add(time.Duration(total * float64(time.Millisecond)))
}

// setDeadline sets the local deadline (from the ACQUIRE, extendID 0, or an EXTEND: only an
// answer to a later EXTEND than the one that set it moves it) and the lost timer, a margin
// before it. The stub takes a tenth of the lease as its margin, wider than the protocol's
// minimum (a client may fire lost early, never late): the stub only has to show that the
// runner can fail, and with the minimum (5 ms) its intact run raced the next holder's grant
// when a loaded machine delayed its timer (seen once in lost_on_expiry: the lost event 0.1 ms
// after the grant).
func (l *stubLock) setDeadline(at time.Time, leaseMs uint32, extendID uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if extendID != 0 && extendID < l.extendID {
		return
	}
	l.deadline, l.extendID = at, extendID
	if l.timer != nil {
		l.timer.Stop()
	}
	margin := time.Duration(math.Max(wire.LostMarginMs, float64(leaseMs)/10) * float64(time.Millisecond))
	l.timer = time.AfterFunc(time.Until(at.Add(-margin)), func() { l.fireLost("expired") })
}

func (l *stubLock) isLost() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

func (l *stubLock) fireLost(reason string) {
	l.mu.Lock()
	if l.lost || l.released {
		l.mu.Unlock()
		return
	}
	l.lost, l.reason = true, reason
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	l.stopKeepalive()
	l.c.mu.Lock()
	if l.c.locks[l.token] == l {
		delete(l.c.locks, l.token)
	}
	l.c.mu.Unlock()
	l.mu.Lock()
	quiet := l.quiet
	l.mu.Unlock()
	if quiet || l.d.brk == "lost" {
		return
	}
	l.d.write(map[string]any{"event": "lost", "lock": l.name, "reason": reason})
}

// forget stops the lock's timer and keep-alive and silences it (reset).
func (l *stubLock) forget() {
	l.stopKeepalive()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.quiet = true
	if l.timer != nil {
		l.timer.Stop()
	}
}

func (l *stubLock) stopKeepalive() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopKA != nil {
		close(l.stopKA)
		l.stopKA = nil
	}
}

func (l *stubLock) keepalive() {
	l.mu.Lock()
	stop := make(chan struct{})
	l.stopKA = stop
	l.mu.Unlock()
	go func() {
		tick := time.NewTicker(time.Duration(l.lease) * time.Millisecond / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			l.mu.Lock()
			if l.stopKA != stop {
				l.mu.Unlock()
				return
			}
			l.mu.Unlock()
			l.extend(l.lease)
		}
	}()
}

func (l *stubLock) extend(lease uint32) (uint32, error) {
	l.mu.Lock()
	if l.lost {
		r := l.reason
		l.mu.Unlock()
		return 0, lockLostErr(r)
	}
	l.mu.Unlock()
	p, err := l.c.send(wire.Request{Op: wire.OpExtend, Key: l.key, Token: l.token, Lease: lease})
	if err != nil {
		return 0, err
	}
	f, err := l.c.await(p, l.c.reqTimeout, nil)
	if err != nil {
		return 0, err
	}
	switch f.Status {
	case wire.StatusOK:
		l.setDeadline(deadlineAfter(p.sentAt, 0, f.Lease), f.Lease, p.req.ID)
		return f.Lease, nil
	case wire.StatusNotHeld:
		l.fireLost("not_held")
		return 0, lockLostErr(l.reasonNow())
	}
	return 0, statusErr(f, "extend")
}

func (l *stubLock) reasonNow() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

func (l *stubLock) release() error {
	l.stopKeepalive()
	if l.isLost() {
		// Lost before: answer at once; tell the server in the background, unless nothing is
		// left to release there.
		if r := l.reasonNow(); r != "server_restarted" && r != "not_held" {
			go l.c.do(wire.Request{Op: wire.OpRelease, Key: l.key, Token: l.token}, nil)
		}
		return lockLostErr(l.reasonNow())
	}
	f, err := l.c.do(wire.Request{Op: wire.OpRelease, Key: l.key, Token: l.token}, nil)
	l.mu.Lock()
	wasLost, reason := l.lost, l.reason
	if err == nil && f.Status == wire.StatusOK && !wasLost {
		l.released = true
		if l.timer != nil {
			l.timer.Stop()
		}
	}
	l.mu.Unlock()
	if wasLost {
		return lockLostErr(reason)
	}
	if err != nil {
		return err
	}
	switch f.Status {
	case wire.StatusOK:
		l.c.mu.Lock()
		delete(l.c.locks, l.token)
		l.c.mu.Unlock()
		return nil
	case wire.StatusNotHeld:
		l.fireLost("not_held")
		return lockLostErr(l.reasonNow())
	}
	return statusErr(f, "release")
}

// acquireLock runs ACQUIRE until answered, cancelled or timed out; a cancel withdraws the waiter
// (CANCEL) and releases a grant that raced it.
func (c *stubClient) acquireLock(key []byte, lease, wait uint32, cancel <-chan struct{}) (*stubReq, rawFrame, error) {
	p, err := c.send(wire.Request{Op: wire.OpAcquire, Key: key, Lease: lease, WaitMs: wait})
	if err != nil {
		return nil, rawFrame{}, err
	}
	var timeout time.Duration
	if wait != wire.WaitForever {
		timeout = time.Duration(wait)*time.Millisecond + c.reqTimeout
	}
	f, err := c.await(p, timeout, cancel)
	if err == errCancelled {
		if c.d.brk != "cancel" {
			c.do(wire.Request{Op: wire.OpCancel, Token: p.req.ID}, nil)
			if g, err := c.await(p, 5*time.Second, nil); err == nil && g.Status == wire.StatusOK {
				c.do(wire.Request{Op: wire.OpRelease, Key: key, Token: g.Token}, nil)
			}
		}
		c.forget(p)
		return nil, rawFrame{}, errCancelled
	}
	if err != nil {
		var se *stubError
		if errors.As(err, &se) && se.kind == "timeout" {
			// A failed wait counts as cancelled: withdraw it, release a grant that still comes.
			go func() {
				c.do(wire.Request{Op: wire.OpCancel, Token: p.req.ID}, nil)
			}()
		}
		return nil, rawFrame{}, err
	}
	return p, f, nil
}

func (d *stubDriver) acquire(id int64, op string, a args) (map[string]any, error) {
	c, err := d.client(a)
	if err != nil {
		return nil, err
	}
	key, err := a.key()
	if err != nil {
		return nil, err
	}
	lease, err := a.lease()
	if err != nil {
		return nil, err
	}
	wait := uint32(0)
	if op == "acquire" {
		if wait, err = a.wait(); err != nil {
			return nil, err
		}
		if a.flag("refuse_held") && c.holds(key) {
			return nil, errKind("already_held", "this client already holds %q", key)
		}
	}
	d.mu.Lock()
	cancel := d.acqs[id]
	d.mu.Unlock()
	p, f, err := c.acquireLock(key, lease, wait, cancel)
	if err != nil {
		return nil, err
	}
	if f.Status == wire.StatusTimedOut && op == "try_acquire" {
		return map[string]any{"acquired": false}, nil
	}
	if err := statusErr(f, "acquire"); err != nil {
		return nil, err
	}
	l := &stubLock{d: d, c: c, name: a.str("lock"), key: key, token: f.Token, lease: lease}
	l.setDeadline(deadlineAfter(p.sentAt, f.Detail, f.Lease), f.Lease, 0)
	c.mu.Lock()
	c.locks[f.Token] = l
	c.mu.Unlock()
	d.mu.Lock()
	d.locks[l.name] = l
	d.mu.Unlock()
	if a.flag("keepalive") {
		l.keepalive()
	}
	if op == "try_acquire" {
		return map[string]any{"acquired": true, "token": fmt.Sprint(f.Token)}, nil
	}
	return map[string]any{"token": fmt.Sprint(f.Token), "lease_ms": f.Lease}, nil
}

func (d *stubDriver) withLock(a args) error {
	c, err := d.client(a)
	if err != nil {
		return err
	}
	key, err := a.key()
	if err != nil {
		return err
	}
	lease, err := a.lease()
	if err != nil {
		return err
	}
	hold, err := a.num("hold_ms")
	if err != nil {
		return err
	}
	p, f, err := c.acquireLock(key, lease, wire.WaitForever, nil)
	if err != nil {
		return err
	}
	if err := statusErr(f, "acquire"); err != nil {
		return err
	}
	l := &stubLock{d: d, c: c, name: "with_lock", key: key, token: f.Token, lease: lease, quiet: true}
	l.setDeadline(deadlineAfter(p.sentAt, f.Detail, f.Lease), f.Lease, 0)
	c.mu.Lock()
	c.locks[f.Token] = l
	c.mu.Unlock()
	time.Sleep(time.Duration(hold) * time.Millisecond) // the body
	return l.release()
}
