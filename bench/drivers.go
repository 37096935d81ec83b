package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

const (
	leaseMs     = 30000 // every acquire in (a), (b), (c): 30 s, like SET ... PX 30000
	idleLeaseMs = 600000
)

// keyName is the key shape every system gets (and redis-benchmark's __rand_int__ expands to).
func keyName(prefix string, i int) []byte { return []byte(fmt.Sprintf("%s:%012d", prefix, i)) }

// slotKeys gives slot g of S slots the keys g, g+S, g+2S, ... below nkeys: no two in-flight
// requests ever touch the same key, so the run is uncontended.
func slotKeys(keys [][]byte, g, S int) [][]byte {
	var ks [][]byte
	for k := g; k < len(keys); k += S {
		ks = append(ks, keys[k])
	}
	return ks
}

// ignoreAfterStop turns the I/O error that ends a drain (deadline, closed connection) into nil.
func ignoreAfterStop(rc *runCtx, err error) error {
	if err != nil && rc.stop.Load() {
		var ne net.Error
		if errors.As(err, &ne) || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
	}
	return err
}

// ---------------------------------------------------------------------------------------------
// Ticketing (and the null server): pipelined acquire+release pairs on one connection.
// Every slot of the window is one lock user: ACQUIRE (wait 0, lease 30 s), and when it is
// granted RELEASE with the token it got, then the next key. One acquire+release pair counts as
// 2 operations. All answers that arrived in one read are handled, then the requests they caused
// go out in one write. The connection is one session: request ids increase in send order, and
// an answer finds its slot through a ring indexed by the low bits of its id; an ACK goes out
// after every ackEvery answers.

const (
	slotIdle = iota
	slotAcquiring
	slotReleasing
)

type tkSlot struct {
	keys  [][]byte
	ki    int
	state uint8
	sent  int64
	id    uint64 // the request id awaited
}

type tkPipe struct {
	nc    net.Conn
	r     *bufio.Reader
	sess  *session
	ack   acker
	slots []tkSlot
	owner []int32 // owner[id & mask]: the slot that sent request id
	mask  uint64
	wbuf  []byte
	prev  bool // the protocol before v1 final (system prev): no ACK
}

func newTkPipe(addr string, slotKeyLists [][][]byte) (*tkPipe, error) {
	nc, sess, err := dialTicketing(addr)
	if err != nil {
		return nil, err
	}
	return newTkPipeOn(nc, sess, slotKeyLists), nil
}

func newTkPipeOn(nc net.Conn, sess *session, slotKeyLists [][][]byte) *tkPipe {
	// The ring must outlast the oldest request in flight: with wait 0 the server answers in
	// order, so a few windows suffice; a wrapped entry is detected (the slot awaits another id).
	size := 4096
	for size < 256*len(slotKeyLists) {
		size *= 2
	}
	w := &tkPipe{nc: nc, r: bufio.NewReaderSize(nc, 64<<10), sess: sess, slots: make([]tkSlot, len(slotKeyLists)),
		owner: make([]int32, size), mask: uint64(size - 1)}
	for i, ks := range slotKeyLists {
		w.slots[i].keys = ks
	}
	w.wbuf = make([]byte, 0, len(w.slots)*(hdrLen+64)+hdrLen)
	return w
}

// newPrevPipe is newTkPipe for system prev: the same requests and answers, with the handshake
// of the protocol before v1 final and no ACK (that protocol stored no outcomes).
func newPrevPipe(addr string, slotKeyLists [][][]byte) (*tkPipe, error) {
	nc, err := dialPrev(addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	w := newTkPipeOn(nc, newSession(), slotKeyLists)
	w.prev = true
	return w, nil
}

func (w *tkPipe) close() { w.nc.Close() }

func (w *tkPipe) send(i int, now int64, op byte, token uint64, lease uint32) {
	s := &w.slots[i]
	s.sent = now
	s.id = w.sess.take()
	w.owner[s.id&w.mask] = int32(i)
	w.wbuf = appendRequest(w.wbuf, op, s.id, token, lease, 0, s.keys[s.ki])
}

func (w *tkPipe) acquire(i int, now int64) {
	w.slots[i].state = slotAcquiring
	w.send(i, now, opAcquire, 0, leaseMs)
}

func (w *tkPipe) release(i int, now int64, token uint64) {
	s := &w.slots[i]
	s.state = slotReleasing
	w.send(i, now, opRelease, token, 0)
	s.ki++
	if s.ki == len(s.keys) {
		s.ki = 0
	}
}

// lowestAwaited is the ACK's token: the lowest id still awaited, ACQUIREs not counted.
func (w *tkPipe) lowestAwaited() uint64 {
	low := w.sess.next + 1
	for i := range w.slots {
		if s := &w.slots[i]; s.state == slotReleasing && s.id < low {
			low = s.id
		}
	}
	return low
}

func (w *tkPipe) run(rc *runCtx, wi int) error {
	w.nc.SetDeadline(rc.deadline)
	now := nanotime()
	for i := range w.slots {
		w.acquire(i, now)
	}
	if _, err := w.nc.Write(w.wbuf); err != nil {
		return err
	}
	w.wbuf = w.wbuf[:0]
	active := len(w.slots)
	hist := rc.hists[wi]
	var acqHist *hdrhistogram.Histogram
	if rc.acqHists != nil {
		acqHist = rc.acqHists[wi]
	}
	var ops, errs int64
	var resp response
	var tnow int64
	for active > 0 {
		if w.r.Buffered() < hdrLen {
			tnow = 0 // the next answer needs a read: take the time after it
		}
		if err := readResponse(w.r, &resp); err != nil {
			rc.counts[wi].Store(ops)
			rc.errs[wi].Store(errs)
			return ignoreAfterStop(rc, err)
		}
		if tnow == 0 {
			tnow = nanotime()
		}
		w.ack.answers++
		switch {
		case resp.op == opAck && w.ack.answered(resp.id):
			if resp.status != stOK {
				return fmt.Errorf("ACK answered status %d", resp.status)
			}
		case resp.id == 0 && resp.op == opExpired:
			// a lease ran out (never with 30 s leases inside a point): nothing to do
		case resp.id == 0:
			return fmt.Errorf("push op %#x (status %d, detail %d) during the run", resp.op, resp.status, resp.detail)
		default:
			i := int(w.owner[resp.id&w.mask])
			s := &w.slots[i]
			if s.id != resp.id || s.state == slotIdle {
				return fmt.Errorf("answer with unknown request id %d (op %#x status %d)", resp.id, resp.op, resp.status)
			}
			if rc.measuring.Load() {
				hist.RecordValue(tnow - s.sent)
				if acqHist != nil && s.state == slotAcquiring {
					acqHist.RecordValue(tnow - s.sent)
				}
			}
			ops++
			stopping := rc.stop.Load()
			switch s.state {
			case slotAcquiring:
				if resp.status == stOK {
					w.release(i, tnow, resp.token)
					break
				}
				errs++
				if resp.status == stNotLeader || resp.status == stInvalid {
					return fmt.Errorf("ACQUIRE answered status %d (detail %d)", resp.status, resp.detail)
				}
				if stopping {
					s.state = slotIdle
					active--
				} else {
					w.acquire(i, tnow)
				}
			case slotReleasing:
				if resp.status != stOK {
					errs++
				}
				if stopping {
					s.state = slotIdle
					active--
				} else {
					w.acquire(i, tnow)
				}
			}
		}
		if w.r.Buffered() < hdrLen {
			if !w.prev && w.ack.due() {
				w.wbuf = w.ack.appendAck(w.wbuf, w.sess, w.lowestAwaited())
			}
			if len(w.wbuf) > 0 {
				if _, err := w.nc.Write(w.wbuf); err != nil {
					return ignoreAfterStop(rc, err)
				}
				w.wbuf = w.wbuf[:0]
			}
			rc.counts[wi].Store(ops)
			rc.errs[wi].Store(errs)
		}
	}
	rc.counts[wi].Store(ops)
	rc.errs[wi].Store(errs)
	return nil
}

// ---------------------------------------------------------------------------------------------
// Redis: the same slots with SET key tok NX PX 30000 as acquire and EVALSHA compare-and-delete
// as release. Redis answers in order, so a FIFO of slots matches answers to requests.
// In setnx mode (the redis-benchmark comparison) each slot just sends SET NX PX to a random key
// of the key space, whatever the answer: exactly redis-benchmark's command.

type rSlot struct {
	keys  [][]byte
	ki    int
	state uint8
	sent  int64
	tok   [16]byte
}

type redisPipe struct {
	c       *redisConn
	slots   []rSlot
	fifo    []int32
	head, n int
	wbuf    []byte
	sha     []byte
	lease   []byte
	ctr     uint64
	id      uint16
	setnx   bool     // fairness mode
	all     [][]byte // setnx mode: the whole key space
	rng     *rand.Rand
}

func newRedisPipe(addr string, id int, slotKeyLists [][][]byte, sha string, setnx bool, all [][]byte) (*redisPipe, error) {
	c, err := dialRedis(addr)
	if err != nil {
		return nil, err
	}
	w := &redisPipe{c: c, slots: make([]rSlot, len(slotKeyLists)), fifo: make([]int32, len(slotKeyLists)),
		sha: []byte(sha), lease: []byte(strconv.Itoa(leaseMs)), id: uint16(id), setnx: setnx, all: all,
		rng: rand.New(rand.NewPCG(uint64(id)+1, 42))}
	for i, ks := range slotKeyLists {
		w.slots[i].keys = ks
	}
	w.wbuf = make([]byte, 0, len(w.slots)*160)
	return w, nil
}

func (w *redisPipe) close() { w.c.Close() }

const hexdigits = "0123456789abcdef"

// newToken writes a token unique in this run: 4 hex digits of the connection, 12 of a counter.
func (w *redisPipe) newToken(t *[16]byte) {
	w.ctr++
	v := uint64(w.id)<<48 | w.ctr&(1<<48-1)
	for i := 15; i >= 0; i-- {
		t[i] = hexdigits[v&15]
		v >>= 4
	}
}

func (w *redisPipe) push(i int) {
	w.fifo[(w.head+w.n)%len(w.fifo)] = int32(i)
	w.n++
}

func (w *redisPipe) pop() int {
	i := w.fifo[w.head]
	w.head = (w.head + 1) % len(w.fifo)
	w.n--
	return int(i)
}

func (w *redisPipe) acquire(i int, now int64) {
	s := &w.slots[i]
	s.state = slotAcquiring
	s.sent = now
	w.newToken(&s.tok)
	key := s.keys[s.ki]
	if w.setnx {
		key = w.all[w.rng.IntN(len(w.all))]
	}
	w.wbuf = appendSetNX(w.wbuf, key, s.tok[:], w.lease)
	w.push(i)
}

func (w *redisPipe) release(i int, now int64) {
	s := &w.slots[i]
	s.state = slotReleasing
	s.sent = now
	w.wbuf = appendRelease(w.wbuf, w.sha, s.keys[s.ki], s.tok[:])
	w.push(i)
	s.ki++
	if s.ki == len(s.keys) {
		s.ki = 0
	}
}

func (w *redisPipe) run(rc *runCtx, wi int) error {
	w.c.nc.SetDeadline(rc.deadline)
	now := nanotime()
	for i := range w.slots {
		w.acquire(i, now)
	}
	if _, err := w.c.nc.Write(w.wbuf); err != nil {
		return err
	}
	w.wbuf = w.wbuf[:0]
	active := len(w.slots)
	hist := rc.hists[wi]
	var ops, errs int64
	var rp reply
	var tnow int64
	for active > 0 {
		if w.c.r.Buffered() == 0 {
			tnow = 0
		}
		if err := readReply(w.c.r, &rp); err != nil {
			rc.counts[wi].Store(ops)
			rc.errs[wi].Store(errs)
			return ignoreAfterStop(rc, err)
		}
		if tnow == 0 {
			tnow = nanotime()
		}
		if w.n == 0 {
			return errors.New("redis answered more than was asked")
		}
		i := w.pop()
		s := &w.slots[i]
		if rc.measuring.Load() {
			hist.RecordValue(tnow - s.sent)
			if rc.acqHists != nil && s.state == slotAcquiring {
				rc.acqHists[wi].RecordValue(tnow - s.sent)
			}
		}
		ops++
		if rp.kind == '-' {
			return fmt.Errorf("redis: %s", rp.str)
		}
		stopping := rc.stop.Load()
		switch {
		case w.setnx:
			if stopping {
				s.state = slotIdle
				active--
			} else {
				w.acquire(i, tnow)
			}
		case s.state == slotAcquiring:
			if rp.kind == '+' { // +OK: acquired
				w.release(i, tnow)
				break
			}
			errs++ // nil: someone holds it (never in an uncontended run)
			if stopping {
				s.state = slotIdle
				active--
			} else {
				w.acquire(i, tnow)
			}
		case s.state == slotReleasing:
			if rp.kind != ':' || rp.n != 1 {
				errs++
			}
			if stopping {
				s.state = slotIdle
				active--
			} else {
				w.acquire(i, tnow)
			}
		}
		if w.c.r.Buffered() == 0 && len(w.wbuf) > 0 {
			if _, err := w.c.nc.Write(w.wbuf); err != nil {
				return ignoreAfterStop(rc, err)
			}
			w.wbuf = w.wbuf[:0]
			rc.counts[wi].Store(ops)
			rc.errs[wi].Store(errs)
		}
	}
	rc.counts[wi].Store(ops)
	rc.errs[wi].Store(errs)
	return nil
}

// loadReleaseScript loads the compare-and-delete script and returns its SHA1.
func loadReleaseScript(addr string) (string, error) {
	c, err := dialRedis(addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.do("SCRIPT", "LOAD", releaseScript)
}

func redisFlush(addr string) error {
	c, err := dialRedis(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.do("FLUSHALL")
	return err
}

// ---------------------------------------------------------------------------------------------
// etcd: concurrency.Mutex Lock/Unlock. A Mutex call waits for its answer (it cannot be
// pipelined), so a "connection" here is one client (one gRPC connection) with one session, and
// the pipeline depth becomes that many goroutines on it, each locking its own keys.

type etcdPipe struct {
	cli   *clientv3.Client
	sess  *concurrency.Session
	slots [][]string // per goroutine: lock prefixes
	mu    sync.Mutex // guards the shared histogram
}

func newEtcdPipe(addr string, slotKeyLists [][][]byte) (*etcdPipe, error) {
	cli, err := newEtcdClient(addr)
	if err != nil {
		return nil, err
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	if err != nil {
		cli.Close()
		return nil, err
	}
	w := &etcdPipe{cli: cli, sess: sess, slots: make([][]string, len(slotKeyLists))}
	for i, ks := range slotKeyLists {
		for _, k := range ks {
			w.slots[i] = append(w.slots[i], "/bench/"+string(k))
		}
	}
	return w, nil
}

func (w *etcdPipe) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	w.sess.Orphan()
	w.cli.Revoke(ctx, w.sess.Lease())
	w.cli.Close()
}

func (w *etcdPipe) run(rc *runCtx, wi int) error {
	var wg sync.WaitGroup
	var firstErr error
	var emu sync.Mutex
	hist := rc.hists[wi]
	for _, keys := range w.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithDeadline(context.Background(), rc.deadline)
			defer cancel()
			for ki := 0; !rc.stop.Load(); ki = (ki + 1) % len(keys) {
				m := concurrency.NewMutex(w.sess, keys[ki])
				t0 := nanotime()
				err := m.Lock(ctx)
				t1 := nanotime()
				if err == nil {
					err = m.Unlock(ctx)
				}
				t2 := nanotime()
				if err != nil {
					rc.errs[wi].Add(1)
					if ctx.Err() != nil {
						return
					}
					emu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					emu.Unlock()
					continue
				}
				if rc.measuring.Load() {
					w.mu.Lock()
					hist.RecordValue(t1 - t0)
					hist.RecordValue(t2 - t1)
					if rc.acqHists != nil {
						rc.acqHists[wi].RecordValue(t1 - t0)
					}
					w.mu.Unlock()
				}
				rc.counts[wi].Add(2)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil && rc.errs[wi].Load() > rc.counts[wi].Load()/100+10 {
		return firstErr
	}
	return nil
}
