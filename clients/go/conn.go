package ticketing

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
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
	lastRecv  atomic.Int64 // time.Since(born) when the last frame arrived, ns

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
		hbTimer = time.NewTimer(c.opts.heartbeat)
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
		c.mu.Lock()
		if c.live != cn {
			c.mu.Unlock()
			return
		}
		buf := c.wbuf
		c.wbuf = spare[:0]
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

// heartbeat sends a PING when nothing has arrived for the heartbeat interval, and fails the
// connection when a PING stays unanswered for the request timeout. It returns when to check
// again, or false when the connection is gone.
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
		waited := now.Sub(cn.hbSent)
		if waited >= c.opts.requestTimeout {
			c.mu.Unlock()
			c.connDown(cn, &opError{kind: ErrTimeout, op: "heartbeat", msg: fmt.Sprintf("the server (%s) did not answer a PING within %v", cn.addr, c.opts.requestTimeout)}, downHeartbeat)
			return 0, false
		}
		c.mu.Unlock()
		return c.opts.requestTimeout - waited, true
	}
	if idle < c.opts.heartbeat {
		c.mu.Unlock()
		return c.opts.heartbeat - idle, true
	}
	hb := &call{ch: make(chan result, 1), req: wire.Request{Op: wire.OpPing}}
	hb.internal = func(result) {
		c.mu.Lock()
		if cn.hb == hb {
			cn.hb = nil
		}
		c.mu.Unlock()
	}
	cn.hb, cn.hbSent = hb, now
	c.sendLocked(hb)
	c.mu.Unlock()
	return min(c.opts.heartbeat, c.opts.requestTimeout), true
}

func (cn *conn) readLoop() {
	defer cn.wg.Done()
	br := bufio.NewReaderSize(cn.nc, 32<<10)
	buf := make([]byte, 0, 512)
	for {
		var r wire.Response
		var err error
		buf, err = readResponse(br, buf, wire.MaxDataLen, &r)
		if err != nil {
			if errors.Is(err, ErrProtocol) {
				cn.c.opts.logger.Error("ticketing: closing the connection", "addr", cn.addr, "err", err)
			} else if err == io.ErrUnexpectedEOF {
				err = io.EOF
			}
			cn.c.connDown(cn, &opError{kind: ErrConnectionLost, op: "read", msg: cn.addr, cause: err}, downDropped)
			return
		}
		cn.lastRecv.Store(int64(time.Since(cn.born)))
		cn.c.dispatch(cn, &r)
	}
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
