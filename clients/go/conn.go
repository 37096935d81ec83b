package ticketing

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
)

// conn is one handshaken connection. One reader goroutine decodes responses and hands each to
// the call waiting on its request id; one writer goroutine writes whatever requests were queued
// since its last write in a single write (many goroutines' requests coalesce into one syscall).
// No mutex is held during I/O.
type conn struct {
	c    *Client
	nc   net.Conn
	addr string
	idx  int // index in the endpoint list, -1 for a leader hint outside it

	wake chan struct{} // capacity 1: "wbuf has data"
	done chan struct{} // closed by fail
	wg   sync.WaitGroup

	mu       sync.Mutex       // guards the fields below; never held during I/O
	pending  map[uint64]*call // request id -> waiting call (nil: answer to be ignored)
	wbuf     []byte           // encoded requests not yet handed to the writer
	err      error            // why the connection failed; non-nil once failed
	detached bool             // no new calls; close once pending is empty
}

// call is one request waiting for its answer. Calls are pooled: a call goes back to the pool
// only after its waiter has received the answer (so the reader no longer references it).
type call struct {
	ch    chan result // capacity 1; the reader never blocks on it
	tSend time.Time   // monotonic time the request was queued (<= the time it was sent)
	lk    *Lock       // ACQUIRE: initialised by the reader when the answer is OK
}

// result is a decoded answer (data copied out of the read buffer) or the connection's error.
type result struct {
	status wire.Status
	token  uint64
	lease  uint32
	detail uint32
	data   []byte
	err    error
}

var callPool = sync.Pool{New: func() any { return &call{ch: make(chan result, 1)} }}

func getCall() *call { return callPool.Get().(*call) }

func putCall(cl *call) {
	cl.lk = nil
	callPool.Put(cl)
}

func newConn(c *Client, nc net.Conn, addr string, idx int) *conn {
	cn := &conn{
		c:       c,
		nc:      nc,
		addr:    addr,
		idx:     idx,
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		pending: make(map[uint64]*call),
	}
	cn.wg.Add(2)
	go cn.readLoop()
	go cn.writeLoop()
	return cn
}

// send queues req. With cl, the answer is delivered to cl.ch; without, it is dropped. It fails
// only when the connection has already failed.
func (cn *conn) send(req *wire.Request, cl *call) error {
	cn.mu.Lock()
	if cn.err != nil {
		err := cn.err
		cn.mu.Unlock()
		return err
	}
	if cl != nil {
		cl.tSend = time.Now()
	}
	cn.pending[req.ID] = cl
	cn.wbuf = wire.AppendRequest(cn.wbuf, req)
	cn.mu.Unlock()
	select {
	case cn.wake <- struct{}{}:
	default:
	}
	return nil
}

// forget drops the pending entry of id (its waiter gave up and nobody needs the answer).
func (cn *conn) forget(id uint64) {
	cn.mu.Lock()
	delete(cn.pending, id)
	cn.maybeCloseLocked()
	cn.mu.Unlock()
}

func (cn *conn) writeLoop() {
	defer cn.wg.Done()
	var spare []byte
	for {
		select {
		case <-cn.wake:
		case <-cn.done:
			return
		}
		cn.mu.Lock()
		buf := cn.wbuf
		cn.wbuf = spare[:0]
		cn.mu.Unlock()
		if len(buf) == 0 {
			spare = buf
			continue
		}
		cn.nc.SetWriteDeadline(time.Now().Add(cn.c.opts.writeTimeout))
		if _, err := cn.nc.Write(buf); err != nil {
			cn.fail(fmt.Errorf("%w (%s): write: %w", ErrConnectionLost, cn.addr, err))
			return
		}
		if cap(buf) > 1<<20 {
			buf = nil // do not keep a burst's buffer forever
		}
		spare = buf
	}
}

func (cn *conn) readLoop() {
	defer cn.wg.Done()
	br := bufio.NewReaderSize(cn.nc, 32<<10)
	buf := make([]byte, 0, 512)
	for {
		var r wire.Response
		var err error
		buf, err = readResponse(br, buf, &r)
		if err != nil {
			if errors.Is(err, ErrProtocol) {
				cn.c.opts.logger.Error("ticketing: closing the connection", "addr", cn.addr, "err", err)
			}
			cn.fail(fmt.Errorf("%w (%s): read: %w", ErrConnectionLost, cn.addr, err))
			return
		}
		cn.dispatch(&r)
	}
}

// readResponse reads one response frame from br into buf (grown as needed) and decodes it into
// r; r.Data aliases the returned buffer. A frame that breaks PROTOCOL.md is ErrProtocol.
func readResponse(br *bufio.Reader, buf []byte, r *wire.Response) ([]byte, error) {
	if cap(buf) < wire.HeaderSize {
		buf = make([]byte, 0, 512)
	}
	buf = buf[:4]
	if _, err := io.ReadFull(br, buf); err != nil {
		return buf, err
	}
	size, _ := wire.FrameLen(buf)
	if size < wire.HeaderSize {
		return buf, fmt.Errorf("%w: frame length %d below the header size", ErrProtocol, size-4)
	}
	if size > wire.HeaderSize+wire.MaxDataLen {
		return buf, fmt.Errorf("%w: frame length %d above the ceiling", ErrProtocol, size-4)
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
	if _, err := wire.DecodeResponse(buf, wire.MaxDataLen, r); err != nil {
		return buf, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return buf, nil
}

func (cn *conn) dispatch(r *wire.Response) {
	if r.Op == wire.OpExpired && r.ID == 0 {
		cn.c.expired(r.Token, r.Data)
		return
	}
	cn.mu.Lock()
	cl, ok := cn.pending[r.ID]
	if ok {
		delete(cn.pending, r.ID)
	}
	cn.mu.Unlock()
	if !ok {
		cn.c.opts.logger.Debug("ticketing: answer for no pending request", "addr", cn.addr, "op", r.Op.String(), "id", r.ID, "status", r.Status.String())
		return
	}
	if cl != nil {
		res := result{status: r.Status, token: r.Token, lease: r.Lease, detail: r.Detail}
		if len(r.Data) > 0 {
			res.data = append([]byte(nil), r.Data...)
		}
		if r.Op == wire.OpAcquire && r.Status == wire.StatusOK && cl.lk != nil {
			// Register before anyone can see the answer, so that an EXPIRED notice that follows
			// on this connection always finds the lock.
			cl.lk.granted(r.Token, r.Lease, r.Detail, cl.tSend)
		}
		cl.ch <- res
	}
	cn.mu.Lock()
	cn.maybeCloseLocked()
	cn.mu.Unlock()
}

// detach stops new calls from using cn; it closes once its pending calls are answered.
func (cn *conn) detach() {
	cn.mu.Lock()
	cn.detached = true
	cn.maybeCloseLocked()
	cn.mu.Unlock()
}

// maybeCloseLocked closes a detached connection without pending calls. cn.mu must be held.
func (cn *conn) maybeCloseLocked() {
	if cn.detached && len(cn.pending) == 0 && cn.err == nil {
		cn.err = fmt.Errorf("%w (%s): connection retired", ErrConnectionLost, cn.addr)
		close(cn.done)
		cn.nc.Close()
	}
}

// fail marks the connection failed with err, closes it, and fails every pending call with err.
func (cn *conn) fail(err error) {
	cn.mu.Lock()
	if cn.err != nil {
		cn.mu.Unlock()
		return
	}
	cn.err = err
	pending := cn.pending
	cn.pending = make(map[uint64]*call)
	close(cn.done)
	cn.mu.Unlock()
	cn.nc.Close()
	for _, cl := range pending {
		if cl != nil {
			cl.ch <- result{err: err}
		}
	}
	cn.c.connFailed(cn, err)
}

// failed reports whether the connection can no longer take calls.
func (cn *conn) usable() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err == nil && !cn.detached
}

// pendingCount is the number of requests awaiting an answer (for tests).
func (cn *conn) pendingCount() int {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return len(cn.pending)
}
