package ticketing

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// conn is one handshaken connection. Whoever holds its write role writes the requests queued
// since the last write in one write (many goroutines' requests coalesce into one syscall): its
// writer goroutine, or a caller with nothing else in flight, which writes its own frame (no hop
// to the writer). Whoever holds its read role reads the answers and hands each to the call
// waiting on its request id: a caller that found nobody reading reads for itself until its own
// answer comes (leader/follower: no hop through a reader goroutine); otherwise, and while no call
// waits (pushes, heartbeats, a lost connection), its background reader goroutine. The writer
// goroutine sends the heartbeat. No mutex is held during I/O.
//
// With one caller, a call is then its own write and read, as a hand-written driver's: the
// goroutine hops of caller -> writer -> reader -> caller cost several wakeups of other threads
// per request (0.83x the harness's raw driver at one caller, 89 µs of client CPU per
// acquire+release pair against its 51; issue 31).
type conn struct {
	c    *Client
	nc   net.Conn
	addr string
	idx  int // index in the endpoint list, -1 for a leader hint outside it

	wake      chan struct{} // capacity 1: "the write buffer has data"
	turn      chan struct{} // capacity 1: "the background reader has the read role"
	done      chan struct{} // closed by close
	closeOnce sync.Once
	wg        sync.WaitGroup
	born      time.Time
	lastRecv  atomic.Int64 // time.Since(born) when the last bytes arrived, ns
	idle      *time.Timer  // hands the read role to the background reader (idleRead)

	// The read role's: only the goroutine holding it uses these.
	fr     frameReader
	resp   wire.Response
	batch  []answer
	readAt int64 // when the last bytes arrived: time.Since(born), ns (grantTime)

	// The write role's: only the goroutine holding it uses these.
	spare []byte // the buffer the next write takes (the one written last time)
	wdl   int64  // the write deadline set on nc: time.Since(born), ns

	// A plain TCP connection's socket, read and written with rawIO (sockio_linux.go); nil
	// where net.Conn's Read and Write are used (TLS, other systems). rfn and wfn are made once
	// (newConn) and work on the read role's rp/rn/rerrno and the write role's wp/wn/werrno,
	// so that a read or write allocates nothing.
	raw            syscall.RawConn
	rfn, wfn       func(fd uintptr) bool
	rp, wp         []byte
	rn, wn         int
	rerrno, werrno syscall.Errno

	// Guarded by Client.mu.
	hb        *call // the heartbeat PING in flight
	hbSent    time.Time
	reader    readRole // who holds the read role
	readCall  *call    // the call whose caller holds it (reader == readByCaller)
	writing   bool     // the write role is held (by the writer goroutine or a caller)
	idleArmed bool     // idle is set
}

// readRole says who reads a connection's answers.
type readRole uint8

const (
	readByNone   readRole = iota // nobody: no call waits (idle hands the role on later)
	readByBG                     // the background reader goroutine
	readByCaller                 // a caller, for itself (conn.readCall)
)

// idleRead is how long a connection may go unread once no call waits for an answer, before its
// background reader takes the read role back (to see pushes, heartbeats' answers and a lost
// connection). A caller that calls again within it reads for itself, without waking anyone;
// the timer that brings the background reader back is set at most once per idleRead.
const idleRead = 2 * time.Millisecond

func newConn(c *Client, nc net.Conn, addr string, idx int) *conn {
	cn := &conn{c: c, nc: nc, addr: addr, idx: idx, wake: make(chan struct{}, 1), turn: make(chan struct{}, 1),
		done: make(chan struct{}), born: time.Now(), reader: readByBG}
	cn.fr.br = bufio.NewReaderSize(cn, 32<<10)
	if tcp, ok := nc.(*net.TCPConn); ok && rawSockets {
		if raw, err := tcp.SyscallConn(); err == nil {
			cn.raw, cn.rfn, cn.wfn = raw, cn.readFD, cn.writeFD
		}
	}
	cn.idle = time.AfterFunc(time.Hour, cn.idleFired)
	cn.idle.Stop()
	return cn
}

// start runs the reader and the writer. The background reader holds the read role first.
func (cn *conn) start() {
	cn.wg.Add(2)
	go cn.readLoop()
	go cn.writeLoop()
}

// kick tells the writer that the write buffer has data.
func (cn *conn) kick() {
	select {
	case cn.wake <- struct{}{}:
	default:
	}
}

// close closes the socket (the reader and writer then exit).
func (cn *conn) close() {
	cn.closeOnce.Do(func() {
		close(cn.done)
		cn.idle.Stop()
		cn.nc.Close()
	})
}

// awaitedLocked is the number of calls on the connection that a caller waits for: the pending
// calls less the ACK and the heartbeat's PING, whose answers may wait for the next reader.
// c.mu must be held.
func (c *Client) awaitedLocked(cn *conn) int {
	n := c.pending.len()
	if c.ack != nil {
		n--
	}
	if cn.hb != nil {
		n--
	}
	return n
}

// bgReadLocked gives the read role, which nobody holds, to the background reader. c.mu must be
// held.
func (cn *conn) bgReadLocked() {
	cn.reader = readByBG
	select {
	case cn.turn <- struct{}{}:
	default:
	}
}

// ensureReaderLocked makes sure someone reads cn when a request was queued that nobody will
// read for (a heartbeat, a CANCEL). c.mu must be held.
func (c *Client) ensureReaderLocked() {
	if cn := c.live; cn != nil && cn.reader == readByNone {
		cn.bgReadLocked()
	}
}

// releaseReadLocked ends the read role of its holder: the background reader takes it at once if
// a caller waits for an answer, else after idleRead (unless a caller takes it first).
// c.mu must be held.
func (c *Client) releaseReadLocked(cn *conn) {
	cn.reader, cn.readCall = readByNone, nil
	switch {
	case c.live != cn:
		// Gone: nothing more to read (the reader exits when cn is closed).
	case c.awaitedLocked(cn) > 0:
		cn.bgReadLocked()
	case !cn.idleArmed:
		cn.idleArmed = true
		cn.idle.Reset(c.opts.idleRead)
	}
}

// idleFired runs idleRead after the read role was released with no call waiting: if nobody has
// taken it since, the background reader does.
func (cn *conn) idleFired() {
	c := cn.c
	c.mu.Lock()
	cn.idleArmed = false
	if c.live == cn && cn.reader == readByNone {
		cn.bgReadLocked()
	}
	c.mu.Unlock()
}

// interruptLocked stops the Read of the caller of cl if it reads for itself (cl's result was
// just put on cl.ch, or its context is done): the Read fails with a deadline error, and the
// reader resets the deadline and looks at its call again (readOwn). c.mu must be held.
func (c *Client) interruptLocked(cl *call) {
	if cn := cl.readOn; cn != nil && cn.reader == readByCaller && cn.readCall == cl {
		cn.nc.SetReadDeadline(aLongTimeAgo)
	}
}

// aLongTimeAgo is a read deadline in the past: it stops a Read at once.
var aLongTimeAgo = time.Unix(1, 0)

// readInterrupted handles a read that failed: after an interruption (a deadline error; no other
// read deadline is ever set) it clears the deadline and reports true: the reader looks at its
// state again and reads on; for any other error it reports the connection lost and returns
// false.
func (cn *conn) readInterrupted(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c := cn.c
		c.mu.Lock()
		cn.nc.SetReadDeadline(time.Time{}) // (under c.mu: an interruption set after this stays set)
		c.mu.Unlock()
		return true
	}
	cn.readFailed(err)
	return false
}

// takeWriteLocked takes the write role and the queued frames, to write them with write, if the
// role is free and frames are queued; else it returns nil. c.mu must be held.
func (c *Client) takeWriteLocked(cn *conn) []byte {
	if cn.writing || len(c.wbuf) == 0 {
		return nil
	}
	cn.writing = true
	buf := c.wbuf
	c.wbuf = cn.spare[:0]
	cn.spare = nil
	c.delivered = 0
	return buf
}

// write writes buf, taken by takeWriteLocked, and gives the write role back; a failed write
// gives the connection up. The write deadline (the request timeout: a server that stops reading
// fails the connection) is moved only when less than the request timeout is left, to between
// one and one and a half request timeouts from now, not on every write (each move is a runtime
// timer's).
func (cn *conn) write(buf []byte) {
	c := cn.c
	if t := c.opts.requestTimeout; cn.wdl-int64(time.Since(cn.born)) < int64(t) {
		now := time.Now()
		cn.wdl = int64(now.Sub(cn.born) + t + t/2)
		cn.nc.SetWriteDeadline(now.Add(t + t/2))
	}
	var err error
	if cn.raw != nil {
		err = cn.writeRaw(buf)
	} else {
		_, err = cn.nc.Write(buf)
	}
	if cap(buf) > 1<<20 {
		buf = nil // do not keep a burst's buffer forever
	}
	c.mu.Lock()
	cn.writing, cn.spare = false, buf
	if len(c.wbuf) > 0 {
		// Queued during the write: their senders' kicks found the role taken.
		cn.kick()
	}
	c.mu.Unlock()
	if err != nil {
		c.connDown(cn, &opError{kind: ErrConnectionLost, op: "write", msg: cn.addr, cause: err}, downDropped)
	}
}

func (cn *conn) writeLoop() {
	defer cn.wg.Done()
	c := cn.c
	var beat <-chan time.Time
	var hbTimer *time.Timer
	if c.opts.heartbeat > 0 {
		hbTimer = time.NewTimer(min(c.opts.heartbeat, busyHeartbeat))
		defer hbTimer.Stop()
		beat = hbTimer.C
	}
	for {
		select {
		case <-cn.wake:
		case <-cn.done:
			return
		case <-beat:
			next, ok := cn.heartbeat()
			if !ok {
				return
			}
			hbTimer.Reset(next)
		}
		// When the reader has handed answers to several callers since the last write, let them
		// queue their next requests first, so that one write carries them all: yield until the
		// buffer stops growing (at most 8 times). Without this the writer, woken by the first
		// request, wrote almost every frame on its own (0.6-0.9 writes per acquire+release pair
		// with 64 in flight, 0.05 with it). With one call in flight there is nobody to wait for,
		// and a yield would only delay the write.
		//
		// Counted since the last write, not in the reader's last batch as it was: once answers
		// came one per read, every request went out on its own, the server answered each on its
		// own too, and the connection stayed that way (TestWritesStayBatchedUnderManyCallers:
		// 2,048 callers on one CPU, 0.6-1.6 writes per pair before, 0.01 after).
		c.mu.Lock()
		more := c.delivered > 1
		c.mu.Unlock()
		for n, i := -1, 0; more && i < 8; i++ {
			runtime.Gosched()
			c.mu.Lock()
			m := len(c.wbuf)
			c.mu.Unlock()
			if m == n {
				break
			}
			n = m
		}
		c.mu.Lock()
		if c.live != cn {
			c.mu.Unlock()
			return
		}
		// (nil: nothing queued, or a caller is writing; it kicks again when done if more came.)
		buf := c.takeWriteLocked(cn)
		c.mu.Unlock()
		if buf != nil {
			cn.write(buf)
		}
	}
}

// The heartbeat's timing (docs/clients.md, the heartbeat interval): while any request waits for
// an answer (a queued ACQUIRE included) a PING goes after busyHeartbeat of silence at most, and a
// PING unanswered for maxPingWait (at most) fails the connection, so that a frozen leader is
// left about 1 s after it froze and the session resumes on the next one.
const (
	busyHeartbeat = 250 * time.Millisecond
	maxPingWait   = 750 * time.Millisecond
)

// heartbeat sends a PING when nothing has arrived for the heartbeat interval (busyHeartbeat
// while requests wait), and gives the connection up when a PING stays unanswered for
// min(heartbeat, maxPingWait): the client reconnects and resumes, the calls in flight keep
// waiting. It returns when to check again (at most busyHeartbeat: a request made meanwhile
// shortens the interval), or false when the connection is gone.
func (cn *conn) heartbeat() (time.Duration, bool) {
	c := cn.c
	now := time.Now()
	idle := time.Since(cn.born) - time.Duration(cn.lastRecv.Load())
	c.mu.Lock()
	if c.live != cn {
		c.mu.Unlock()
		return 0, false
	}
	if cn.hb != nil {
		wait := min(c.opts.heartbeat, maxPingWait)
		waited := now.Sub(cn.hbSent)
		if waited >= wait {
			c.mu.Unlock()
			c.connDown(cn, &opError{kind: ErrTimeout, op: "heartbeat", msg: fmt.Sprintf("the server (%s) did not answer a PING within %v", cn.addr, wait)}, downSilent)
			return 0, false
		}
		c.mu.Unlock()
		return wait - waited, true
	}
	interval := c.opts.heartbeat
	if c.pending.len() > 0 {
		interval = min(interval, busyHeartbeat)
	}
	if idle < interval {
		c.mu.Unlock()
		return min(interval-idle, busyHeartbeat), true
	}
	hb := &call{ch: make(chan result, 1), req: wire.Request{Op: wire.OpPing}}
	hb.internal = func(result) {
		if cn.hb == hb {
			cn.hb = nil
		}
	}
	cn.hb, cn.hbSent = hb, now
	c.sendLocked(hb, 0)
	c.ensureReaderLocked()
	c.mu.Unlock()
	return min(c.opts.heartbeat, maxPingWait), true
}

// Read reads from the socket for the read role's buffer, and notes when bytes arrived (once per
// read, not per frame: a read usually brings many; on the monotonic clock alone, one clock read).
func (cn *conn) Read(p []byte) (int, error) {
	var n int
	var err error
	if cn.raw != nil {
		n, err = cn.readRaw(p)
	} else {
		n, err = cn.nc.Read(p)
	}
	if n > 0 {
		cn.readAt = int64(time.Since(cn.born))
		cn.lastRecv.Store(cn.readAt)
	}
	return n, err
}

// readRaw is Read on a plain TCP socket: what the socket has, waiting (with the read deadline)
// until it has something. Its answers are net.Conn's: io.EOF at the peer's close, a deadline
// error once the deadline passed (interruptLocked), a *net.OpError otherwise.
func (cn *conn) readRaw(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	cn.rp, cn.rn, cn.rerrno = p, 0, 0
	err := cn.raw.Read(cn.rfn)
	n, errno := cn.rn, cn.rerrno
	cn.rp = nil
	switch {
	case err != nil:
		return 0, err // past the deadline, or closed
	case errno != 0:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: cn.nc.LocalAddr(), Addr: cn.nc.RemoteAddr(), Err: os.NewSyscallError("read", errno)}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// readFD is readRaw's callback (false: nothing there yet, wait until the socket is readable).
func (cn *conn) readFD(fd uintptr) bool {
	for {
		n, errno := rawIO(sysRead, int(fd), cn.rp)
		switch errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		cn.rn, cn.rerrno = n, errno
		return true
	}
}

// writeRaw is Write on a plain TCP socket: all of buf, waiting (with the write deadline) while
// the socket is full.
func (cn *conn) writeRaw(buf []byte) error {
	cn.wp, cn.wn, cn.werrno = buf, 0, 0
	err := cn.raw.Write(cn.wfn)
	errno := cn.werrno
	cn.wp = nil
	if err == nil && errno != 0 {
		err = &net.OpError{Op: "write", Net: "tcp", Source: cn.nc.LocalAddr(), Addr: cn.nc.RemoteAddr(), Err: os.NewSyscallError("write", errno)}
	}
	return err
}

// writeFD is writeRaw's callback (false: the socket is full, wait until it is writable).
func (cn *conn) writeFD(fd uintptr) bool {
	for cn.wn < len(cn.wp) {
		n, errno := rawIO(sysWrite, int(fd), cn.wp[cn.wn:])
		switch errno {
		case 0:
			if n == 0 {
				cn.werrno = syscall.EIO // write(2) takes at least a byte of a non-empty buffer
				return true
			}
			cn.wn += n
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			cn.werrno = errno
			return true
		}
	}
	return true
}

// grantTime is when the bytes of the answer being handled arrived (readAt). The read role's
// holder calls it.
func (cn *conn) grantTime() time.Time { return cn.born.Add(time.Duration(cn.readAt)) }

// maxBatch bounds the answers a reader takes under one hold of Client.mu.
const maxBatch = 128

// readLoop is the background reader: it reads while it holds the read role (from the start,
// when a caller hands it on, and after idleRead with no call waiting), and gives the role up
// once it has handed out the one answer that a lone caller waited for, so that the caller's next
// call reads for itself.
func (cn *conn) readLoop() {
	defer cn.wg.Done()
	c := cn.c
	for {
		c.mu.Lock()
		for cn.reader != readByBG {
			c.mu.Unlock()
			select {
			case <-cn.turn:
			case <-cn.done:
				return
			}
			c.mu.Lock()
		}
		c.mu.Unlock()
		for {
			n, err := cn.readBatch()
			if err != nil {
				if cn.readInterrupted(err) {
					continue // (a stale interruption meant for a caller that read before)
				}
				return
			}
			if n != 1 {
				// n == 0: pushes, or answers to internal calls. n > 1: several callers were
				// just answered, and will call again together: their requests coalesce in the
				// writer, and their answers are best read here; a caller reading for itself
				// would send its request alone and be answered alone.
				continue
			}
			c.mu.Lock()
			if c.live == cn && c.awaitedLocked(cn) == 0 {
				c.releaseReadLocked(cn) // (only this goroutine takes the role from readByBG)
				c.mu.Unlock()
				break
			}
			c.mu.Unlock()
		}
	}
}

// readOwn reads for the caller of cl, which holds cn's read role (do), until cl's result is on
// cl.ch, ctx is done, or the connection fails; then it gives the role up. A result put on cl.ch
// by another goroutine (a request timeout, Close) and ctx's end interrupt its Read
// (interruptLocked).
func (c *Client) readOwn(ctx context.Context, cn *conn, cl *call) {
	done := ctx.Done()
	var stop func() bool
	if done != nil {
		cl.client = c
		stop = context.AfterFunc(ctx, cl.ctxDone)
	}
	for len(cl.ch) == 0 && (done == nil || ctx.Err() == nil) {
		if _, err := cn.readBatch(); err != nil && !cn.readInterrupted(err) {
			break // (the connection is given up: the call waits for the next one, or has failed)
		}
	}
	if stop != nil && !stop() {
		cl.keep = true // ctxDone runs, or ran: cl is not reused (putCall)
	}
	c.mu.Lock()
	cl.readOn = nil
	if cn.reader == readByCaller && cn.readCall == cl {
		c.releaseReadLocked(cn)
	}
	c.mu.Unlock()
}

// readBatch reads a frame (it may block) and handles it with the frames already buffered behind
// it: the answers to pending calls among them are taken under one hold of Client.mu, and handed
// to their callers after it; the rest (pushes, NOT_LEADER, ...) go through dispatch one by one,
// in order. It returns the number of answers handed to calls. Only the read role's holder calls
// it.
func (cn *conn) readBatch() (int, error) {
	c := cn.c
	r := &cn.resp
	if err := cn.fr.next(wire.MaxDataLen, r); err != nil {
		return 0, err
	}
	batch := cn.batch[:0]
	left := true // r holds a frame not yet handled
	c.mu.Lock()
	for {
		a, ok := c.answerLocked(cn, r)
		if !ok {
			break
		}
		if a.cl != nil {
			batch = append(batch, a)
		}
		left = false
		if len(batch) == maxBatch || !cn.fr.nextBuffered(r) {
			break
		}
		left = true
	}
	c.delivered += len(batch)
	c.mu.Unlock()
	for i := range batch {
		c.deliver(&batch[i])
		batch[i] = answer{}
	}
	cn.batch = batch[:0]
	if left {
		c.dispatch(cn, r)
	}
	return len(batch), nil
}

func (cn *conn) readFailed(err error) {
	if errors.Is(err, ErrProtocol) {
		cn.c.opts.logger.Error("ticketing: closing the connection", "addr", cn.addr, "err", err)
	} else if err == io.ErrUnexpectedEOF {
		err = io.EOF
	}
	cn.c.connDown(cn, &opError{kind: ErrConnectionLost, op: "read", msg: cn.addr, cause: err}, downDropped)
}

// frameReader reads response frames from br. A read that fails consumes nothing of a frame not
// all there yet, so that the next call resumes it: the read role's holder is interrupted with a
// read deadline (interruptLocked) and reads on after it, and the frame it was in must survive.
type frameReader struct {
	br      *bufio.Reader
	big     []byte // a frame longer than br's buffer: as much of it as has arrived
	bigSize int    // that frame's size; 0: none in progress
}

// next reads the next frame into r; r.Data aliases br's buffer or fr.big, valid until br is
// read again. maxData bounds the frame's data (a longer length field is rejected from its 4
// bytes alone). A frame that breaks PROTOCOL.md is ErrProtocol; a stream that ends inside a frame
// is io.ErrUnexpectedEOF, one that ends between frames io.EOF; another error of the reader is
// returned as it is, and the next call resumes the frame.
func (fr *frameReader) next(maxData int, r *wire.Response) error {
	br := fr.br
	if fr.bigSize == 0 {
		hdr, err := br.Peek(4)
		if err != nil {
			if err == io.EOF && len(hdr) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		size, _ := wire.FrameLen(hdr)
		if size < wire.HeaderSize {
			return fmt.Errorf("%w: frame length %d is below the header's 28", ErrProtocol, size-4)
		}
		if size > wire.HeaderSize+min(maxData, wire.MaxDataLen) {
			return fmt.Errorf("%w: frame length %d is above the limit of %d", ErrProtocol, size-4, wire.HeaderSize-4+min(maxData, wire.MaxDataLen))
		}
		if size <= br.Size() {
			b, err := br.Peek(size)
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
			if _, err := wire.DecodeResponse(b, maxData, r); err != nil {
				return fmt.Errorf("%w: %v", ErrProtocol, err)
			}
			br.Discard(size)
			return nil
		}
		fr.bigSize = size
		if cap(fr.big) < size {
			fr.big = make([]byte, 0, size)
		}
		fr.big = fr.big[:0]
	}
	for len(fr.big) < fr.bigSize {
		if br.Buffered() == 0 {
			if _, err := br.Peek(1); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
		b, _ := br.Peek(min(br.Buffered(), fr.bigSize-len(fr.big)))
		fr.big = append(fr.big, b...)
		br.Discard(len(b))
	}
	fr.bigSize = 0
	if _, err := wire.DecodeResponse(fr.big, maxData, r); err != nil {
		return fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return nil
}

// nextBuffered decodes the next frame into r if all of it is in br's buffer, without reading
// (so without blocking) and without copying it: r.Data aliases br's buffer, valid until br's next
// read. It returns false, having consumed nothing, when the frame is not all there, or is
// malformed (next then reads it and says what is wrong).
func (fr *frameReader) nextBuffered(r *wire.Response) bool {
	br := fr.br
	n := br.Buffered()
	if n < wire.HeaderSize {
		return false
	}
	b, _ := br.Peek(n)
	size, _ := wire.FrameLen(b)
	if size < wire.HeaderSize || size > n {
		return false
	}
	if _, err := wire.DecodeResponse(b[:size], wire.MaxDataLen, r); err != nil {
		return false
	}
	br.Discard(size)
	return true
}

// readResponse reads one response frame from br and decodes it into r (frameReader.next, for
// one frame: a frame cut by an error is not resumed); r.Data aliases br's buffer or the
// returned one (buf, grown as needed), valid until br is read again.
func readResponse(br *bufio.Reader, buf []byte, maxData int, r *wire.Response) ([]byte, error) {
	fr := frameReader{br: br, big: buf[:0]}
	err := fr.next(maxData, r)
	return fr.big, err
}
