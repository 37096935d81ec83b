package server

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
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
// (tryFlush), otherwise by a writer goroutine started for the purpose (startWriter).
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
	inToFlush  bool // in Server.toFlush
	detached   bool // the session was told this connection is gone
	inToDetach bool // in Server.toDetach

	raw          syscall.RawConn // the TCP socket, for non-blocking writes; nil with TLS
	flushScratch []*conn         // reader-owned scratch for deliver

	output // output.go: the output buffer, grant marks, lost grants and the writer
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
		m, err := sockRead(int(fd), c.rbuf[c.roff:])
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

// readLoop reads until the connection fails, is to be detached, or sends a frame it cannot trust.
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

// reqBatchCap is the first capacity of a connection's batch of decoded requests (see serve).
const reqBatchCap = 36

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
		switch {
		case n < cap(c.reqs):
			c.reqs = c.reqs[:n+1]
		case n == 0:
			// A batch's first capacity: what one read of a client pipelining 32 requests
			// holds, so that a busy connection does not grow it by doubling from one (the
			// outgrown arrays were 117 KB at 64 busy connections until the first collection).
			c.reqs = make([]wire.Request, 1, reqBatchCap)
		default:
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
			c.resp = wire.AppendResponseString(answerBuf(c.resp), 0, wire.StatusInvalid, 0, 0, 0, wire.FieldLength, msg)
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
	c.s.sm.batch(c, c.reqs, fatal)
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
		c.resp = wire.AppendResponseString(answerBuf(c.resp), r.Op, wire.StatusInvalid, r.ID, 0, 0, field, msg)
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
		c.resp = wire.AppendResponseString(answerBuf(c.resp), r.Op, wire.StatusOK, r.ID, 0, 0, 0, "")
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
