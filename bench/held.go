package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"
)

// Workload (d), second half: take N distinct locks with a long lease and keep them, idle; then
// read the server's RSS. The connections stay open while the RSS is read.

const heldConns = 4
const heldWindow = 64

type heldResult struct {
	held     int64
	seconds  float64
	closeFns []func()
}

func (h *heldResult) closeAll() {
	for _, f := range h.closeFns {
		f()
	}
}

// holdTicketing acquires keys idle:0..n-1 over heldConns pipelined connections.
func holdTicketing(addr string, n int, timeout time.Duration) (*heldResult, error) {
	res := &heldResult{}
	deadline := time.Now().Add(timeout)
	t0 := time.Now()
	var held atomic.Int64
	var wg sync.WaitGroup
	errCh := make(chan error, heldConns)
	for c := 0; c < heldConns; c++ {
		nc, sess, err := dialTicketing(addr)
		if err != nil {
			res.closeAll()
			return nil, err
		}
		res.closeFns = append(res.closeFns, func() { nc.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc.SetDeadline(deadline)
			r := bufio.NewReaderSize(nc, 64<<10)
			var buf []byte
			var resp response
			var ack acker
			next, inflight := c, 0
			for next < n || inflight > 0 || ack.inflight != 0 {
				for inflight < heldWindow && next < n {
					buf = appendRequest(buf, opAcquire, sess.take(), 0, idleLeaseMs, 0, keyName("idle", next))
					next += heldConns
					inflight++
				}
				if ack.due() {
					// only ACQUIREs are awaited: the ACK's token is the id it takes itself
					buf = ack.appendAck(buf, sess, sess.next+1)
				}
				if len(buf) > 0 {
					if _, err := nc.Write(buf); err != nil {
						errCh <- err
						return
					}
					buf = buf[:0]
				}
				if err := readResponse(r, &resp); err != nil {
					errCh <- err
					return
				}
				ack.answers++
				if resp.op == opAck && ack.answered(resp.id) {
					continue
				}
				inflight--
				if resp.status == stOK {
					held.Add(1)
				}
			}
			nc.SetDeadline(time.Time{})
		}()
	}
	wg.Wait()
	res.seconds = time.Since(t0).Seconds()
	res.held = held.Load()
	close(errCh)
	if err := <-errCh; err != nil {
		return res, err
	}
	return res, nil
}

// holdRedis sets idle:0..n-1 with SET NX PX over heldConns pipelined connections.
func holdRedis(addr string, n int, timeout time.Duration) (*heldResult, error) {
	res := &heldResult{}
	deadline := time.Now().Add(timeout)
	t0 := time.Now()
	var held atomic.Int64
	var wg sync.WaitGroup
	errCh := make(chan error, heldConns)
	lease := []byte(strconv.Itoa(idleLeaseMs))
	for c := 0; c < heldConns; c++ {
		rc, err := dialRedis(addr)
		if err != nil {
			res.closeAll()
			return nil, err
		}
		res.closeFns = append(res.closeFns, func() { rc.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc.nc.SetDeadline(deadline)
			var buf []byte
			var rp reply
			next, inflight := c, 0
			for next < n || inflight > 0 {
				for inflight < heldWindow && next < n {
					tok := []byte(fmt.Sprintf("h%015d", next))
					buf = appendSetNX(buf, keyName("idle", next), tok, lease)
					next += heldConns
					inflight++
				}
				if len(buf) > 0 {
					if _, err := rc.nc.Write(buf); err != nil {
						errCh <- err
						return
					}
					buf = buf[:0]
				}
				if err := readReply(rc.r, &rp); err != nil {
					errCh <- err
					return
				}
				inflight--
				if rp.kind == '+' {
					held.Add(1)
				}
			}
			rc.nc.SetDeadline(time.Time{})
		}()
	}
	wg.Wait()
	res.seconds = time.Since(t0).Seconds()
	res.held = held.Load()
	close(errCh)
	if err := <-errCh; err != nil {
		return res, err
	}
	return res, nil
}

// holdEtcd locks /bench/idle:0..n-1 with concurrency.Mutex on one session, from 256 goroutines,
// until n are held or timeout passes (etcd commits every lock to its log; it may not get there).
func holdEtcd(addr string, n int, timeout time.Duration) (*heldResult, error) {
	res := &heldResult{}
	cli, err := newEtcdClient(addr)
	if err != nil {
		return nil, err
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(600))
	if err != nil {
		cli.Close()
		return nil, err
	}
	res.closeFns = append(res.closeFns, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		sess.Orphan()
		cli.Revoke(ctx, sess.Lease())
		cli.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	t0 := time.Now()
	var held atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	const goroutines = 256
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				k := int(next.Add(1) - 1)
				if k >= n {
					return
				}
				m := concurrency.NewMutex(sess, "/bench/"+string(keyName("idle", k)))
				if err := m.Lock(ctx); err == nil {
					held.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	res.seconds = time.Since(t0).Seconds()
	res.held = held.Load()
	return res, nil
}
