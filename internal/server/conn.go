package server

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/internal/wire"
)

const readBufSize = 4 << 10 // grows to fit a larger frame, then shrinks back

// conn is one client connection. Its reader goroutine decodes and applies every complete frame of
// a read under Server.mu, queues the answers in out, and flushes them with one write. Answers for
// this connection produced by others (hand-offs, timeouts, expiry notices) are queued the same way
// and written by the goroutine that produced them when the socket takes them at once (tryFlush),
// otherwise by a writer goroutine started for the purpose (kick).
type conn struct {
	s  *Server
	nc net.Conn
	id locktable.Owner // set after the handshake; the table's owner id

	rbuf []byte // read buffer, owned by the reader goroutine
	resp []byte // answers of the batch being applied; see answer and commit

	// Guarded by Server.mu: pending counts this connection's queued acquires; marked says it
	// is in Server.touched.
	pending int
	marked  bool

	raw     syscall.RawConn // the TCP socket, for non-blocking writes; nil with TLS
	touched []*conn         // reader-owned scratch for deliver

	wmu sync.Mutex // held by the one goroutine writing to nc

	mu     sync.Mutex // guards the fields below; never held during I/O
	out    []byte     // answers not yet written
	spare  []byte     // the other half of a double buffer, reused by flush
	closed bool       // no more output is accepted
	failed bool       // output overflowed or a write failed: the reader must stop

	writer atomic.Bool // a writer goroutine (see kick) is running
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		s:    s,
		nc:   nc,
		rbuf: make([]byte, readBufSize),
		out:  make([]byte, 0, 1024),
		resp: make([]byte, 0, 1024),
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		c.raw, _ = tc.SyscallConn()
	}
	return c
}

// readLoop reads until the connection fails or sends a frame it cannot trust.
func (c *conn) readLoop() {
	s := c.s
	n := 0 // bytes of rbuf in use
	for {
		m, err := c.nc.Read(c.rbuf[n:])
		n += m
		if n > 0 && m > 0 {
			off, fatal := c.batch(c.rbuf[:n])
			c.flush()
			if fatal || c.isFailed() {
				c.drainAndClose()
				return
			}
			// Keep the partial frame at the front; grow the buffer if that frame is larger.
			n = copy(c.rbuf, c.rbuf[off:n])
			if size, err := wire.FrameLen(c.rbuf[:n]); err == nil && size > len(c.rbuf) {
				nb := make([]byte, size)
				copy(nb, c.rbuf[:n])
				c.rbuf = nb
			} else if n == 0 && len(c.rbuf) > readBufSize {
				c.rbuf = make([]byte, readBufSize) // give a one-off large frame's memory back
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("read failed", "conn", c.id, "err", err)
			}
			return
		}
	}
}

// batch applies every complete frame in b under one acquisition of Server.mu and returns how
// many bytes it consumed. fatal means the stream cannot be trusted any more: the caller closes.
func (c *conn) batch(b []byte) (off int, fatal bool) {
	s := c.s
	s.mu.Lock()
	now := s.now()
	s.table.Advance(now) // deadlines that passed are applied before any request sees the table
	s.dispatch(now, c)
	var req wire.Request
	for off < len(b) {
		size, err := wire.DecodeRequest(b[off:], wire.MaxKeyLen, &req)
		if err == wire.ErrShort {
			break
		}
		if err != nil {
			var id uint64
			if len(b)-off >= 16 {
				id = be64(b[off+8:])
			}
			op := wire.OpAcquire
			if len(b)-off > 4 {
				op = wire.Op(b[off+4])
			}
			msg := "frame length does not match its layout"
			if err == wire.ErrTooLarge {
				msg = "frame larger than the protocol's ceiling"
			}
			c.answer(op, wire.StatusInvalid, id, 0, 0, wire.FieldLength, msg)
			fatal = true
			break
		}
		c.handle(now, &req)
		off += size
	}
	s.rearm()
	c.touched = s.takeTouched(c.touched)
	c.commit() // under Server.mu, so no later event for c can overtake this batch's answers
	s.mu.Unlock()
	c.touched = deliver(c.touched)
	return off, fatal
}

func be64(b []byte) uint64 {
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// answer queues an answer of this connection's own batch in resp, without locking: only the
// reader touches resp, and only while it holds Server.mu (commit moves it to out before the
// reader lets go of Server.mu).
func (c *conn) answer(op wire.Op, st wire.Status, id, token uint64, lease, detail uint32, msg string) {
	c.resp = wire.AppendResponseString(c.resp, op, st, id, token, lease, detail, msg)
}

// push queues an answer that the table produced for c while Server.mu is held: into resp when c
// is the connection whose batch is running (cur), otherwise into out under c.mu.
func (c *conn) push(cur *conn, r *wire.Response) {
	if c == cur {
		c.resp = wire.AppendResponse(c.resp, r)
		return
	}
	c.mu.Lock()
	if !c.closed {
		c.out = wire.AppendResponse(c.out, r)
		c.checkOverflow()
	}
	c.mu.Unlock()
}

// commit moves the batch's answers from resp to out: one lock per batch, not one per answer.
// Server.mu must be held (lock order: Server.mu, then conn.mu).
func (c *conn) commit() {
	if len(c.resp) == 0 {
		return
	}
	c.mu.Lock()
	switch {
	case c.closed:
	case len(c.out) == 0:
		c.out, c.resp = c.resp, c.out
	default:
		c.out = append(c.out, c.resp...)
	}
	c.checkOverflow()
	c.mu.Unlock()
	c.resp = c.resp[:0]
}

// checkOverflow marks a client that is not reading its answers. c.mu must be held.
func (c *conn) checkOverflow() {
	if len(c.out) > c.s.cfg.MaxOutput && !c.failed {
		c.failed = true
		c.s.log.Warn("closing slow consumer", "conn", c.id, "queued_bytes", len(c.out))
		c.nc.SetReadDeadline(time.Now()) // stop the reader; it closes the connection
	}
}

// kick makes sure a goroutine writes what is queued: it starts one unless one is running. A
// connection has no writer goroutine while it has nothing to write.
func (c *conn) kick() {
	if c.writer.CompareAndSwap(false, true) {
		c.s.wg.Add(1)
		go c.writeOut()
	}
}

// writeOut is the writer goroutine started by kick.
func (c *conn) writeOut() {
	defer c.s.wg.Done()
	for {
		c.flush()
		c.writer.Store(false)
		// Answers queued after flush looked and before the flag was cleared would be stranded.
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

// flush writes everything queued, looping until nothing is left. wmu serialises writers (the
// reader after a batch, the writer goroutine after a kick, close); the state mutex mu is never
// held during the write.
func (c *conn) flush() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	for len(c.out) > 0 && !c.failed && !c.closed {
		buf := c.out
		c.out = c.spare[:0]
		c.mu.Unlock()
		c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
		_, err := c.nc.Write(buf)
		if err == nil {
			c.nc.SetWriteDeadline(time.Time{}) // an expired deadline would stop tryFlush
		}
		c.mu.Lock()
		if cap(buf) <= 64<<10 {
			c.spare = buf[:0]
		} else {
			c.spare = nil // do not keep a burst's memory
		}
		if err != nil {
			c.failed = true
			c.nc.SetReadDeadline(time.Now())
		}
	}
	c.mu.Unlock()
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
	c.out = c.spare[:0]
	c.mu.Unlock()
	n := 0
	c.raw.Write(func(fd uintptr) bool {
		for n < len(buf) {
			m, err := syscall.Write(int(fd), buf[n:])
			if m <= 0 || err != nil {
				break // EAGAIN (socket full), EINTR or a real error: the writer goroutine takes over
			}
			n += m
		}
		return true // never wait for the socket to become writable
	})
	c.mu.Lock()
	if n < len(buf) {
		// Put the rest in front of anything queued meanwhile, and let the writer finish.
		rest := append(make([]byte, 0, len(buf)-n+len(c.out)), buf[n:]...)
		c.out = append(rest, c.out...)
		c.spare = buf[:0]
		c.mu.Unlock()
		c.wmu.Unlock()
		c.kick()
		return
	}
	c.spare = buf[:0]
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

// shutdown ends a connection during graceful shutdown, after its answers were flushed.
func (c *conn) shutdown() {
	c.nc.SetReadDeadline(time.Now())
}

// close flushes what is queued (bounded by the write timeout), then releases the connection;
// no output is accepted after it.
func (c *conn) close() {
	c.flush()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	c.nc.Close()
}
