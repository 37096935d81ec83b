package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Workload (c): W workers, one key. Each worker loops: acquire, release at once, acquire again.
// Its counter counts acquisitions; its aux counter counts hand-offs (acquisitions that follow a
// grant to a different worker); its histogram records how long each acquisition waited (from the
// first attempt to the grant).

// granted notes a grant to worker wi: called by the holder while it holds the lock.
func granted(rc *runCtx, wi int, acq *int64, handoffs *int64) {
	*acq++
	if prev := rc.lastHolder.Swap(int64(wi)); prev != int64(wi) && prev >= 0 {
		*handoffs++
		rc.aux[wi].Store(*handoffs)
	}
	rc.counts[wi].Store(*acq)
}

const contendedKey = "contended:000000000001"

// Ticketing: ACQUIRE with wait without limit; the server queues it FIFO and answers at hand-off.
// Each worker is one session; it sends an ACK (and waits for its answer) after every ackEvery
// answers, between a release and the next acquire.
type tkContended struct {
	nc   net.Conn
	r    *bufio.Reader
	sess *session
	ack  acker
	buf  []byte
	key  []byte
}

func newTkContended(addr string) (*tkContended, error) {
	nc, sess, err := dialTicketing(addr)
	if err != nil {
		return nil, err
	}
	return &tkContended{nc: nc, r: bufio.NewReaderSize(nc, 4096), sess: sess, key: []byte(contendedKey)}, nil
}

func (w *tkContended) close() { w.nc.Close() }

// call sends one request and reads its answer (skipping EXPIRED pushes).
func (w *tkContended) call(resp *response, op byte, token uint64, lease, wait uint32, key []byte) error {
	id := w.sess.take()
	w.buf = appendRequest(w.buf[:0], op, id, token, lease, wait, key)
	if _, err := w.nc.Write(w.buf); err != nil {
		return err
	}
	for {
		if err := readResponse(w.r, resp); err != nil {
			return err
		}
		w.ack.answers++
		if resp.id == id {
			return nil
		}
		if resp.id != 0 || resp.op != opExpired {
			return fmt.Errorf("unexpected answer id %d op %#x status %d (awaiting %d)", resp.id, resp.op, resp.status, id)
		}
	}
}

func (w *tkContended) run(rc *runCtx, wi int) error {
	w.nc.SetDeadline(rc.deadline)
	var acq, handoffs, errs int64
	var resp response
	for !rc.stop.Load() {
		if w.ack.due() {
			// nothing is awaited: the ACK's token is the id it takes itself
			w.ack.answers = 0
			if err := w.call(&resp, opAck, w.sess.next+1, 0, 0, nil); err != nil {
				return ignoreAfterStop(rc, err)
			}
			if resp.status != stOK {
				return fmt.Errorf("ACK answered status %d", resp.status)
			}
		}
		t0 := nanotime()
		if err := w.call(&resp, opAcquire, 0, leaseMs, waitForever, w.key); err != nil {
			return ignoreAfterStop(rc, err)
		}
		if resp.status != stOK {
			errs++
			rc.errs[wi].Store(errs)
			continue
		}
		if rc.measuring.Load() {
			rc.hists[wi].RecordValue(nanotime() - t0)
		}
		granted(rc, wi, &acq, &handoffs)
		if err := w.call(&resp, opRelease, resp.token, 0, 0, w.key); err != nil {
			return ignoreAfterStop(rc, err)
		}
		if resp.status != stOK {
			errs++
			rc.errs[wi].Store(errs)
		}
	}
	return nil
}

// Redis: the usual retry loop: SET key tok NX PX 30000; when taken, sleep a random 1-10 ms and
// try again; release with the compare-and-delete script.
type redisContended struct {
	c     *redisConn
	sha   []byte
	lease []byte
	key   []byte
	buf   []byte
	id    int
	rng   *rand.Rand
}

func newRedisContended(addr, sha string, id int) (*redisContended, error) {
	c, err := dialRedis(addr)
	if err != nil {
		return nil, err
	}
	return &redisContended{c: c, sha: []byte(sha), lease: []byte(strconv.Itoa(leaseMs)), key: []byte(contendedKey),
		id: id, rng: rand.New(rand.NewPCG(uint64(id)+7, 99))}, nil
}

func (w *redisContended) close() { w.c.Close() }

func (w *redisContended) run(rc *runCtx, wi int) error {
	w.c.nc.SetDeadline(rc.deadline)
	var acq, handoffs, errs int64
	var rp reply
	var n uint64
	for !rc.stop.Load() {
		n++
		tok := []byte(fmt.Sprintf("w%03d-%012d", w.id, n))
		t0 := nanotime()
		got := false
		for !rc.stop.Load() {
			w.buf = appendSetNX(w.buf[:0], w.key, tok, w.lease)
			if _, err := w.c.nc.Write(w.buf); err != nil {
				return ignoreAfterStop(rc, err)
			}
			if err := readReply(w.c.r, &rp); err != nil {
				return ignoreAfterStop(rc, err)
			}
			if rp.kind == '-' {
				return fmt.Errorf("redis: %s", rp.str)
			}
			if rp.kind == '+' {
				got = true
				break
			}
			time.Sleep(time.Duration(1000+w.rng.IntN(9001)) * time.Microsecond)
		}
		if !got {
			break
		}
		if rc.measuring.Load() {
			rc.hists[wi].RecordValue(nanotime() - t0)
		}
		granted(rc, wi, &acq, &handoffs)
		w.buf = appendRelease(w.buf[:0], w.sha, w.key, tok)
		if _, err := w.c.nc.Write(w.buf); err != nil {
			return ignoreAfterStop(rc, err)
		}
		if err := readReply(w.c.r, &rp); err != nil {
			return ignoreAfterStop(rc, err)
		}
		if rp.kind != ':' || rp.n != 1 {
			errs++
			rc.errs[wi].Store(errs)
		}
	}
	return nil
}

// etcd: concurrency.Mutex on one prefix; each worker has its own client and session (two
// workers sharing a session would share the lock key and both think they hold it).
type etcdContended struct {
	cli  *clientv3.Client
	sess *concurrency.Session
}

func newEtcdContended(addr string) (*etcdContended, error) {
	cli, err := newEtcdClient(addr)
	if err != nil {
		return nil, err
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	if err != nil {
		cli.Close()
		return nil, err
	}
	return &etcdContended{cli: cli, sess: sess}, nil
}

func (w *etcdContended) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	w.sess.Orphan()
	w.cli.Revoke(ctx, w.sess.Lease())
	w.cli.Close()
}

func (w *etcdContended) run(rc *runCtx, wi int) error {
	ctx, cancel := context.WithDeadline(context.Background(), rc.deadline)
	defer cancel()
	m := concurrency.NewMutex(w.sess, "/bench/"+contendedKey)
	var acq, handoffs, errs int64
	for !rc.stop.Load() {
		t0 := nanotime()
		if err := m.Lock(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			errs++
			rc.errs[wi].Store(errs)
			continue
		}
		if rc.measuring.Load() {
			rc.hists[wi].RecordValue(nanotime() - t0)
		}
		granted(rc, wi, &acq, &handoffs)
		if err := m.Unlock(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			errs++
			rc.errs[wi].Store(errs)
		}
	}
	return nil
}
