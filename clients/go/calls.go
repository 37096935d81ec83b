package ticketing

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
)

// call is one request and its waiter. Calls are pooled: a call goes back to the pool only after
// its waiter has received a real answer, so that nothing (the pending map, the reader) still
// refers to it.
type call struct {
	req   wire.Request // Key is kept until the call is answered (it may be re-sent)
	ch    chan result  // capacity 1; receives exactly one result
	timer *time.Timer  // the request timeout, reused across uses

	// Guarded by Client.mu.
	state     callState
	tSend     time.Time     // when the request was last queued for the wire (<= when it was sent)
	retried   bool          // re-sent on a new connection after a resume
	abandoned bool          // its waiter is gone (cancelled, timed out, failed by a heartbeat)
	settled   chan struct{} // abandoned ACQUIRE: closed once its outcome is known (and a grant released)

	lk       *Lock         // ACQUIRE: the lock to fill in when granted
	internal func(result)  // internal calls (heartbeat, ACK, CANCEL): called instead of ch
	wait     time.Duration // ACQUIRE: the wait timeout (-1: without limit), for messages
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
}

var callPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{ch: make(chan result, 1), timer: t}
}}

func getCall() *call { return callPool.Get().(*call) }

func putCall(cl *call) {
	cl.req = wire.Request{}
	cl.state, cl.retried, cl.abandoned, cl.settled = callNew, false, false, nil
	cl.lk, cl.internal, cl.wait = nil, nil, 0
	callPool.Put(cl)
}

// do submits cl and waits for its answer: at most timeout (0: no limit), and until ctx is done.
// A non-OK status is returned as a result, for the caller to turn into an error; err is set only
// when no answer came (then cl must not be reused).
func (c *Client) do(ctx context.Context, cl *call, timeout time.Duration) (result, error) {
	if err := ctx.Err(); err != nil {
		return result{}, callErr(cl, ErrCancelled, "cancelled before it was sent", err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return result{}, callErr(cl, ErrClosed, "the client is closed", nil)
	}
	c.submitLocked(cl)
	c.mu.Unlock()

	var expired <-chan time.Time
	if timeout > 0 {
		cl.timer.Reset(timeout)
		expired = cl.timer.C
	}
	select {
	case res := <-cl.ch:
		cl.timer.Stop()
		return res, res.err
	case <-ctx.Done():
		cl.timer.Stop()
		return c.giveUp(cl, true, func(sent bool, _ error) error {
			return callErr(cl, ErrCancelled, "cancelled while waiting for the answer", context.Cause(ctx))
		})
	case <-expired:
		return c.giveUp(cl, false, func(sent bool, connErr error) error {
			switch {
			case sent:
				return callErr(cl, ErrTimeout, "no answer within "+timeout.String(), nil)
			case connErr != nil:
				return callErr(cl, ErrUnavailable, "no connection to the server within "+timeout.String(), connErr)
			default:
				return callErr(cl, ErrTimeout, "no connection to the server within "+timeout.String(), nil)
			}
		})
	}
}

// giveUp ends the wait for cl's answer. A request not yet sent is withdrawn; one sent is
// abandoned (its answer will be dropped; an ACQUIRE is withdrawn with CANCEL, and a grant that
// races it is released). With cleanup (a cancellation by the caller), giveUp waits for that
// clean-up, up to the cleanup timeout; after a timeout it does not (the server is not
// answering). If the answer has already arrived, it is returned instead of the error.
func (c *Client) giveUp(cl *call, cleanup bool, mkErr func(sent bool, connErr error) error) (result, error) {
	c.mu.Lock()
	switch cl.state {
	case callWaiting:
		for i, w := range c.waiting {
			if w == cl {
				c.waiting = append(c.waiting[:i], c.waiting[i+1:]...)
				break
			}
		}
		cl.state = callDone
		err := mkErr(false, c.connErr)
		c.mu.Unlock()
		return result{}, err
	case callPending:
		if cl.abandoned {
			// A heartbeat or the session grace failed it at the same moment: its error is on ch.
			break
		}
		cl.abandoned = true
		var settled chan struct{}
		if cl.req.Op == wire.OpAcquire {
			settled = c.cancelAcquireLocked(cl)
		}
		err := mkErr(true, nil)
		c.mu.Unlock()
		if settled != nil && cleanup {
			t := time.NewTimer(c.opts.cleanupTimeout)
			select {
			case <-settled:
			case <-t.C:
				c.opts.logger.Warn("ticketing: clean-up of a cancelled acquire continues in the background", "key", FormatKey(string(cl.req.Key)))
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
	c.submitLocked(cancel)
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
	key, token := cl.req.Key, res.token
	ok := c.goBackground(func() {
		defer done()
		ctx, cancel := context.WithCancel(c.closeCtx)
		defer cancel()
		err := c.release(ctx, key, token)
		if err != nil && !isNotHeld(err) {
			c.opts.logger.Warn("ticketing: could not release a lock granted to a cancelled acquire; it runs out its lease",
				"key", FormatKey(string(key)), "token", token, "err", err)
		}
	})
	if !ok {
		done()
	}
}

// submitLocked queues cl: on the live connection (it gets the next request id now) or, while
// there is none, in the waiting list (it gets its id when a connection is attached). c.mu must
// be held.
func (c *Client) submitLocked(cl *call) {
	if c.live != nil {
		c.sendLocked(cl)
		return
	}
	cl.state = callWaiting
	c.waiting = append(c.waiting, cl)
	c.wakeManager()
}

// sendLocked gives cl the next request id and appends its frame to the write buffer, in one step
// under c.mu: requests reach the wire in the order of their ids. c.live must be set; c.mu must
// be held.
func (c *Client) sendLocked(cl *call) {
	c.nextID++
	cl.req.ID = c.nextID
	cl.tSend = time.Now()
	cl.state = callPending
	c.pending[cl.req.ID] = cl
	c.wbuf = wire.AppendRequest(c.wbuf, &cl.req)
	c.live.kick()
}

// dropAllLocked removes every pending call and fails it with mkErr (an abandoned ACQUIRE is
// settled instead). It returns the internal calls' handlers, to be run without c.mu. c.mu must be
// held.
func (c *Client) dropAllLocked(mkErr func(*call) error) []func() {
	var after []func()
	for id, cl := range c.pending {
		delete(c.pending, id)
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

// failLocked delivers err to cl's waiter; for an internal or abandoned call it returns what to
// run once c.mu is released.
func (c *Client) failLocked(cl *call, err error) func() {
	switch {
	case cl.internal != nil:
		return func() { cl.internal(result{err: err}) }
	case cl.abandoned:
		if cl.settled != nil {
			s := cl.settled
			cl.settled = nil
			return func() { close(s) }
		}
		return nil
	}
	cl.ch <- result{err: err}
	return nil
}

// abandonAllLocked fails the waiter of every pending call with mkErr but keeps the calls pending,
// so that they are re-sent if the session is resumed; a waiting ACQUIRE is withdrawn (CANCEL on
// the next connection, and any grant that still arrives is released). c.mu must be held.
func (c *Client) abandonAllLocked(mkErr func(*call) error) {
	for _, cl := range c.pending {
		if cl.abandoned || cl.internal != nil {
			continue
		}
		cl.abandoned = true
		if cl.req.Op == wire.OpAcquire {
			c.cancelAcquireLocked(cl)
		}
		cl.ch <- result{err: mkErr(cl)}
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
		e.key, e.hasK = string(cl.req.Key), true
	case wire.OpRelease, wire.OpExtend:
		e.key, e.hasK, e.token = string(cl.req.Key), true, cl.req.Token
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
