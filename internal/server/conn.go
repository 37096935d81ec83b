package server

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/wire"
)

const readBufSize = 4 << 10 // grows to fit a larger frame, then shrinks back

// conn is one client connection past its handshake. Its reader goroutine validates every
// complete frame of a read, applies the valid ones as one batch, and flushes the answers with one
// write. Output for this connection produced by others (hand-offs, timeouts, pushes) is queued
// the same way and written by the goroutine that produced it when the socket takes it at once
// (tryFlush), otherwise by a writer goroutine started for the purpose (kick).
type conn struct {
	s     *Server
	nc    net.Conn
	tcp   *net.TCPConn // the socket under nc (TLS or not); nil for other transports
	id    uint64       // connection id, never 0
	owner locktable.Owner
	sid   [wire.SessionIDSize]byte
	hs    *pendingWelcome // the handshake's state until WELCOME (Server.mu)
	maxID uint64          // the highest request id read on this connection (the reader's)

	rbuf   []byte                // read buffer, owned by the reader goroutine; nil between frames (see read)
	rarr   *[readBufSize]byte    // the pooled array rbuf is, if it is one
	roff   int                   // readFD: where in rbuf to read
	rn     int                   // readFD: bytes read
	rerr   error                 // readFD: the read's error
	rfn    func(fd uintptr) bool // c.readFD, made once
	reqs   []wire.Request        // the batch being built, owned by the reader
	resp   []byte                // answers of the batch being applied; see commit
	grants []grantMark           // the grants in resp (Server.mu held)

	// Guarded by Server.mu.
	marked   bool // in Server.touched
	detached bool // the session was told this connection is gone
	doomedAt bool // in Server.doomed

	raw     syscall.RawConn // the TCP socket, for non-blocking writes; nil with TLS
	touched []*conn         // reader-owned scratch for deliver

	wmu  sync.Mutex            // held by the one goroutine writing to nc
	wbuf []byte                // what writeNow is writing (wmu)
	wn   int                   // how much of wbuf is written (wmu)
	wfn  func(fd uintptr) bool // c.writeFD, made once

	mu        sync.Mutex  // guards the fields below; never held during I/O
	out       []byte      // answers not yet written
	spare     []byte      // the other half of a double buffer, reused by flush
	closed    bool        // no more output is accepted
	failed    bool        // output overflowed or a write failed: the connection is doomed
	final     time.Time   // bound on the last writes (graceful shutdown); zero = WriteTimeout
	readUntil time.Time   // reads stop here (graceful shutdown, lost leadership); zero = none
	killFlag  bool        // the socket was closed at once (takeover, slow consumer)
	marks     []grantMark // the grants in out, in order
	spareMk   []grantMark // the other half of marks' double buffer
	lost      []uint64    // request ids of grants dropped unwritten, for Server.reportLost

	writer  atomic.Bool    // a writer goroutine (see kick) is running
	writers sync.WaitGroup // the writer goroutine; Add only under mu while !closed, so close can Wait
}

// grantMark is a grant's answer in an output buffer: the frame ends at byte end. A grant whose
// frame was not wholly handed to the socket when the connection failed never reached the client
// (PROTOCOL.md: such a grant is revocable); one that was may have.
type grantMark struct {
	end int
	id  uint64
}

func newConn(s *Server, nc net.Conn, tcp *net.TCPConn) *conn {
	c := &conn{
		s:   s,
		nc:  nc,
		tcp: tcp,
	}
	if _, isTCP := nc.(*net.TCPConn); isTCP {
		c.raw, _ = tcp.SyscallConn()
		c.wfn = c.writeFD
		c.rfn = c.readFD
	}
	return c
}

// readBufs lends read buffers to the connections that are reading. A plain TCP connection waits
// for its next request holding none (read): a lock service's clients are mostly idle, and a
// buffer each was 4 KiB of the about 10 KiB an idle connection costs.
var readBufs = sync.Pool{New: func() any { return new([readBufSize]byte) }}

// takeRbuf makes rbuf a pooled buffer.
func (c *conn) takeRbuf() {
	c.rarr = readBufs.Get().(*[readBufSize]byte)
	c.rbuf = c.rarr[:]
}

// dropRbuf lets go of rbuf (back to the pool if it came from there). Nothing may refer to it
// any more: serve drops its key views before it returns.
func (c *conn) dropRbuf() {
	if c.rarr != nil {
		readBufs.Put(c.rarr)
	}
	c.rarr, c.rbuf = nil, nil
}

// read reads into rbuf after its first n bytes. A TCP connection waits for readability without a
// buffer and takes one only when bytes are there (readFD); a TLS one reads through its
// tls.Conn, which needs the buffer while it waits.
func (c *conn) read(n int) (int, error) {
	if c.raw == nil {
		if c.rbuf == nil {
			c.takeRbuf()
		}
		return c.nc.Read(c.rbuf[n:])
	}
	c.roff, c.rn, c.rerr = n, 0, nil
	if err := c.raw.Read(c.rfn); err != nil {
		return 0, err // closed, or past the read deadline
	}
	return c.rn, c.rerr
}

// readFD is read's callback: it reads what the socket has (false: nothing yet, wait until it
// is readable, holding no buffer when no partial frame is kept).
func (c *conn) readFD(fd uintptr) bool {
	if c.rbuf == nil {
		c.takeRbuf()
	}
	for {
		m, err := syscall.Read(int(fd), c.rbuf[c.roff:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			if c.roff == 0 {
				c.dropRbuf()
			}
			return false
		case err != nil:
			c.rerr = err
		case m == 0:
			c.rerr = io.EOF
		default:
			c.rn = m
		}
		return true
	}
}

// readLoop reads until the connection fails, is doomed, or sends a frame it cannot trust.
func (c *conn) readLoop() {
	s := c.s
	n := 0 // bytes of rbuf in use
	defer c.dropRbuf()
	for {
		m, err := c.read(n)
		n += m
		if n > 0 && m > 0 {
			off, fatal := c.serve(c.rbuf[:n])
			c.flush()
			if fatal || c.isFailed() {
				if fatal {
					c.drainAndClose()
				}
				return
			}
			// Keep the partial frame at the front; grow the buffer if that frame is larger.
			n = copy(c.rbuf, c.rbuf[off:n])
			if size, err := wire.FrameLen(c.rbuf[:n]); err == nil && size > len(c.rbuf) {
				nb := make([]byte, size)
				copy(nb, c.rbuf[:n])
				c.dropRbuf()
				c.rbuf = nb
			} else if n == 0 && (c.raw != nil || len(c.rbuf) > readBufSize) {
				c.dropRbuf() // between frames: back to the pool (a one-off large frame's memory is let go)
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.ECONNRESET) {
				s.log.Debug("read failed", "conn", c.id, "err", err)
			}
			return
		}
	}
}

// serve runs the request path on the complete frames in b: validate each (answering invalid
// requests and PING at once), batch the valid ones, apply the batch, route the outputs. It
// returns how many bytes it consumed; fatal means the stream cannot be trusted any more.
func (c *conn) serve(b []byte) (off int, fatal bool) {
	c.reqs = c.reqs[:0]
	for off < len(b) {
		// Decode straight into the batch's next slot (a Request decoded elsewhere and appended
		// would be copied through the stack); a frame that does not join the batch gives the
		// slot back.
		n := len(c.reqs)
		if n < cap(c.reqs) {
			c.reqs = c.reqs[:n+1]
		} else {
			c.reqs = append(c.reqs, wire.Request{})
		}
		req := &c.reqs[n]
		size, err := wire.DecodeRequest(b[off:], wire.MaxKeyLen, req)
		if err != nil {
			*req = wire.Request{}
			c.reqs = c.reqs[:n]
		}
		if err == wire.ErrShort {
			break
		}
		if err != nil {
			msg := wire.MsgLength
			if err == wire.ErrTooLarge {
				msg = wire.MsgTooLarge
			}
			c.resp = wire.AppendResponseString(c.resp, 0, wire.StatusInvalid, 0, 0, 0, wire.FieldLength, msg)
			c.s.metrics.answerLocal(0, wire.StatusInvalid)
			fatal = true
			break
		}
		off += size
		if !c.validate(req) {
			*req = wire.Request{}
			c.reqs = c.reqs[:n]
		}
	}
	c.s.apply(c, c.reqs, fatal)
	for k := range c.reqs {
		if c.reqs[k].Key != nil {
			c.reqs[k].Key = nil // drop the key views into rbuf (the one reference: slots are rewritten whole)
		}
	}
	return off, fatal
}

// validate makes the connection-local checks of PROTOCOL.md ("Requests": flags, request id,
// op, key length, lease range, token) and answers PING. It reports whether the request goes on
// to the table.
func (c *conn) validate(r *wire.Request) bool {
	cfg := &c.s.cfg
	bad := func(field uint32, msg string) bool {
		c.s.metrics.answerLocal(r.Op, wire.StatusInvalid)
		c.resp = wire.AppendResponseString(c.resp, r.Op, wire.StatusInvalid, r.ID, 0, 0, field, msg)
		return false
	}
	if r.Flags != 0 {
		return bad(wire.FieldFlags, wire.MsgFlags)
	}
	if r.ID == 0 || r.ID == math.MaxUint64 {
		// 2^64-1 is reserved: a session whose highest id reached it could send nothing new.
		return bad(wire.FieldRequestID, wire.MsgRequestID)
	}
	// PING is answered here, not by the table: it is checked against the ids this connection
	// has carried (PROTOCOL.md, "Request ids"), the one id rule it can follow without the table.
	prevMax := c.maxID
	c.maxID = max(c.maxID, r.ID)
	keyed, leased, tokened := false, false, false
	switch r.Op {
	case wire.OpAcquire:
		keyed, leased = true, true
	case wire.OpRelease:
		keyed, tokened = true, true
	case wire.OpExtend:
		keyed, leased, tokened = true, true, true
	case wire.OpCancel:
		tokened = true
	case wire.OpInspect:
		keyed = true
	case wire.OpAck:
	case wire.OpPing:
		if r.ID <= prevMax {
			return bad(wire.FieldRequestID, wire.MsgPingID)
		}
		c.s.metrics.answerLocal(wire.OpPing, wire.StatusOK)
		c.resp = wire.AppendResponseString(c.resp, r.Op, wire.StatusOK, r.ID, 0, 0, 0, "")
		return false
	default:
		return bad(wire.FieldOp, wire.MsgOp)
	}
	if keyed && len(r.Key) == 0 {
		return bad(wire.FieldKey, wire.MsgKeyEmpty)
	}
	if keyed && len(r.Key) > cfg.MaxKeyLen {
		// The limit in the message: a client shows it as it is (an error path: it may allocate).
		return bad(wire.FieldKey, fmt.Sprintf(wire.MsgKeyTooLong, len(r.Key), cfg.MaxKeyLen))
	}
	if leased {
		d := time.Duration(r.Lease) * time.Millisecond
		if d < cfg.MinLease || d > cfg.MaxLease {
			return bad(wire.FieldLease, fmt.Sprintf(wire.MsgLeaseRange, r.Lease, shortDuration(cfg.MinLease), shortDuration(cfg.MaxLease)))
		}
		c.s.noteLease(d)
	}
	if tokened && r.Token == 0 {
		return bad(wire.FieldToken, wire.MsgToken)
	}
	if !keyed {
		r.Key = nil
	}
	return true
}

// shortDuration writes d as people write limits: "1 ms", "300 ms", "1 h", "90 s".
func shortDuration(d time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "min"}, {time.Second, "s"}} {
		if d >= u.d && d%u.d == 0 {
			return fmt.Sprintf("%d %s", d/u.d, u.name)
		}
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}

// push queues a frame that the table produced for c (not the connection whose batch is
// running) while Server.mu is held. It reports whether the frame was queued: a doomed or closed
// connection takes nothing (its output is capped), and a frame that overflows the output limit
// dooms the connection and is dropped with everything queued.
func (c *conn) push(r *wire.Response, grant bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.failed {
		return false
	}
	c.out = wire.AppendResponse(c.out, r)
	if c.checkOverflow() {
		return false
	}
	if grant {
		c.marks = append(c.marks, grantMark{len(c.out), r.ID})
	}
	return true
}

// commit moves the batch's answers from resp to out: one lock per batch, not one per answer.
// Server.mu must be held (lock order: Server.mu, then conn.mu), so no later output for c can
// overtake them. It reports false when the answers were dropped (the connection is doomed).
func (c *conn) commit() bool {
	if len(c.resp) == 0 {
		return true
	}
	c.mu.Lock()
	ok := !c.closed && !c.failed
	base := len(c.out)
	switch {
	case !ok:
	case base == 0:
		c.out, c.resp = c.resp, c.out
	default:
		c.out = append(c.out, c.resp...)
	}
	if ok && c.checkOverflow() {
		ok = false
	}
	if ok {
		for _, g := range c.grants {
			c.marks = append(c.marks, grantMark{base + g.end, g.id})
		}
	}
	c.mu.Unlock()
	c.resp = c.resp[:0]
	return ok
}

// checkOverflow dooms a client that is not reading its answers: its socket is closed at once
// (nothing more is queued or written; the queued bytes are dropped) and its session is detached
// before Server.mu is released. It reports whether it did. c.mu and Server.mu must be held.
func (c *conn) checkOverflow() bool {
	if len(c.out) <= c.s.cfg.MaxOutput || c.failed {
		return false
	}
	c.failed = true
	c.s.metrics.slowConsumer()
	c.s.log.Warn("closing slow consumer", "conn", c.id, "queued_bytes", len(c.out))
	c.killLocked()
	c.s.doom(c)
	return true
}

// killLocked closes the socket at once, dropping unsent and unread bytes (RST). c.mu must be held.
func (c *conn) killLocked() {
	if c.killFlag {
		return
	}
	c.killFlag = true
	c.closed = true
	c.dropOutLocked()
	if c.tcp != nil {
		c.tcp.SetLinger(0)
		c.tcp.Close() // not nc.Close: a TLS close would try to write an alert
	} else {
		c.nc.Close()
	}
}

// dropOutLocked discards the unwritten output of a connection that will write no more; its
// grants are lost. c.mu must be held.
func (c *conn) dropOutLocked() {
	for _, m := range c.marks {
		c.lost = append(c.lost, m.id)
	}
	c.marks = c.marks[:0]
	c.out = nil
}

// loseUnwritten records the grants of a buffer whose write stopped after n bytes: a grant
// whose frame ends past n never reached the client. c.mu must be held.
func (c *conn) loseUnwritten(marks []grantMark, n int) {
	for _, m := range marks {
		if m.end > n {
			c.lost = append(c.lost, m.id)
		}
	}
}

func (c *conn) hasLost() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.lost) > 0
}

// kill closes the socket at once (a newer connection took the session over, or shutdown ran
// out of time).
func (c *conn) kill() {
	c.mu.Lock()
	c.killLocked()
	c.mu.Unlock()
}

// kick makes sure a goroutine writes what is queued: it starts one unless one is running. A
// connection has no writer goroutine while it has nothing to write.
func (c *conn) kick() {
	if !c.writer.CompareAndSwap(false, true) {
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.writer.Store(false)
		return
	}
	c.writers.Add(1)
	c.mu.Unlock()
	go c.writeOut()
}

// writeOut is the writer goroutine started by kick.
func (c *conn) writeOut() {
	defer c.writers.Done()
	for {
		c.flush()
		c.writer.Store(false)
		// Output queued after flush looked and before the flag was cleared would be stranded.
		c.mu.Lock()
		more := len(c.out) > 0 && !c.closed && !c.failed
		c.mu.Unlock()
		if !more || !c.writer.CompareAndSwap(false, true) {
			return
		}
	}
}

func (c *conn) isFailed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed
}

// writeDeadline bounds one write: the write timeout, or the shutdown's final deadline (final;
// read under c.mu).
func (c *conn) writeDeadline(final time.Time) time.Time {
	d := time.Now().Add(c.s.cfg.WriteTimeout)
	if !final.IsZero() && final.Before(d) {
		d = final
	}
	return d
}

// flush writes everything queued, looping until nothing is left. wmu serialises writers (the
// reader after a batch, the writer goroutine after a kick, close); the state mutex mu is never
// held during the write. A write that fails or times out dooms the connection: its socket is
// closed at once and the reader (which detaches the session) stops.
//
// On a plain TCP socket the bytes go first to a non-blocking write, which takes them all unless
// the socket buffer is full; only the rest is written under a deadline (setting and clearing a
// deadline costs two runtime timer updates, once per batch otherwise).
func (c *conn) flush() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	for len(c.out) > 0 && !c.failed && !c.closed {
		buf, marks := c.out, c.marks
		c.out, c.marks = c.spare[:0], c.spareMk[:0]
		final := c.final
		c.mu.Unlock()
		n := 0
		var err error
		if c.raw != nil {
			n = c.writeNow(buf)
		}
		if n < len(buf) {
			c.nc.SetWriteDeadline(c.writeDeadline(final))
			var m int
			m, err = c.nc.Write(buf[n:])
			n += m
			if err == nil {
				c.nc.SetWriteDeadline(time.Time{}) // an expired deadline would stop tryFlush
			}
		}
		c.mu.Lock()
		if err != nil {
			c.failed = true
			c.loseUnwritten(marks, n)
			c.killLocked()
		}
		c.spareMk = marks[:0]
		if cap(buf) <= 64<<10 {
			c.spare = buf[:0]
		} else {
			c.spare = nil // do not keep a burst's memory
		}
	}
	c.mu.Unlock()
}

// writeNow writes as much of buf as the socket takes without waiting and returns how much that
// was (short on EAGAIN, EINTR or an error, which the caller's next write meets again). c.raw
// must be set; wmu must be held. It does not allocate: the callback is made once (newConn) and
// works on wbuf and wn.
func (c *conn) writeNow(buf []byte) int {
	c.wbuf, c.wn = buf, 0
	c.raw.Write(c.wfn)
	n := c.wn
	c.wbuf = nil
	return n
}

// writeFD is writeNow's callback.
func (c *conn) writeFD(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		m, err := syscall.Write(int(fd), c.wbuf[c.wn:])
		if m <= 0 || err != nil {
			break
		}
		c.wn += m
	}
	return true // never wait for the socket to become writable
}

// tryFlush writes what is queued for a connection on behalf of another goroutine (a releasing
// client's reader, the clock) without ever blocking it: a hand-off reaches the next holder
// without waking this connection's writer goroutine. It writes only if no other write is in
// progress and the socket takes the bytes at once; whatever is left goes to the writer goroutine.
func (c *conn) tryFlush() {
	if c.raw == nil || !c.wmu.TryLock() {
		c.kick()
		return
	}
	c.mu.Lock()
	buf := c.out
	if len(buf) == 0 || c.closed || c.failed {
		c.mu.Unlock()
		c.wmu.Unlock()
		return
	}
	marks := c.marks
	c.out, c.marks = c.spare[:0], c.spareMk[:0]
	c.mu.Unlock()
	n := c.writeNow(buf) // short: the socket is full (or failed); the writer goroutine takes over
	c.mu.Lock()
	if n < len(buf) && c.closed {
		// Killed meanwhile: nothing more is written.
		c.loseUnwritten(marks, n)
		c.spare, c.spareMk = buf[:0], marks[:0]
		c.mu.Unlock()
		c.wmu.Unlock()
		return
	}
	if n < len(buf) {
		// Put the rest in front of anything queued meanwhile, and let the writer finish.
		rest := append(make([]byte, 0, len(buf)-n+len(c.out)), buf[n:]...)
		var mk []grantMark
		for _, m := range marks {
			if m.end > n {
				mk = append(mk, grantMark{m.end - n, m.id})
			}
		}
		for _, m := range c.marks {
			mk = append(mk, grantMark{m.end + len(rest), m.id})
		}
		c.out = append(rest, c.out...)
		c.marks = mk
		c.spareMk = marks[:0]
		c.spare = buf[:0]
		c.mu.Unlock()
		c.wmu.Unlock()
		c.kick()
		return
	}
	c.spare = buf[:0]
	c.spareMk = marks[:0]
	c.mu.Unlock()
	c.wmu.Unlock()
}

// drainAndClose gives the peer a moment to read a final error answer, then closes.
func (c *conn) drainAndClose() {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.nc.SetReadDeadline(time.Now().Add(min(time.Second, c.s.cfg.HandshakeTimeout)))
	io.Copy(io.Discard, io.LimitReader(c.nc, 1<<20))
}

// stopReading ends a connection during graceful shutdown: reading stops at readUntil, and every
// later write is bounded by final.
func (c *conn) stopReading(readUntil, final time.Time) {
	c.mu.Lock()
	c.final = final
	c.readUntil = readUntil
	c.nc.SetReadDeadline(readUntil)
	c.mu.Unlock()
}

// close flushes what is queued (bounded by deadline), then releases the connection; no output
// is accepted after it.
func (c *conn) close(deadline time.Time) {
	c.mu.Lock()
	if c.final.IsZero() || deadline.Before(c.final) {
		c.final = deadline
	}
	c.mu.Unlock()
	c.flush()
	c.mu.Lock()
	if c.killFlag {
		c.mu.Unlock()
		c.writers.Wait()
		return
	}
	c.closed = true
	c.killFlag = true
	c.mu.Unlock()
	c.nc.Close()
	c.writers.Wait() // no writer starts after closed; one running ends with the closed socket
}
