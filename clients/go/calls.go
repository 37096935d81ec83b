package ticketing

import (
	"context"
	"encoding/binary"
	"strconv"
	"sync"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// call is one request and its waiter. Calls are pooled: a call goes back to the pool only after
// its waiter has received a real answer, so that nothing (the pending table, the reader, the
// timeout heap) still refers to it.
type call struct {
	req wire.Request // its Key is unused: the key is key
	key string       // kept until the call is answered (it may be re-sent)
	ch  chan result  // capacity 1; receives exactly one result

	// Guarded by Client.mu.
	state      callState
	timeout    time.Duration // the request timeout (0: none), for messages
	timeoutPos int32         // its place in Client.timeouts, while its waiter waits with a timeout
	tFirst     int64         // ACQUIRE, EXTEND: when the request was first queued for the wire (<= its first send), on Client.clk; a re-send keeps it
	tGrant     time.Time     // ACQUIRE: when the grant arrived
	retried    bool          // re-sent on a new connection after a resume
	abandoned  bool          // its waiter is gone (cancelled, timed out, failed by a heartbeat)
	settled    chan struct{} // abandoned ACQUIRE: closed once its outcome is known (and a grant released)
	readOn     *conn         // the connection its caller reads for itself (Client.readOwn), if any

	lk       *Lock         // ACQUIRE: the lock to fill in when granted
	internal func(result)  // internal calls (heartbeat, ACK, CANCEL): called, with Client.mu held, instead of ch
	wait     time.Duration // ACQUIRE: the wait timeout (-1: without limit), for messages

	// readOwn's, while its caller reads for itself with a context that can end: ctxDone (made
	// once per pooled call) runs when the context ends and interrupts that read.
	client  *Client
	ctxDone func()
	keep    bool // ctxDone may still run: the call is not pooled again
}

type callState uint8

const (
	callNew     callState = iota
	callWaiting           // in Client.waiting, without an id
	callPending           // in Client.pending, sent (or queued for the wire) with its id
	callDone              // answered or failed; its result is (or is about to be) on ch
)

// result is a decoded answer (data copied out of the read buffer), or the error that ended the
// call.
type result struct {
	status wire.Status
	token  uint64
	lease  uint32
	detail uint32
	data   []byte
	err    error
	id     uint64 // EXTEND: the request id (Client.extend)
	first  int64  // EXTEND: its first send, on Client.clk
}

var callPool = sync.Pool{New: func() any {
	cl := &call{ch: make(chan result, 1)}
	cl.ctxDone = func() {
		c := cl.client
		c.mu.Lock()
		c.interruptLocked(cl)
		c.mu.Unlock()
	}
	return cl
}}

func getCall() *call { return callPool.Get().(*call) }

func putCall(cl *call) {
	if cl.keep {
		return // its ctxDone may still run (readOwn)
	}
	cl.req, cl.key, cl.timeout, cl.tGrant, cl.tFirst = wire.Request{}, "", 0, time.Time{}, 0
	cl.state, cl.retried, cl.abandoned, cl.settled = callNew, false, false, nil
	cl.lk, cl.internal, cl.wait, cl.readOn, cl.client = nil, nil, 0, nil, nil
	callPool.Put(cl)
}

// do submits cl and waits for its answer: at most timeout (0: no limit), and until ctx is done.
// A non-OK status is returned as a result, for the caller to turn into an error; err is set only
// when no answer came (then cl must not be reused).
func (c *Client) do(ctx context.Context, cl *call, timeout time.Duration) (result, error) {
	if err := ctx.Err(); err != nil {
		return result{}, callErr(cl, ErrCancelled, "cancelled before it was sent", err)
	}
	// The times, read before taking c.mu: the deadline clock only where the first send is used
	// (tFirst: a lock's deadline).
	var now int64
	if op := cl.req.Op; op == wire.OpAcquire || op == wire.OpExtend {
		now = c.clk.now()
	}
	mono := c.monoNow()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return result{}, callErr(cl, ErrClosed, "the client is closed", nil)
	}
	if timeout > 0 {
		// Fails the wait with ErrTimeout at now+timeout unless it has ended (expireCalls).
		cl.timeout = timeout
		at := mono + int64(timeout)
		c.timeouts.set(cl, &cl.timeoutPos, at)
		c.timeoutAlarm.want(at)
	}
	// A lone caller (nothing else in flight, nobody writing, and at most this caller answered
	// since the last write) writes its frame itself; and when nobody reads, it reads for itself
	// until its answer comes (conn). Otherwise the writer goroutine writes it (coalesced with the
	// requests of the other callers just answered: writeLoop) and a reader hands the answer over.
	cn := c.live
	var wbuf []byte
	own := false
	if cn == nil {
		c.submitLocked(cl, now) // (waits for a connection)
	} else {
		self := !cn.writing && len(c.wbuf) == 0 && c.delivered <= 1 && c.awaitedLocked(cn) == 0
		if c.queueLocked(cl, now) && !self {
			cn.kick()
		}
		if self {
			wbuf = c.takeWriteLocked(cn)
		}
		if cn.reader == readByNone {
			cn.reader, cn.readCall, cl.readOn = readByCaller, cl, cn
			own = true
		}
	}
	c.mu.Unlock()
	if wbuf != nil {
		cn.write(wbuf)
	}
	if own {
		c.readOwn(ctx, cn, cl)
	}

	done := ctx.Done()
	if done == nil {
		res := <-cl.ch
		return res, res.err
	}
	select {
	case res := <-cl.ch:
		return res, res.err
	case <-done:
		return c.giveUp(cl, ctx)
	}
}

// expireCalls runs at the earliest request timeout: it fails the waiter of every call whose
// timeout has passed. A request not yet sent is withdrawn; one sent is abandoned (its answer
// will be dropped; an ACQUIRE is withdrawn with CANCEL, and a grant that races it is released).
// It does not wait for that clean-up: the server is not answering.
func (c *Client) expireCalls() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timeoutAlarm.fired()
	now := c.monoNow()
	for {
		cl, at, ok := c.timeouts.first()
		if !ok {
			return
		}
		if at > now {
			c.timeoutAlarm.want(at)
			return
		}
		c.timeouts.remove(&cl.timeoutPos)
		msg := "no answer within " + cl.timeout.String()
		switch cl.state {
		case callWaiting:
			c.unwaitLocked(cl)
			msg = "no connection to the server within " + cl.timeout.String()
			// docs/clients.md rule 1: timeout, naming the last connect error (its cause).
			cl.ch <- result{err: callErr(cl, ErrTimeout, msg, c.connErr)}
		case callPending:
			if cl.abandoned {
				continue // (never: an abandoned call leaves the heap)
			}
			cl.abandoned = true
			if cl.req.Op == wire.OpAcquire {
				c.cancelAcquireLocked(cl)
			}
			cl.ch <- result{err: callErr(cl, ErrTimeout, msg, nil)}
			c.interruptLocked(cl)
		}
	}
}

// unwaitLocked takes cl, waiting for a connection, out of the waiting list; it is done.
func (c *Client) unwaitLocked(cl *call) {
	for i, w := range c.waiting {
		if w == cl {
			c.waiting = append(c.waiting[:i], c.waiting[i+1:]...)
			break
		}
	}
	cl.state = callDone
}

// giveUp ends the wait for cl's answer when ctx is done. A request not yet sent is withdrawn;
// one sent is abandoned (its answer will be dropped; an ACQUIRE is withdrawn with CANCEL, and a
// grant that races it is released): giveUp waits for that clean-up, up to the cleanup timeout.
// If the answer (or another error) has already arrived, it is returned instead.
func (c *Client) giveUp(cl *call, ctx context.Context) (result, error) {
	mkErr := func() error {
		return callErr(cl, ErrCancelled, "cancelled while waiting for the answer", context.Cause(ctx))
	}
	c.mu.Lock()
	switch cl.state {
	case callWaiting:
		c.timeouts.remove(&cl.timeoutPos)
		c.unwaitLocked(cl)
		err := mkErr()
		c.mu.Unlock()
		return result{}, err
	case callPending:
		if cl.abandoned {
			// A heartbeat, the session grace or the request timeout failed it at the same
			// moment: its error is on ch.
			break
		}
		c.timeouts.remove(&cl.timeoutPos)
		cl.abandoned = true
		var settled chan struct{}
		if cl.req.Op == wire.OpAcquire {
			settled = c.cancelAcquireLocked(cl)
		}
		err := mkErr()
		c.mu.Unlock()
		if settled != nil {
			t := time.NewTimer(c.opts.cleanupTimeout)
			select {
			case <-settled:
			case <-t.C:
				c.opts.logger.Warn("ticketing: clean-up of a cancelled acquire continues in the background", "key", FormatKey(cl.key))
			case <-c.closedCh:
			}
			t.Stop()
		}
		return result{}, err
	}
	c.mu.Unlock()
	// Answered (or failed) just now: the result is on its way.
	res := <-cl.ch
	return res, res.err
}

// cancelAcquireLocked withdraws the abandoned ACQUIRE cl: it queues a CANCEL for it (sent now,
// or on the next connection) and returns a channel closed once the ACQUIRE's outcome is known
// and a grant that raced the CANCEL has been released. c.mu must be held.
func (c *Client) cancelAcquireLocked(cl *call) chan struct{} {
	if cl.settled == nil {
		cl.settled = make(chan struct{})
	}
	cancel := &call{ch: make(chan result, 1), internal: func(result) {}}
	cancel.req = wire.Request{Op: wire.OpCancel, Token: cl.req.ID}
	c.submitLocked(cancel, 0)
	c.ensureReaderLocked()
	return cl.settled
}

// settleAbandoned handles the answer to an abandoned call: a grant is released (its waiter gave
// up, so nobody else will); then an abandoned ACQUIRE is marked settled.
func (c *Client) settleAbandoned(cl *call, res result) {
	if cl.req.Op != wire.OpAcquire {
		return
	}
	settled := cl.settled
	done := func() {
		if settled != nil {
			close(settled)
		}
	}
	if res.err != nil || res.status != wire.StatusOK {
		done()
		return
	}
	key, token := cl.key, res.token
	ok := c.goBackground(func() {
		defer done()
		ctx, cancel := context.WithCancel(c.closeCtx)
		defer cancel()
		err := c.release(ctx, key, token)
		if err != nil && !isNotHeld(err) {
			c.opts.logger.Warn("ticketing: could not release a lock granted to a cancelled acquire; it runs out its lease",
				"key", FormatKey(key), "token", token, "err", err)
		}
	})
	if !ok {
		done()
	}
}

// submitLocked queues cl: on the live connection (it gets the next request id now) or, while
// there is none, in the waiting list (it gets its id when a connection is attached). now is the
// time on Client.clk (for an ACQUIRE or EXTEND; else 0). c.mu must be held.
func (c *Client) submitLocked(cl *call, now int64) {
	if c.live != nil {
		c.sendLocked(cl, now)
		return
	}
	cl.state = callWaiting
	c.waiting = append(c.waiting, cl)
	c.wakeManager()
}

// sendLocked gives cl the next request id and appends its frame to the write buffer, in one step
// under c.mu: requests reach the wire in the order of their ids. now is the time on Client.clk
// (for an ACQUIRE or EXTEND; else 0): the call's first send, unless it was sent before (a call
// moved to another endpoint as a new request keeps its first send: earlier is safe). c.live
// must be set; c.mu must be held.
func (c *Client) sendLocked(cl *call, now int64) {
	if c.queueLocked(cl, now) {
		c.live.kick() // (the writer was kicked for the frames already there)
	}
}

// queueLocked is sendLocked without waking the writer: it reports whether the write buffer was
// empty (then the writer needs a kick, unless the caller writes the buffer itself). c.mu must
// be held and c.live set.
func (c *Client) queueLocked(cl *call, now int64) bool {
	c.nextID++
	cl.req.ID = c.nextID
	if cl.tFirst == 0 {
		cl.tFirst = now
	}
	cl.state = callPending
	c.pending.put(cl)
	empty := len(c.wbuf) == 0
	c.wbuf = appendRequest(c.wbuf, &cl.req, cl.key)
	return empty
}

// appendRequest appends r's frame with key as its key (r.Key is unused): wire.AppendRequest,
// without a copy of the key into a []byte first.
func appendRequest(dst []byte, r *wire.Request, key string) []byte {
	n := len(dst)
	dst = wire.AppendRequest(dst, &wire.Request{Op: r.Op, Flags: r.Flags, ID: r.ID, Token: r.Token, Lease: r.Lease, WaitMs: r.WaitMs})
	binary.BigEndian.PutUint32(dst[n:], uint32(wire.HeaderSize-4+len(key))) // the frame's length
	binary.BigEndian.PutUint16(dst[n+6:], uint16(len(key)))                 // the key's length
	return append(dst, key...)
}

// dropAllLocked removes every pending call and fails it with mkErr (an abandoned ACQUIRE is
// settled instead). It returns what to run once c.mu is released (failLocked). c.mu must be
// held.
func (c *Client) dropAllLocked(mkErr func(*call) error) []func() {
	var after []func()
	all := c.pending.calls(nil)
	c.pending.clear()
	for _, cl := range all {
		cl.state = callDone
		after = append(after, c.failLocked(cl, mkErr(cl)))
	}
	c.ack = nil
	return after
}

// failWaitingLocked fails every call waiting for a connection. c.mu must be held.
func (c *Client) failWaitingLocked(mkErr func(*call) error) []func() {
	var after []func()
	for _, cl := range c.waiting {
		cl.state = callDone
		after = append(after, c.failLocked(cl, mkErr(cl)))
	}
	c.waiting = nil
	return after
}

// failLocked delivers err to cl's waiter; for an abandoned call it returns what to run once c.mu
// is released. c.mu must be held.
func (c *Client) failLocked(cl *call, err error) func() {
	c.timeouts.remove(&cl.timeoutPos)
	switch {
	case cl.internal != nil:
		cl.internal(result{err: err})
		return nil
	case cl.abandoned:
		if cl.settled != nil {
			s := cl.settled
			cl.settled = nil
			return func() { close(s) }
		}
		return nil
	}
	cl.ch <- result{err: err}
	c.interruptLocked(cl)
	return nil
}

// abandonAllLocked fails the waiter of every pending call with mkErr but keeps the calls pending,
// so that they are re-sent if the session is resumed; a waiting ACQUIRE is withdrawn (CANCEL on
// the next connection, and any grant that still arrives is released). c.mu must be held.
func (c *Client) abandonAllLocked(mkErr func(*call) error) {
	for _, cl := range c.pending.calls(nil) {
		if cl.abandoned || cl.internal != nil {
			continue
		}
		c.timeouts.remove(&cl.timeoutPos)
		cl.abandoned = true
		if cl.req.Op == wire.OpAcquire {
			c.cancelAcquireLocked(cl)
		}
		cl.ch <- result{err: mkErr(cl)}
		c.interruptLocked(cl)
	}
}

func runAll(fs []func()) {
	for _, f := range fs {
		if f != nil {
			f()
		}
	}
}

// statusError turns a non-OK answer into a *StatusError; nil for OK.
func (r *result) statusError(op wire.Op, key string, token uint64) error {
	if r.status == wire.StatusOK {
		return nil
	}
	e := &StatusError{Op: op.String(), Key: key, Token: token, Status: Status(r.status), Detail: r.detail}
	if len(r.data) > 0 {
		e.Message = string(r.data)
	}
	return e
}

// callErr builds the error of a call that got no answer.
func callErr(cl *call, kind error, msg string, cause error) error {
	e := &opError{kind: kind, op: opVerb(cl.req.Op), msg: msg, cause: cause}
	switch cl.req.Op {
	case wire.OpAcquire, wire.OpInspect:
		e.key, e.hasK = cl.key, true
	case wire.OpRelease, wire.OpExtend:
		e.key, e.hasK, e.token = cl.key, true, cl.req.Token
	}
	return e
}

// opVerb names an op in messages: "acquire", "release".
func opVerb(op wire.Op) string {
	switch op {
	case wire.OpAcquire:
		return "acquire"
	case wire.OpRelease:
		return "release"
	case wire.OpExtend:
		return "extend"
	case wire.OpCancel:
		return "cancel"
	case wire.OpPing:
		return "ping"
	case wire.OpInspect:
		return "inspect"
	case wire.OpAck:
		return "ack"
	}
	return "op 0x" + strconv.FormatUint(uint64(op), 16)
}
