package server

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// outState is where a connection's output is in its life.
type outState uint8

const (
	outOpen   outState = iota // output is queued and written
	outClosed                 // closed (close, a takeover, a stop): nothing more is queued or written
	outFailed                 // overflowed or a write failed: closed, and the connection is to be detached
)

// output is a connection's output side: what is queued for the socket, which of its frames are
// grants (to tell a grant that never left the server: Table.Undelivered), the grants lost
// unwritten, and the one writer at a time. Its methods are conn's (they need the socket).
//
// Locks: wmu is held by the one goroutine writing to the socket (the reader after its batch, a
// writer goroutine, close) and is the only mutex held across a socket write; mu guards the
// state below it and is never held during I/O. Order: wmu, Server.mu, mu (push and commit run
// under Server.mu, flush takes mu after wmu).
type output struct {
	wmu  sync.Mutex            // held by the one goroutine writing to nc
	wbuf []byte                // what writeNow is writing (wmu)
	wn   int                   // how much of wbuf is written (wmu)
	wfn  func(fd uintptr) bool // c.writeFD, made once

	mu        sync.Mutex  // guards the fields below; never held during I/O
	out       []byte      // answers not yet written
	spare     []byte      // the other half of a double buffer, reused by flush
	state     outState    // open until closed or failed; then no more output is accepted
	final     time.Time   // bound on the last writes (graceful shutdown); zero = WriteTimeout
	readUntil time.Time   // reads stop here (graceful shutdown, lost leadership); zero = none
	marks     []grantMark // the grants in out, in order
	spareMk   []grantMark // the other half of marks' double buffer
	lost      []uint64    // request ids of grants dropped unwritten, for Server.reportLost

	writer  atomic.Bool    // a writer goroutine (see startWriter) is running
	writers sync.WaitGroup // the writer goroutine; Add only under mu while open, so close can Wait
}

// push queues a frame that the table produced for c (not the connection whose batch is
// running) while Server.mu is held. It reports whether the frame was queued: a failed or closed
// connection takes nothing (its output is capped), and a frame that overflows the output limit
// fails the connection and is dropped with everything queued.
func (c *conn) push(r *wire.Response, grant bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != outOpen {
		return false
	}
	c.out = wire.AppendResponse(answerBuf(c.out), r)
	if c.checkOverflow() {
		return false
	}
	if grant {
		c.marks = append(c.marks, grantMark{len(c.out), r.ID})
	}
	return true
}

// answerBufCap is the capacity of the answer buffers a connection borrows (resp, out and the
// one being written): a window of up to 44 answers of wire.HeaderSize, what a client pipelining
// 32 requests gets at once. A busy connection's buffers grow to about this anyway; starting here
// rather than doubling up from 64 bytes leaves no outgrown arrays behind (at 64 busy connections
// they were 360 KB of garbage, resident until the first collection: issue 28).
const answerBufCap = 1408

// answerBufs lends answer buffers to the connections that have answers to write: an empty
// buffer goes back once the batch's answers are committed (resp) or written (out and the spare
// half), so a connection between batches holds none. Each connection kept three for good before
// (4.2 KB per connection answered once, 270 KB at 64 busy connections), and 64 connections'
// buffers took turns in the processor's caches; now, per processor, the buffer a flush gives
// back is the one the next batch takes.
var answerBufs = sync.Pool{New: func() any { return new([answerBufCap]byte) }}

// answerBuf gives an empty buffer a borrowed array of answerBufCap.
func answerBuf(b []byte) []byte {
	if cap(b) == 0 {
		return answerBufs.Get().(*[answerBufCap]byte)[:0]
	}
	return b
}

// giveBack returns an empty buffer's array to answerBufs if it is one of theirs (one that grew
// past answerBufCap is left to the collector) and returns nil. Nothing may refer to b any more.
func giveBack(b []byte) []byte {
	if cap(b) == answerBufCap {
		answerBufs.Put((*[answerBufCap]byte)(b[:answerBufCap]))
	}
	return nil
}

// commit moves the batch's answers from resp to out: one lock per batch, not one per answer.
// Server.mu must be held (lock order: Server.mu, then conn.mu), so no later output for c can
// overtake them. It reports false when the answers were dropped (the connection failed).
func (c *conn) commit() bool {
	if len(c.resp) == 0 {
		return true
	}
	c.mu.Lock()
	ok := c.state == outOpen
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
	c.resp = giveBack(c.resp) // empty: its answers were moved (or dropped)
	return ok
}

// checkOverflow fails a client that is not reading its answers: its socket is closed at once
// (nothing more is queued or written; the queued bytes are dropped) and its session is detached
// before Server.mu is released. It reports whether it did. c.mu and Server.mu must be held.
func (c *conn) checkOverflow() bool {
	if len(c.out) <= c.s.cfg.MaxOutput || c.state == outFailed {
		return false
	}
	c.s.metrics.slowConsumer()
	c.s.log.Warn("closing slow consumer", "conn", c.id, "queued_bytes", len(c.out))
	c.killLocked(outFailed)
	c.s.detachLater(c)
	return true
}

// killLocked closes the socket at once, dropping unsent and unread bytes (RST), and leaves the
// output in state to (outClosed, or outFailed: the connection is to be detached; a closed output
// whose last write then fails becomes failed too). c.mu must be held.
func (c *conn) killLocked(to outState) {
	if c.state != outOpen {
		if to == outFailed {
			c.state = outFailed
		}
		return
	}
	c.state = to
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
	c.killLocked(outClosed)
	c.mu.Unlock()
}

// startWriter makes sure a goroutine writes what is queued: it starts one unless one is running. A
// connection has no writer goroutine while it has nothing to write.
func (c *conn) startWriter() {
	if !c.writer.CompareAndSwap(false, true) {
		return
	}
	c.mu.Lock()
	if c.state != outOpen {
		c.mu.Unlock()
		c.writer.Store(false)
		return
	}
	c.writers.Add(1)
	c.mu.Unlock()
	go c.writeOut()
}

// writeOut is the writer goroutine started by startWriter.
func (c *conn) writeOut() {
	defer c.writers.Done()
	for {
		c.flush()
		c.writer.Store(false)
		// Output queued after flush looked and before the flag was cleared would be stranded.
		c.mu.Lock()
		more := len(c.out) > 0 && c.state == outOpen
		c.mu.Unlock()
		if !more || !c.writer.CompareAndSwap(false, true) {
			return
		}
	}
}

func (c *conn) isFailed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == outFailed
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
// reader after a batch, the writer goroutine (startWriter), close); the state mutex mu is never
// held during the write. A write that fails or times out fails the connection: its socket is
// closed at once and the reader (which detaches the session) stops.
//
// On a plain TCP socket the bytes go first to a non-blocking write, which takes them all unless
// the socket buffer is full; only the rest is written under a deadline (setting and clearing a
// deadline costs two runtime timer updates, once per batch otherwise).
func (c *conn) flush() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	for len(c.out) > 0 && c.state == outOpen {
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
			c.loseUnwritten(marks, n)
			c.killLocked(outFailed)
		}
		c.spareMk = marks[:0]
		if cap(buf) <= 64<<10 {
			c.spare = buf[:0]
		} else {
			c.spare = nil // do not keep a burst's memory
		}
	}
	c.idleLocked()
	c.mu.Unlock()
}

// idleLocked gives the answer buffers back once nothing is left to write. c.mu and wmu must be
// held.
func (c *conn) idleLocked() {
	if len(c.out) == 0 {
		c.out = giveBack(c.out)
		c.spare = giveBack(c.spare)
	}
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
		m, err := sockWrite(int(fd), c.wbuf[c.wn:])
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
		c.startWriter()
		return
	}
	c.mu.Lock()
	buf := c.out
	if len(buf) == 0 || c.state != outOpen {
		c.mu.Unlock()
		c.wmu.Unlock()
		return
	}
	marks := c.marks
	c.out, c.marks = c.spare[:0], c.spareMk[:0]
	c.mu.Unlock()
	n := c.writeNow(buf) // short: the socket is full (or failed); the writer goroutine takes over
	c.mu.Lock()
	if n < len(buf) && c.state != outOpen {
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
		c.startWriter()
		return
	}
	c.spare = buf[:0]
	c.spareMk = marks[:0]
	c.idleLocked()
	c.mu.Unlock()
	c.wmu.Unlock()
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
	if c.state != outOpen {
		c.mu.Unlock()
		c.writers.Wait()
		return
	}
	c.state = outClosed
	c.mu.Unlock()
	c.nc.Close()
	c.writers.Wait() // no writer starts after closed; one running ends with the closed socket
}
