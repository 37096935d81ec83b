package conformance

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// rawConn is one protocol connection built directly on the wire package: the handshake, then
// frames written as given and frames read by a loop that hands each to a callback. The runner's
// observer "R" (rawClient) and the stub driver are built on it.
type rawConn struct {
	nc      net.Conn
	Session [wire.SessionIDSize]byte
	Welcome wire.Welcome

	wmu  sync.Mutex
	done chan struct{}
	err  error // why the read loop ended (valid once done is closed)
}

// rawOptions configure a handshake.
type rawOptions struct {
	Token   string
	TLS     *tls.Config // nil: plain TCP
	Session *[wire.SessionIDSize]byte
	Timeout time.Duration // dial + TLS + handshake; default 5 s
}

// handshakeError is a refused handshake: the status of CHALLENGE or WELCOME.
type handshakeError struct {
	Frame  string // "CHALLENGE" or "WELCOME"
	Status wire.Status
	Detail uint32
	Msg    string
}

func (e *handshakeError) Error() string {
	return fmt.Sprintf("%s %s (detail %d) %q", e.Frame, e.Status, e.Detail, e.Msg)
}

// errNoAuthRequired: a token was configured but the server does not ask for one.
var errNoAuthRequired = errors.New("server does not require auth (CHALLENGE without AUTH_REQUIRED) but a token is configured")

// errBadServerProof: the server's proof did not verify.
var errBadServerProof = errors.New("server proof does not verify")

// dialRaw connects and runs the handshake.
func dialRaw(addr string, o rawOptions) (*rawConn, error) {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	deadline := time.Now().Add(o.Timeout)
	nc, err := net.DialTimeout("tcp", addr, o.Timeout)
	if err != nil {
		return nil, err
	}
	if o.TLS != nil {
		tc := tls.Client(nc, o.TLS)
		tc.SetDeadline(deadline)
		if err := tc.Handshake(); err != nil {
			nc.Close()
			return nil, fmt.Errorf("tls: %w", err)
		}
		nc = tc
	}
	c := &rawConn{nc: nc, done: make(chan struct{})}
	if err := c.handshake(o, deadline); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

func (c *rawConn) handshake(o rawOptions, deadline time.Time) error {
	c.nc.SetDeadline(deadline)
	defer c.nc.SetDeadline(time.Time{})
	if o.Session != nil {
		c.Session = *o.Session
	} else if _, err := rand.Read(c.Session[:]); err != nil {
		return err
	}
	var hello wire.Hello
	hello.Version = wire.Version
	hello.SessionID = c.Session
	if _, err := rand.Read(hello.Nonce[:]); err != nil {
		return err
	}
	if _, err := c.nc.Write(wire.AppendHello(nil, &hello)); err != nil {
		return err
	}
	var head [4]byte
	if _, err := io.ReadFull(c.nc, head[:]); err != nil {
		return fmt.Errorf("reading CHALLENGE: %w", err)
	}
	n, err := wire.ChallengeLen(head[:])
	if err != nil {
		return fmt.Errorf("CHALLENGE: %w", err)
	}
	buf := make([]byte, n)
	copy(buf, head[:])
	if _, err := io.ReadFull(c.nc, buf[4:]); err != nil {
		return fmt.Errorf("reading CHALLENGE: %w", err)
	}
	var ch wire.Challenge
	if err := wire.DecodeChallenge(buf, &ch); err != nil {
		return fmt.Errorf("CHALLENGE: %w", err)
	}
	if ch.Status != wire.StatusOK {
		return &handshakeError{"CHALLENGE", ch.Status, ch.Detail, string(ch.Data)}
	}
	authRequired := ch.Flags&wire.ChallengeAuthRequired != 0
	if o.Token != "" && !authRequired {
		return errNoAuthRequired
	}
	var auth wire.Auth
	if authRequired && o.Token != "" {
		auth.Proof = wire.ClientProof([]byte(o.Token), &c.Session, &hello.Nonce, &ch.Nonce)
	}
	if _, err := c.nc.Write(wire.AppendAuth(nil, &auth)); err != nil {
		return err
	}
	wb := make([]byte, wire.WelcomeSize)
	if _, err := io.ReadFull(c.nc, wb); err != nil {
		return fmt.Errorf("reading WELCOME: %w", err)
	}
	if err := wire.DecodeWelcome(wb, &c.Welcome); err != nil {
		return fmt.Errorf("WELCOME: %w", err)
	}
	if c.Welcome.Status != wire.StatusOK {
		return &handshakeError{"WELCOME", c.Welcome.Status, c.Welcome.Detail, ""}
	}
	if o.Token != "" {
		want := wire.ServerProof([]byte(o.Token), &c.Session, &hello.Nonce, &ch.Nonce, &c.Welcome)
		if !wire.ProofEqual(&want, &c.Welcome.Proof) {
			return errBadServerProof
		}
	}
	return nil
}

// resumed reports the WELCOME flag RESUMED.
func (c *rawConn) resumed() bool { return c.Welcome.Flags&wire.WelcomeResumed != 0 }

// rawFrame is a response or push as read, with its data copied.
type rawFrame struct {
	wire.Response
	At time.Time
}

// run starts the read loop: onFrame for every frame, then onClose once with the reason.
func (c *rawConn) run(onFrame func(rawFrame), onClose func(error)) {
	go func() {
		err := c.readLoop(onFrame)
		c.err = err
		close(c.done)
		if onClose != nil {
			onClose(err)
		}
	}()
}

func (c *rawConn) readLoop(onFrame func(rawFrame)) error {
	var head [4]byte
	for {
		if _, err := io.ReadFull(c.nc, head[:]); err != nil {
			return err
		}
		n := 4 + int(binary.BigEndian.Uint32(head[:]))
		if n < wire.HeaderSize || n > wire.HeaderSize+wire.MaxDataLen {
			return fmt.Errorf("frame length %d out of range", n)
		}
		buf := make([]byte, n)
		copy(buf, head[:])
		if _, err := io.ReadFull(c.nc, buf[4:]); err != nil {
			return err
		}
		var r wire.Response
		if _, err := wire.DecodeResponse(buf, wire.MaxDataLen, &r); err != nil {
			return fmt.Errorf("bad frame % x: %v", buf, err)
		}
		onFrame(rawFrame{Response: r, At: time.Now()})
	}
}

// write sends requests as one write.
func (c *rawConn) write(reqs ...wire.Request) error {
	var b []byte
	for i := range reqs {
		b = wire.AppendRequest(b, &reqs[i])
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(b)
	return err
}

func (c *rawConn) close() { c.nc.Close() }

// rawClient is the runner's own protocol client "R": one connection, requests matched to
// answers by id, pushes kept in order. With redial (on a cluster) R follows the leader: when its
// connection ends (GOAWAY, a NOT_LEADER answer, a dead node) it reconnects with the same session
// and re-sends its unanswered requests with their ids, as a client does (retries are answered
// from the replicated state, never run twice); without it (one node) a lost connection fails
// what is unanswered.
type rawClient struct {
	conn *rawConn
	log  func(format string, args ...any)
	// redial connects a new connection for the same session (nil: R does not reconnect).
	redial  func(session [wire.SessionIDSize]byte) (*rawConn, error)
	session [wire.SessionIDSize]byte
	stateID [wire.StateIDSize]byte

	smu sync.Mutex // request ids reach the wire in order

	mu      sync.Mutex
	gen     int // connections so far; frames of an older one are ignored
	down    bool
	nextID  uint64
	pending map[uint64]*rawPending
	pushes  []rawFrame
	changed chan struct{}
	closed  bool // for good: nothing more is answered
	stopped bool // close was called
	closeCh chan struct{}
}

type rawPending struct {
	req wire.Request
	ch  chan rawFrame
}

// rawReconnectWithin bounds how long R tries to reconnect (an election, a restart).
const rawReconnectWithin = 15 * time.Second

func newRawClient(addr string, o rawOptions, log func(string, ...any)) (*rawClient, error) {
	conn, err := dialRaw(addr, o)
	if err != nil {
		return nil, err
	}
	return newRawClientOn(conn, log, nil), nil
}

// newRawClientOn makes R on a connected conn; redial (may be nil) reconnects it.
func newRawClientOn(conn *rawConn, log func(string, ...any), redial func([wire.SessionIDSize]byte) (*rawConn, error)) *rawClient {
	r := &rawClient{conn: conn, log: log, redial: redial, pending: map[uint64]*rawPending{},
		changed: make(chan struct{}), closeCh: make(chan struct{}),
		session: conn.Session, stateID: conn.Welcome.StateID}
	r.runLocked(conn)
	return r
}

// runLocked starts the read loop of conn as the current connection (r.mu held or not yet shared).
func (r *rawClient) runLocked(conn *rawConn) {
	r.gen++
	gen := r.gen
	conn.run(func(f rawFrame) { r.onFrame(gen, f) }, func(err error) { r.onClose(gen, err) })
}

func (r *rawClient) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *rawClient) onFrame(gen int, f rawFrame) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if gen != r.gen {
		return
	}
	if f.ID == 0 {
		r.pushes = append(r.pushes, f)
		if r.log != nil {
			r.log("R push %s", describeFrame(f.Response))
		}
		r.notifyLocked()
		if f.Op == wire.OpGoaway && r.redial != nil {
			r.conn.close() // the node closes it too; R reconnects and resumes
		}
		return
	}
	if f.Status == wire.StatusNotLeader && r.redial != nil {
		if r.log != nil {
			r.log("R: %s answered NOT_LEADER (leader %q): reconnecting", f.Op, f.Data)
		}
		r.conn.close() // the request stays pending and is re-sent on the next connection
		return
	}
	if p, ok := r.pending[f.ID]; ok {
		delete(r.pending, f.ID)
		p.ch <- f
	}
}

func (r *rawClient) onClose(gen int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if gen != r.gen || r.closed {
		return
	}
	if r.redial == nil || r.stopped {
		r.failLocked(true)
		return
	}
	r.down = true
	if r.log != nil {
		r.log("R: connection lost (%v): reconnecting", err)
	}
	go r.reconnect()
}

// failLocked ends every unanswered request (its channel closes without a value); forGood: R
// answers nothing any more.
func (r *rawClient) failLocked(forGood bool) {
	if forGood {
		r.closed = true
	}
	for id, p := range r.pending {
		close(p.ch)
		delete(r.pending, id)
	}
	r.notifyLocked()
}

// reconnect dials until a connection resumes R's session, then re-sends the unanswered
// requests in id order.
func (r *rawClient) reconnect() {
	deadline := time.Now().Add(rawReconnectWithin)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-r.closeCh:
			return
		default:
		}
		conn, err := r.redial(r.session)
		if err != nil {
			last = err
			time.Sleep(50 * time.Millisecond)
			continue
		}
		r.smu.Lock()
		r.mu.Lock()
		if r.stopped {
			r.mu.Unlock()
			r.smu.Unlock()
			conn.close()
			return
		}
		resumed := conn.resumed() && conn.Welcome.StateID == r.stateID
		var resend []wire.Request
		if resumed {
			for _, p := range r.pending {
				resend = append(resend, p.req)
			}
			sort.Slice(resend, func(i, j int) bool { return resend[i].ID < resend[j].ID })
		} else {
			r.failLocked(false) // the session ended: nothing can be retried
		}
		r.conn, r.down = conn, false
		if r.log != nil {
			r.log("R reconnected (resumed=%v), re-sending %d requests", resumed, len(resend))
		}
		r.runLocked(conn)
		r.mu.Unlock()
		if len(resend) > 0 {
			if err := conn.write(resend...); err != nil {
				conn.close()
			}
		}
		r.smu.Unlock()
		return
	}
	r.mu.Lock()
	if r.log != nil {
		r.log("R: no connection within %v (last: %v)", rawReconnectWithin, last)
	}
	r.failLocked(true)
	r.mu.Unlock()
}

// send sends one request with the next id and returns the channel of its answer (closed
// without a value if R cannot get it any more). While R reconnects, the request waits and is
// sent on the next connection.
func (r *rawClient) send(req wire.Request) (uint64, <-chan rawFrame) {
	ch := make(chan rawFrame, 1)
	r.smu.Lock()
	defer r.smu.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		close(ch)
		return 0, ch
	}
	r.nextID++
	req.ID = r.nextID
	r.pending[req.ID] = &rawPending{req: req, ch: ch}
	conn, down := r.conn, r.down
	r.mu.Unlock()
	if !down {
		if err := conn.write(req); err != nil {
			conn.close()
		}
	}
	return req.ID, ch
}

// do sends a request and waits up to timeout for its answer.
func (r *rawClient) do(req wire.Request, timeout time.Duration) (wire.Response, error) {
	_, ch := r.send(req)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case f, ok := <-ch:
		if !ok {
			r.mu.Lock()
			err := r.conn.err
			r.mu.Unlock()
			return wire.Response{}, fmt.Errorf("R: connection closed before the answer to %s (%v)", req.Op, err)
		}
		return f.Response, nil
	case <-t.C:
		return wire.Response{}, fmt.Errorf("R: no answer to %s %q within %v", req.Op, req.Key, timeout)
	}
}

const rawTimeout = 10 * time.Second

// acquire sends ACQUIRE and waits for the answer (use send for one that waits in the queue).
func (r *rawClient) acquire(key string, lease time.Duration, wait uint32) (wire.Response, error) {
	resp, err := r.do(wire.Request{Op: wire.OpAcquire, Key: []byte(key), Lease: uint32(lease.Milliseconds()), WaitMs: wait}, rawTimeout)
	if err == nil && r.log != nil {
		r.log("R ACQUIRE %q lease %v wait %d: %s", key, lease, wait, describeFrame(resp))
	}
	return resp, err
}

func (r *rawClient) release(key string, token uint64) (wire.Response, error) {
	resp, err := r.do(wire.Request{Op: wire.OpRelease, Key: []byte(key), Token: token}, rawTimeout)
	if err == nil && r.log != nil {
		r.log("R RELEASE %q token %d: %s", key, token, describeFrame(resp))
	}
	return resp, err
}

func (r *rawClient) extend(key string, token uint64, lease time.Duration) (wire.Response, error) {
	resp, err := r.do(wire.Request{Op: wire.OpExtend, Key: []byte(key), Token: token, Lease: uint32(lease.Milliseconds())}, rawTimeout)
	if err == nil && r.log != nil {
		r.log("R EXTEND %q token %d lease %v: %s", key, token, lease, describeFrame(resp))
	}
	return resp, err
}

// inspection is a decoded INSPECT answer.
type inspection struct {
	Token     uint64
	LeaseLeft uint32
	Waiters   uint32
	HeldFor   uint32
	LockDelay uint32
	Flags     uint32
}

func (i inspection) held() bool       { return i.Flags&wire.InspectHeld != 0 }
func (i inspection) tokenMatch() bool { return i.Flags&wire.InspectTokenMatch != 0 }

func (i inspection) String() string {
	return fmt.Sprintf("held=%v token=%d lease_left=%dms waiters=%d held_for=%dms lock_delay=%dms flags=%#x",
		i.held(), i.Token, i.LeaseLeft, i.Waiters, i.HeldFor, i.LockDelay, i.Flags)
}

// inspect sends INSPECT (with token 0 or a token to check). It does not log: callers poll it.
func (r *rawClient) inspect(key string, token uint64) (inspection, error) {
	resp, err := r.do(wire.Request{Op: wire.OpInspect, Key: []byte(key), Token: token}, rawTimeout)
	if err != nil {
		return inspection{}, err
	}
	if resp.Status != wire.StatusOK || len(resp.Data) != wire.InspectDataSize {
		return inspection{}, fmt.Errorf("R: INSPECT %q: %s", key, describeFrame(resp))
	}
	be := binary.BigEndian
	return inspection{Token: resp.Token, LeaseLeft: resp.Lease, Waiters: resp.Detail,
		HeldFor: be.Uint32(resp.Data[0:]), LockDelay: be.Uint32(resp.Data[4:]), Flags: be.Uint32(resp.Data[8:])}, nil
}

func (r *rawClient) ping() error {
	resp, err := r.do(wire.Request{Op: wire.OpPing}, rawTimeout)
	if err == nil && resp.Status != wire.StatusOK {
		err = fmt.Errorf("R: PING: %s", describeFrame(resp))
	}
	return err
}

// waitPush waits up to timeout for a push matching pred.
func (r *rawClient) waitPush(pred func(rawFrame) bool, timeout time.Duration) (rawFrame, bool) {
	return r.waitPushAfter(0, pred, timeout)
}

// waitPushAfter is waitPush among the pushes after the first skip ones.
func (r *rawClient) waitPushAfter(skip int, pred func(rawFrame) bool, timeout time.Duration) (rawFrame, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		for _, p := range r.pushes[min(skip, len(r.pushes)):] {
			if pred(p) {
				r.mu.Unlock()
				return p, true
			}
		}
		ch, closed := r.changed, r.closed
		r.mu.Unlock()
		if closed {
			return rawFrame{}, false
		}
		select {
		case <-ch:
		case <-deadline.C:
			return rawFrame{}, false
		}
	}
}

// pushesNow returns the pushes received so far.
func (r *rawClient) pushesNow() []rawFrame {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]rawFrame(nil), r.pushes...)
}

// close closes R for good.
func (r *rawClient) close() {
	r.mu.Lock()
	if !r.stopped {
		r.stopped = true
		close(r.closeCh)
	}
	conn := r.conn
	r.mu.Unlock()
	conn.close()
}

// describeFrame renders a response for logs.
func describeFrame(f wire.Response) string {
	s := fmt.Sprintf("%s %s id=%d", f.Op, f.Status, f.ID)
	if f.Token != 0 {
		s += fmt.Sprintf(" token=%d", f.Token)
	}
	if f.Lease != 0 {
		s += fmt.Sprintf(" lease=%d", f.Lease)
	}
	if f.Detail != 0 {
		s += fmt.Sprintf(" detail=%d", f.Detail)
	}
	if len(f.Data) > 0 {
		if f.Op == wire.OpInspect {
			s += fmt.Sprintf(" data=% x", f.Data)
		} else {
			s += fmt.Sprintf(" data=%q", f.Data)
		}
	}
	return s
}

// describeRequest renders a request frame's bytes for logs.
func describeRequest(b []byte) string {
	var r wire.Request
	if _, err := wire.DecodeRequest(b, wire.MaxKeyLen, &r); err != nil {
		return fmt.Sprintf("% x", b)
	}
	s := fmt.Sprintf("%s id=%d", r.Op, r.ID)
	if r.Token != 0 {
		s += fmt.Sprintf(" token=%d", r.Token)
	}
	if r.Lease != 0 {
		s += fmt.Sprintf(" lease=%d", r.Lease)
	}
	if r.Op == wire.OpAcquire {
		s += fmt.Sprintf(" wait=%d", r.WaitMs)
	}
	if len(r.Key) > 0 {
		s += fmt.Sprintf(" key=%q", clip(string(r.Key), 40))
	}
	return s
}
