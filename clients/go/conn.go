package ticketing

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// conn is one handshaken connection. Its reader decodes answers and hands each to the call
// waiting on its request id; its writer writes whatever requests were queued since its last
// write in one write (many goroutines' requests coalesce into one syscall) and sends the
// heartbeat. No mutex is held during I/O.
type conn struct {
	c    *Client
	nc   net.Conn
	addr string
	idx  int // index in the endpoint list, -1 for a leader hint outside it

	wake      chan struct{} // capacity 1: "the write buffer has data"
	done      chan struct{} // closed by close
	closeOnce sync.Once
	wg        sync.WaitGroup
	born      time.Time
	lastRecv  atomic.Int64 // time.Since(born) when the last bytes arrived, ns
	readAt    time.Time    // when the last bytes arrived; the reader's own

	// Guarded by Client.mu.
	hb     *call // the heartbeat PING in flight
	hbSent time.Time
}

func newConn(c *Client, nc net.Conn, addr string, idx int) *conn {
	return &conn{c: c, nc: nc, addr: addr, idx: idx, wake: make(chan struct{}, 1), done: make(chan struct{}), born: time.Now()}
}

// start runs the reader and the writer.
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
		cn.nc.Close()
	})
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
	var spare []byte
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
		buf := c.wbuf
		c.wbuf = spare[:0]
		c.delivered = 0
		c.mu.Unlock()
		if len(buf) == 0 {
			spare = buf
			continue
		}
		cn.nc.SetWriteDeadline(time.Now().Add(c.opts.requestTimeout))
		if _, err := cn.nc.Write(buf); err != nil {
			c.connDown(cn, &opError{kind: ErrConnectionLost, op: "write", msg: cn.addr, cause: err}, downDropped)
			return
		}
		if cap(buf) > 1<<20 {
			buf = nil // do not keep a burst's buffer forever
		}
		spare = buf
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
	c.mu.Unlock()
	return min(c.opts.heartbeat, maxPingWait), true
}

// Read reads from the socket for readLoop's buffer, and notes when bytes arrived (once per read,
// not per frame: a read usually brings many).
func (cn *conn) Read(p []byte) (int, error) {
	n, err := cn.nc.Read(p)
	if n > 0 {
		cn.readAt = time.Now()
		cn.lastRecv.Store(int64(cn.readAt.Sub(cn.born)))
	}
	return n, err
}

// maxBatch bounds the answers the reader takes under one hold of Client.mu.
const maxBatch = 128

// readLoop reads the answers and hands them over. The answers to pending calls among the frames
// that one read brought are taken under one hold of Client.mu, and handed to their callers after
// it; the rest (pushes, NOT_LEADER, ...) go through dispatch one by one, in order.
func (cn *conn) readLoop() {
	defer cn.wg.Done()
	c := cn.c
	br := bufio.NewReaderSize(cn, 32<<10)
	buf := make([]byte, 0, 512)
	var batch []answer
	var r wire.Response
	for {
		// One frame; this may block, so without c.mu.
		var err error
		if buf, err = readResponse(br, buf, wire.MaxDataLen, &r); err != nil {
			cn.readFailed(err)
			return
		}
		left := true // r holds a frame not yet handled
		c.mu.Lock()
		for {
			a, ok := c.answerLocked(cn, &r)
			if !ok {
				break
			}
			if a.cl != nil {
				batch = append(batch, a)
			}
			left = false
			if len(batch) == maxBatch || !nextBuffered(br, &r) {
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
		batch = batch[:0]
		if left {
			c.dispatch(cn, &r)
		}
	}
}

func (cn *conn) readFailed(err error) {
	if errors.Is(err, ErrProtocol) {
		cn.c.opts.logger.Error("ticketing: closing the connection", "addr", cn.addr, "err", err)
	} else if err == io.ErrUnexpectedEOF {
		err = io.EOF
	}
	cn.c.connDown(cn, &opError{kind: ErrConnectionLost, op: "read", msg: cn.addr, cause: err}, downDropped)
}

// nextBuffered decodes the next frame into r if all of it is in br's buffer, without reading
// (so without blocking) and without copying it: r.Data aliases br's buffer, valid until br's next
// read. It returns false, having consumed nothing, when the frame is not all there, or is
// malformed (readResponse then reads it and says what is wrong).
func nextBuffered(br *bufio.Reader, r *wire.Response) bool {
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

// readResponse reads one response frame from br into buf (grown as needed) and decodes it into
// r; r.Data aliases the returned buffer. maxData bounds the frame's data (a longer length field
// is rejected from its 4 bytes alone). A frame that breaks PROTOCOL.md is ErrProtocol; a stream
// that ends inside a frame is io.ErrUnexpectedEOF, one that ends between frames io.EOF.
func readResponse(br *bufio.Reader, buf []byte, maxData int, r *wire.Response) ([]byte, error) {
	if cap(buf) < wire.HeaderSize {
		buf = make([]byte, 0, 512)
	}
	buf = buf[:4]
	if _, err := io.ReadFull(br, buf); err != nil {
		return buf, err
	}
	size, _ := wire.FrameLen(buf)
	if size < wire.HeaderSize {
		return buf, fmt.Errorf("%w: frame length %d is below the header's 28", ErrProtocol, size-4)
	}
	if size > wire.HeaderSize+min(maxData, wire.MaxDataLen) {
		return buf, fmt.Errorf("%w: frame length %d is above the limit of %d", ErrProtocol, size-4, wire.HeaderSize-4+min(maxData, wire.MaxDataLen))
	}
	if cap(buf) < size {
		nb := make([]byte, size)
		copy(nb, buf[:4])
		buf = nb
	}
	buf = buf[:size]
	if _, err := io.ReadFull(br, buf[4:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return buf, err
	}
	if _, err := wire.DecodeResponse(buf, maxData, r); err != nil {
		return buf, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return buf, nil
}
