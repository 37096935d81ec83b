package ticketing

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// The session: connecting, resuming after a reconnect, the state id check, and routing answers
// and pushes (PROTOCOL.md, "Sessions" and "State id and restarts").

// maxRedirects bounds how many leader hints one connect round follows.
const maxRedirects = 3

// manage reconnects in the background while the client needs a connection: calls are waiting or
// in flight, or locks are held (for their EXPIRED notices, keep-alive and the state id check).
// Rounds are separated by the backoff; the loop ends with Close.
func (c *Client) manage() {
	defer c.bg.Done()
	round := 0
	for {
		c.mu.Lock()
		for !c.closed && (c.live != nil || (!c.redialNow && !c.demandLocked())) {
			c.mu.Unlock()
			select {
			case <-c.wake:
			case <-c.closedCh:
			}
			c.mu.Lock()
		}
		if c.closed {
			c.mu.Unlock()
			return
		}
		now := c.redialNow
		c.redialNow = false
		c.mu.Unlock()
		if now {
			round = 0
		} else if round > 0 && !c.sleepBackoff(round-1) {
			return
		}
		err := c.connect(c.closeCtx)
		if err == nil {
			round = 0
			continue
		}
		round++
		if errors.Is(err, ErrNotLeader) {
			// A node answered "not the leader": the cluster is electing one, which takes well
			// under a second; retry at the shortest pause rather than back off as from a dead server.
			round = 1
		}
		c.opts.logger.Warn("ticketing: reconnect failed", "err", err, "round", round)
		c.mu.Lock()
		c.connErr = err
		var after []func()
		if isFatal(err) {
			// Neither another endpoint nor time will fix it: fail what waits.
			mk := func(cl *call) error { return callErr(cl, kindOf(err), "cannot reconnect", err) }
			after = append(c.dropAllLocked(mk), c.failWaitingLocked(mk)...)
		}
		c.mu.Unlock()
		runAll(after)
	}
}

// demandLocked reports whether the client needs a connection. c.mu must be held.
func (c *Client) demandLocked() bool {
	return c.pending.len() > 0 || len(c.waiting) > 0 || len(c.locks) > 0
}

func (c *Client) wakeManager() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// backoff is the pause before reconnect round attempt+1: min*2^attempt (capped at max), times a
// random factor in [0.5, 1].
func (c *Client) backoff(attempt int) time.Duration {
	d := c.opts.minBackoff
	for i := 0; i < attempt && d < c.opts.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, c.opts.maxBackoff)
	return d/2 + mrand.N(d/2+1)
}

// sleepBackoff waits backoff(attempt); false if the client was closed.
func (c *Client) sleepBackoff(attempt int) bool {
	t := time.NewTimer(c.backoff(attempt))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.closedCh:
		return false
	}
}

// firstConnect is Dial's connect. A failed round fails Dial at once (an address nobody serves, a
// server that is down: the mistake shows at once), except one in which a node answered NOT_LEADER:
// the cluster is electing a leader, which takes about a second, as when the application and the
// cluster start together. Such rounds are retried at the shortest backoff until the request
// timeout has passed since Dial began, or ctx ends; then the last round's error is returned.
func (c *Client) firstConnect(ctx context.Context) error {
	giveUp := time.Now().Add(c.opts.requestTimeout)
	for {
		err := c.connect(ctx)
		if err == nil || isFatal(err) || !errors.Is(err, ErrNotLeader) {
			return err
		}
		d := c.backoff(0)
		if time.Until(giveUp) < d {
			return err
		}
		c.opts.logger.Debug("ticketing: no leader yet; connecting again", "err", err, "in", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// connect runs one round: the leader hint, then every endpoint once, until one completes the
// handshake; then the session is attached to it.
func (c *Client) connect(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		cn, w, session, err := c.dialRound(ctx)
		if err != nil {
			return err
		}
		switch c.attach(cn, w, session) {
		case attachOK:
			return nil
		case attachClosed:
			return &opError{kind: ErrClosed, op: "connect", msg: "the client was closed"}
		case attachRedial:
			// The server restarted: the session starts over, with a new id, at once.
			if attempt >= 2 {
				return &opError{kind: ErrUnavailable, op: "connect", msg: "the server's state id keeps changing"}
			}
		}
	}
}

// silentSkip is how long a node whose connection went silent (a PING unanswered: frozen, or cut
// off) is left out of the connect rounds, as an endpoint and as a leader hint, when there are
// other endpoints: it still accepts TCP and would cost the handshake wait, and the other nodes
// keep naming it as the leader until they elect another one (docs/clients.md, rule 1).
const silentSkip = 2 * time.Second

// dialRound tries the leader hint (if any), then every endpoint once, starting at c.next.
func (c *Client) dialRound(ctx context.Context) (*conn, *wire.Welcome, [wire.SessionIDSize]byte, error) {
	c.mu.Lock()
	hint, start, session := c.hint, c.next, c.session
	c.hint = ""
	skip := ""
	if len(c.opts.endpoints) > 1 && time.Now().Before(c.silentTill) {
		skip = c.silent
	}
	c.mu.Unlock()
	if hint == skip {
		hint = ""
	}
	eps := c.opts.endpoints
	type target struct {
		addr string
		idx  int
	}
	index := func(addr string) int { return slices.Index(eps, addr) }
	var targets []target
	if hint != "" {
		targets = append(targets, target{hint, index(hint)})
	}
	for i := range eps {
		if j := (start + i) % len(eps); eps[j] != hint && eps[j] != skip {
			targets = append(targets, target{eps[j], j})
		}
	}
	var errs []error
	redirects := 0
	for i := 0; i < len(targets); i++ {
		t := targets[i]
		nc, w, err := c.dialEndpoint(ctx, t.addr, &session)
		if err == nil {
			c.opts.logger.Debug("ticketing: connected", "addr", t.addr, "resumed", w.Flags&wire.WelcomeResumed != 0)
			return newConn(c, nc, t.addr, t.idx), w, session, nil
		}
		c.opts.logger.Debug("ticketing: connect failed", "addr", t.addr, "err", err)
		if isFatal(err) {
			return nil, nil, session, err
		}
		errs = append(errs, err)
		var re *redirectError
		if errors.As(err, &re) && re.leader != "" && redirects < maxRedirects && re.leader != t.addr && re.leader != skip {
			redirects++
			targets = slices.Insert(targets, i+1, target{re.leader, index(re.leader)})
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, nil, session, roundError(errs, ctx)
}

// roundError summarises a failed round on one line. One endpoint: its own error. Several: ErrTLS
// when every endpoint failed TLS, else ErrUnavailable, naming each endpoint; the error also
// matches each endpoint's.
func roundError(errs []error, ctx context.Context) error {
	if len(errs) == 1 {
		return errs[0]
	}
	kind := ErrUnavailable
	if len(errs) > 0 {
		allTLS := true
		for _, e := range errs {
			allTLS = allTLS && errors.Is(e, ErrTLS)
		}
		if allTLS {
			kind = ErrTLS
		}
	}
	msgs := make([]string, 0, len(errs)+1)
	for _, e := range errs {
		var ee *endpointError
		if errors.As(e, &ee) {
			msgs = append(msgs, ee.short())
		} else {
			msgs = append(msgs, causeText(e))
		}
	}
	if len(errs) == 0 {
		msgs = append(msgs, "no endpoint tried")
		if err := ctx.Err(); err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	return &opError{kind: kind, op: "connect", msg: kindText(kind) + ": " + strings.Join(msgs, "; "), causes: errs}
}

type attachResult int

const (
	attachOK attachResult = iota
	attachClosed
	attachRedial
)

// attach makes cn the session's connection after its WELCOME w (PROTOCOL.md, client checklist
// item 4): a different state id means the server restarted (every lock is lost, every request
// in flight fails, and the session starts over with a new id); the same state id without RESUMED means the
// session ended (unanswered requests fail with ErrConnectionLost); RESUMED re-sends every
// unanswered request with its original id, in id order, before anything new.
func (c *Client) attach(cn *conn, w *wire.Welcome, session [wire.SessionIDSize]byte) attachResult {
	resumed := w.Flags&wire.WelcomeResumed != 0
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		cn.close()
		return attachClosed
	case session != c.session:
		// The session was replaced while this connection was being made.
		c.mu.Unlock()
		cn.close()
		return attachRedial
	case c.haveState && w.StateID != c.stateID:
		c.opts.logger.Warn("ticketing: the server restarted (new state id): every lock is lost, every request in flight fails", "addr", cn.addr)
		// Requests in flight fail; those made since the drop were never sent: they go to the new
		// session as new requests.
		after := c.dropAllLocked(func(cl *call) error {
			return callErr(cl, ErrServerRestarted, fmt.Sprintf("the server (%s) restarted (its state id changed); the request was not sent again", cn.addr), nil)
		})
		lost := make([]*Lock, 0, len(c.locks))
		for _, lk := range c.locks {
			lost = append(lost, lk)
		}
		c.stateID = w.StateID
		c.session = [wire.SessionIDSize]byte{}
		newSessionID(&c.session)
		c.redialNow = true
		c.mu.Unlock()
		cn.close()
		runAll(after)
		for _, lk := range lost {
			lk.markLost(ReasonServerRestarted, "the server restarted: its state id changed", nil)
		}
		return attachRedial
	}
	c.stateID, c.haveState = w.StateID, true
	c.graceMs = w.GraceMs
	c.connErr = nil
	if c.graceTimer != nil {
		c.graceTimer.Stop()
		c.graceTimer = nil
	}
	var after []func()
	if !resumed && c.pending.len() > 0 {
		c.opts.logger.Warn("ticketing: the session could not be resumed; requests in flight fail", "addr", cn.addr, "requests", c.pending.len())
		after = c.dropAllLocked(func(cl *call) error {
			return callErr(cl, ErrConnectionLost, fmt.Sprintf("the connection dropped and the server (%s) did not resume the session; the outcome is unknown", cn.addr), nil)
		})
	}
	c.live = cn
	c.wbuf = c.wbuf[:0]
	if c.pending.len() > 0 {
		resend := c.pending.calls(nil)
		slices.SortFunc(resend, func(a, b *call) int { return cmp.Compare(a.req.ID, b.req.ID) })
		for _, cl := range resend {
			cl.retried = true // (its first send stays: a lock's deadline counts from it)
			c.wbuf = appendRequest(c.wbuf, &cl.req, cl.key)
		}
		c.opts.logger.Debug("ticketing: session resumed; requests re-sent", "addr", cn.addr, "requests", len(resend))
	}
	waiting := c.waiting
	c.waiting = nil
	now := c.clk.now()
	for _, cl := range waiting {
		c.sendLocked(cl, now)
	}
	cn.start()
	cn.kick()
	c.mu.Unlock()
	runAll(after)
	return attachOK
}

// downKind says why a connection is given up.
type downKind int

const (
	downDropped downKind = iota // it failed: reconnect, to the same endpoint first
	downMoved                   // NOT_LEADER, GOAWAY, SHUTTING_DOWN: c.hint / c.next say where to go
	downSilent                  // a PING went unanswered: the node is frozen or cut off
)

// connDown handles the loss of cn: the next connection resumes the session. Without a session
// grace (0), the calls in flight fail at once; else they fail with ErrConnectionLost once the
// grace has passed without a reconnect. After an unanswered heartbeat (a frozen or cut-off
// node) the next round tries the node just left last: it accepts TCP but answers nothing.
func (c *Client) connDown(cn *conn, cause error, how downKind) {
	// The socket is closed only after cn is detached: its reader, which fails at once, must find
	// it detached and not report a drop of its own.
	defer cn.close()
	c.mu.Lock()
	if c.live != cn {
		c.mu.Unlock()
		return
	}
	c.live = nil
	c.wbuf = c.wbuf[:0]
	if cn.hb != nil {
		c.pending.del(cn.hb.req.ID)
		cn.hb = nil
	}
	switch {
	case how == downSilent && cn.idx >= 0:
		c.next = (cn.idx + 1) % len(c.opts.endpoints)
		c.silent, c.silentTill = cn.addr, time.Now().Add(silentSkip)
	case how != downMoved && cn.idx >= 0:
		c.next = cn.idx
	}
	c.drops++
	closed := c.closed
	var after []func()
	switch {
	case closed:
	case c.graceMs == 0:
		after = c.dropAllLocked(func(cl *call) error {
			return callErr(cl, ErrConnectionLost, fmt.Sprintf("the connection to %s dropped and the server keeps no session to resume", cn.addr), cause)
		})
	default:
		drop, grace := c.drops, time.Duration(c.graceMs)*time.Millisecond
		if c.graceTimer != nil {
			c.graceTimer.Stop()
		}
		c.graceTimer = time.AfterFunc(grace, func() {
			c.mu.Lock()
			if c.live == nil && c.drops == drop && !c.closed {
				c.abandonAllLocked(func(cl *call) error {
					return callErr(cl, ErrConnectionLost, fmt.Sprintf("no reconnect within the session grace of %v", grace), c.connErr)
				})
			}
			c.mu.Unlock()
		})
	}
	c.wakeManager()
	c.mu.Unlock()
	runAll(after)
	if !closed {
		c.opts.logger.Info("ticketing: connection lost; reconnecting", "addr", cn.addr, "err", cause)
	}
}

// dispatch routes one frame from cn: a push, or the answer to a pending request.
func (c *Client) dispatch(cn *conn, r *wire.Response) {
	if r.ID == 0 {
		c.push(cn, r)
		return
	}
	c.mu.Lock()
	if a, ok := c.answerLocked(cn, r); ok {
		c.mu.Unlock()
		c.deliver(&a)
		return
	}
	if c.live != cn {
		// cn is being replaced: the request stays pending and is re-sent on the next connection.
		c.mu.Unlock()
		return
	}
	cl := c.pending.get(r.ID)
	if cl == nil {
		c.mu.Unlock()
		c.opts.logger.Debug("ticketing: answer for no pending request", "addr", cn.addr, "op", r.Op.String(), "id", r.ID, "status", r.Status.String())
		return
	}
	switch {
	case r.Status == wire.StatusNotLeader:
		// Not run: reconnect to the leader and re-send it there with its id.
		c.hint = string(r.Data)
		if c.hint == "" && cn.idx >= 0 {
			c.next = (cn.idx + 1) % len(c.opts.endpoints)
		}
		c.redialNow = true
		c.mu.Unlock()
		c.connDown(cn, &opError{kind: ErrNotLeader, op: "connect", msg: fmt.Sprintf("%s is not the leader (leader %q)", cn.addr, r.Data)}, downMoved)
	case c.movedOn(cl, r):
		// The node is stopping: send the request again, as a new one, to the next endpoint.
		c.pending.del(r.ID)
		cl.state = callWaiting
		c.waiting = append([]*call{cl}, c.waiting...)
		if cn.idx >= 0 {
			c.next = (cn.idx + 1) % len(c.opts.endpoints)
		}
		c.redialNow = true
		c.mu.Unlock()
		c.connDown(cn, &opError{kind: ErrShuttingDown, op: "connect", msg: cn.addr + " is shutting down"}, downMoved)
	default: // (answerLocked takes every other answer)
		c.mu.Unlock()
	}
}

// answer is an answer taken from the pending calls (answerLocked), to be handed to its call
// once c.mu is released (deliver); cl is nil when there is nothing left to do.
type answer struct {
	cl        *call
	res       result
	abandoned bool
}

// answerLocked takes the call that r answers out of the pending calls, for deliver: the common
// case of dispatch, which the reader runs for every frame it has buffered under one hold of
// c.mu. It reports false, having changed nothing, for the rest: a push, a frame from a
// connection being replaced, an answer for no pending request, NOT_LEADER, and a SHUTTING_DOWN
// that moves the request to another endpoint (movedOn). c.mu must be held.
func (c *Client) answerLocked(cn *conn, r *wire.Response) (answer, bool) {
	if r.ID == 0 || c.live != cn || r.Status == wire.StatusNotLeader {
		return answer{}, false
	}
	cl := c.pending.get(r.ID)
	if cl == nil || c.movedOn(cl, r) {
		return answer{}, false
	}
	c.pending.del(r.ID)
	c.timeouts.remove(&cl.timeoutPos)
	cl.state = callDone
	if c.answers++; c.answers >= wire.AckEvery && c.ack == nil {
		c.sendAckLocked()
	}
	if !cl.abandoned && cl.lk != nil && r.Op == wire.OpAcquire && r.Status == wire.StatusOK {
		c.registerLocked(cl.lk, r.Token, r.Lease, r.Detail, cl.tFirst)
		cl.tGrant = cn.grantTime()
	}
	a := answer{cl: cl, abandoned: cl.abandoned,
		res: result{status: r.Status, token: r.Token, lease: r.Lease, detail: r.Detail}}
	if len(r.Data) > 0 {
		a.res.data = bytes.Clone(r.Data)
	}
	if cl.internal != nil {
		// Now, before the next answer is looked at (an ACK's answer allows the next ACK).
		cl.internal(a.res)
		return answer{}, true
	}
	return a, true
}

// movedOn reports whether the answer r to cl is SHUTTING_DOWN and cl is to be sent again, as a
// new request, to another endpoint. c.mu must be held.
func (c *Client) movedOn(cl *call, r *wire.Response) bool {
	return r.Status == wire.StatusShuttingDown && len(c.opts.endpoints) > 1 && cl.internal == nil && !cl.abandoned
}

// deliver hands an answer to its call (nothing for an internal call's, handled by
// answerLocked). c.mu must not be held.
func (c *Client) deliver(a *answer) {
	switch cl := a.cl; {
	case cl == nil:
	case a.abandoned:
		c.settleAbandoned(cl, a.res)
	default:
		cl.ch <- a.res
	}
}

// sendAckLocked sends ACK(x), x being the lowest id still awaited that is not an ACQUIRE (or the
// next id when there is none), so that the server may drop the outcomes it stores for us.
// c.mu must be held and c.live set.
//
// x is found by walking the ids up from the last ACK's point: every id below it was answered or
// is an acquire, and stays so (ids only grow, and a call keeps its id and op), so each id is
// looked up about once over all ACKs. Listing every call in flight per ACK touched each of them.
func (c *Client) sendAckLocked() {
	x := max(c.ackFrom, 1)
	for ; x <= c.nextID; x++ {
		if cl := c.pending.get(x); cl != nil && cl.req.Op != wire.OpAcquire {
			break
		}
	}
	c.ackFrom = x
	ack := &call{ch: make(chan result, 1), req: wire.Request{Op: wire.OpAck, Token: x}}
	ack.internal = func(result) {
		if c.ack == ack {
			c.ack = nil
		}
	}
	c.ack, c.answers = ack, 0
	c.sendLocked(ack, 0)
}

// push handles a frame with request id 0: EXPIRED, GOAWAY, or an INVALID/LENGTH verdict.
func (c *Client) push(cn *conn, r *wire.Response) {
	switch r.Op {
	case wire.OpExpired:
		reason, detail := ReasonExpired, "the server reports that its lease ran out"
		if r.Detail == wire.ExpiredStopping {
			reason, detail = ReasonServerStopping, "the server is stopping"
		}
		c.mu.Lock()
		lk := c.locks[r.Token]
		c.mu.Unlock()
		if lk == nil {
			c.opts.logger.Debug("ticketing: EXPIRED for no lock held", "token", r.Token, "key", FormatKey(string(r.Data)))
			return
		}
		lk.markLost(reason, detail, nil)
	case wire.OpGoaway:
		c.mu.Lock()
		c.hint = string(r.Data)
		if c.hint == "" && cn.idx >= 0 {
			c.next = (cn.idx + 1) % len(c.opts.endpoints)
		}
		c.redialNow = true
		c.mu.Unlock()
		c.opts.logger.Info("ticketing: GOAWAY; moving the session", "addr", cn.addr, "reason", wire.GoawayReasonName(r.Detail), "leader", string(r.Data))
		c.connDown(cn, &opError{kind: ErrConnectionLost, op: "connect", msg: cn.addr + " sent GOAWAY"}, downMoved)
	case 0:
		// INVALID/LENGTH: the server could not trust a frame of ours and closes the connection.
		c.opts.logger.Error("ticketing: the server rejected a frame and closes the connection", "addr", cn.addr, "status", r.Status.String(), "detail", wire.FieldName(r.Detail), "message", string(r.Data))
	default:
		c.opts.logger.Debug("ticketing: unknown push ignored", "addr", cn.addr, "op", r.Op.String())
	}
}

// isFatal reports whether a connect error is one that neither another endpoint nor a retry
// fixes.
func isFatal(err error) bool {
	return errors.Is(err, ErrAuthFailed) || errors.Is(err, ErrUnsupportedVersion)
}

// kindOf returns the sentinel an error of this package matches first.
func kindOf(err error) error {
	for _, k := range [...]error{ErrAuthFailed, ErrUnsupportedVersion, ErrTLS, ErrTimeout, ErrUnavailable} {
		if errors.Is(err, k) {
			return k
		}
	}
	return ErrUnavailable
}

func isNotHeld(err error) bool { return errors.Is(err, ErrNotHeld) }
