package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Failover: a client already connected to a 3-member cluster acquires (and releases) in a loop;
// the harness SIGKILLs the leader and measures the time from the kill to the client's next
// successful acquire. Then it restarts the killed member on its data directory, waits until it
// follows the leader again and the client has settled, and runs the next trial.

const (
	foLeaseMs        = 10000 // above a cluster's minimum lease (a failover's cost)
	foReconnectPause = 20 * time.Millisecond
	foHandshake      = 2 * time.Second
)

// foClient is the looping client of one system.
type foClient interface {
	run(stop *atomic.Bool) error
	// mark notes the kill about to happen and returns what success must follow.
	mark() int64
	// firstSuccessAfter returns the time of the first successful acquire after mark m (zero if none yet).
	firstSuccessAfter(m int64) time.Time
	successes() int64
	// leaderGuess is the member the client is connected to (-1: unknown).
	leaderGuess() int
	close()
}

// --- Ticketing ---------------------------------------------------------------------------------

// foTicketing is one session that acquires a new key (try once), releases it, and again. When
// its connection drops (or it is told NOT_LEADER or GOAWAY) it reconnects — the leader hint
// first, then every endpoint, foReconnectPause between rounds — resumes its session (same
// 16-byte id), and re-sends the request it awaited with its original id. It sends an ACK after
// every ackEvery answers. A success counts for a kill only if it came on a connection made after
// the kill.
type foTicketing struct {
	eps       []string
	sess      *session
	state     [16]byte
	haveState bool
	nc        net.Conn
	r         *bufio.Reader
	hint      string
	ack       acker
	buf, data []byte
	pend      *foReq
	n         int

	mu      sync.Mutex
	gen     int64               // connection generation (1 = the first connection)
	okByGen map[int64]time.Time // the first successful acquire on each connection
	oks     int64
	curAddr string
	lost    int64            // requests the session could not resume (none expected within the grace)
	resumed int64            // reconnects that resumed the session
	retried map[string]int64 // requests re-sent after a reconnect, by op and answer
	sentID  uint64           // the id last written (a request written again is a retry)
}

type foReq struct {
	op        byte
	id, token uint64
	key       []byte
}

func newFoTicketing(eps []string) (*foTicketing, error) {
	c := &foTicketing{eps: eps, sess: newSession(), okByGen: map[int64]time.Time{}, retried: map[string]int64{}}
	var stop atomic.Bool
	if err := c.connect(&stop, 30*time.Second); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *foTicketing) drop() {
	if c.nc != nil {
		c.nc.Close()
		c.nc = nil
	}
}

func (c *foTicketing) close() { c.drop() }

func (c *foTicketing) connect(stop *atomic.Bool, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for !stop.Load() && time.Now().Before(deadline) {
		order := append([]string(nil), c.eps...)
		if c.hint != "" {
			order = append([]string{c.hint}, order...)
		}
	round:
		for k := 0; k < len(order); k++ {
			addr := order[k]
			nc, w, err := dialSession(addr, c.sess.id, foHandshake)
			if err != nil {
				lastErr = err
				var nl *notLeaderError
				if errors.As(err, &nl) && nl.hint != "" && nl.hint != c.hint {
					c.hint = nl.hint // a new hint: try it next
					order = append(order[:k+1], append([]string{nl.hint}, order[k+1:]...)...)
				}
				continue round
			}
			if c.haveState && w.stateID != c.state {
				nc.Close()
				return fmt.Errorf("the cluster's state id changed after a failover (%x -> %x)", c.state, w.stateID)
			}
			c.state, c.haveState = w.stateID, true
			if w.resumed {
				c.mu.Lock()
				c.resumed++
				c.mu.Unlock()
			}
			if !w.resumed && c.gen > 0 {
				// The session ended: the request awaited is lost (it must not be re-sent).
				if c.pend != nil {
					c.mu.Lock()
					c.lost++
					c.mu.Unlock()
				}
				c.pend = nil
				c.ack = acker{}
			}
			c.nc, c.r, c.hint = nc, bufio.NewReaderSize(nc, 4096), ""
			c.mu.Lock()
			c.gen++
			c.curAddr = addr
			c.mu.Unlock()
			return nil
		}
		time.Sleep(foReconnectPause)
	}
	if stop.Load() {
		return nil
	}
	return fmt.Errorf("no leader accepted the session within %v: %v", timeout, lastErr)
}

func (c *foTicketing) run(stop *atomic.Bool) error {
	var resp response
	for !stop.Load() {
		if c.nc == nil {
			if err := c.connect(stop, 30*time.Second); err != nil {
				return err
			}
			if c.nc == nil {
				return nil // stopped
			}
		}
		if c.pend == nil {
			if c.ack.due() {
				id := c.sess.take() // nothing else is awaited: the ACK's token is its own id
				c.ack.inflight, c.ack.answers = id, 0
				c.pend = &foReq{op: opAck, id: id, token: id}
			} else {
				c.n++
				c.pend = &foReq{op: opAcquire, id: c.sess.take(), key: keyName("failover", c.n)}
			}
		}
		p := c.pend
		retry := c.sentID == p.id // sent before, on an earlier connection
		c.sentID = p.id
		var lease uint32
		if p.op == opAcquire {
			lease = foLeaseMs
		}
		c.buf = appendRequest(c.buf[:0], p.op, p.id, p.token, lease, 0, p.key)
		c.nc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.nc.Write(c.buf); err != nil {
			c.drop()
			continue
		}
		for c.nc != nil {
			var err error
			c.data, err = readResponseData(c.r, &resp, c.data)
			if err != nil {
				c.drop()
				break
			}
			c.ack.answers++
			if resp.id == 0 {
				if resp.op == opGoaway {
					c.hint = string(c.data)
					c.drop()
				}
				continue // EXPIRED: not for these short-lived locks
			}
			if resp.id != p.id {
				continue // an answer for an id no longer awaited (an original and its retry)
			}
			break
		}
		if c.nc == nil {
			continue // reconnect, then re-send p with its id
		}
		if resp.status == stNotLeader {
			c.hint = string(c.data)
			c.drop()
			continue
		}
		if retry {
			c.mu.Lock()
			c.retried[fmt.Sprintf("%s %s", opName(p.op), statusName(resp.status))]++
			c.mu.Unlock()
		}
		switch p.op {
		case opAcquire:
			if resp.status == stOK {
				c.success()
				c.pend = &foReq{op: opRelease, id: c.sess.take(), token: resp.token, key: p.key}
				continue
			}
			// NOT_HELD: a retried acquire that never committed; anything else: try a new key
			c.pend = nil
			if resp.status != stNotHeld {
				time.Sleep(10 * time.Millisecond)
			}
		case opAck:
			c.ack.inflight = 0
			c.pend = nil
		default:
			c.pend = nil
		}
	}
	return nil
}

// summary says how the client got through the failovers.
func (c *foTicketing) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for k, n := range c.retried {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(parts)
	s := fmt.Sprintf("%d connections, %d resumed the session, %d requests lost with a session not resumed", c.gen, c.resumed, c.lost)
	if len(parts) > 0 {
		s += "; re-sent with their ids and answered: " + strings.Join(parts, ", ")
	}
	return s
}

func (c *foTicketing) success() {
	now := time.Now()
	c.mu.Lock()
	c.oks++
	if _, ok := c.okByGen[c.gen]; !ok {
		c.okByGen[c.gen] = now
	}
	c.mu.Unlock()
}

func (c *foTicketing) mark() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

func (c *foTicketing) firstSuccessAfter(m int64) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first time.Time
	for g, t := range c.okByGen {
		if g > m && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first
}

func (c *foTicketing) successes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.oks
}

func (c *foTicketing) leaderGuess() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, a := range c.eps {
		if a == c.curAddr {
			return i
		}
	}
	return -1
}

// --- etcd ------------------------------------------------------------------------------------

// foEtcd is one etcd client (every member's endpoint) with one session, locking a new key with
// concurrency.Mutex and unlocking it, in a loop. Every call is bounded by attempt (a call stuck
// on a member that lost its leader would otherwise wait for the server's own timeout); a failed
// call is retried at once on a new key. A success counts for a kill only if its Lock started
// after the kill (a Lock in flight at the kill is excluded: the next one starts as soon as it
// returns).
type foEtcd struct {
	cli     *clientv3.Client
	sess    *concurrency.Session
	attempt time.Duration

	markAt  atomic.Int64 // nanotime of the last mark
	mu      sync.Mutex
	firstOK map[int64]time.Time // by mark: the first Lock started after it that succeeded
	oks     int64
}

func newFoEtcd(endpoints string, attempt time.Duration) (*foEtcd, error) {
	cli, err := newEtcdClient(endpoints)
	if err != nil {
		return nil, err
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	if err != nil {
		cli.Close()
		return nil, err
	}
	c := &foEtcd{cli: cli, sess: sess, attempt: attempt, firstOK: map[int64]time.Time{}}
	c.markAt.Store(-1)
	return c, nil
}

func (c *foEtcd) run(stop *atomic.Bool) error {
	for n := 0; !stop.Load(); n++ {
		m := concurrency.NewMutex(c.sess, "/bench/failover/"+string(keyName("k", n)))
		started := nanotime()
		ctx, cancel := context.WithTimeout(context.Background(), c.attempt)
		err := m.Lock(ctx)
		cancel()
		if err != nil {
			time.Sleep(time.Millisecond)
			continue
		}
		now := time.Now()
		c.mu.Lock()
		c.oks++
		if mk := c.markAt.Load(); mk >= 0 && started >= mk {
			if _, ok := c.firstOK[mk]; !ok {
				c.firstOK[mk] = now
			}
		}
		c.mu.Unlock()
		ctx, cancel = context.WithTimeout(context.Background(), c.attempt)
		m.Unlock(ctx)
		cancel()
	}
	return nil
}

func (c *foEtcd) mark() int64 {
	m := nanotime()
	c.markAt.Store(m)
	return m
}

func (c *foEtcd) firstSuccessAfter(m int64) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.firstOK[m]
}

func (c *foEtcd) successes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.oks
}

func (c *foEtcd) leaderGuess() int { return -1 }

func (c *foEtcd) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.sess.Orphan()
	c.cli.Revoke(ctx, c.sess.Lease())
	c.cli.Close()
}

// --- the trials ----------------------------------------------------------------------------------

// failoverTrial is one kill.
type failoverTrial struct {
	killed, newLeader int
	ms                float64 // kill -> next successful acquire; -1: none within the bound
}

// runFailover runs trials kills on cl with client c looping; bound limits each wait.
func runFailover(cl cluster, c foClient, trials int, bound time.Duration) ([]failoverTrial, error) {
	var stop atomic.Bool
	done := make(chan error, 1)
	go func() { done <- c.run(&stop) }()
	defer func() {
		stop.Store(true)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
		}
	}()
	waitSuccesses := func(n int64) error {
		target := c.successes() + n
		deadline := time.Now().Add(bound)
		for c.successes() < target {
			select {
			case err := <-done:
				return fmt.Errorf("the client stopped: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the client made no progress within %v", bound)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}
	var out []failoverTrial
	mismatches := 0
	for t := 0; t < trials; t++ {
		if err := waitSuccesses(50); err != nil {
			return out, err
		}
		lead, err := cl.leader(bound)
		if err != nil {
			return out, err
		}
		if g := c.leaderGuess(); g >= 0 && g != lead {
			// the client is on another member (leadership may just have moved): let it settle
			if mismatches++; mismatches > 20 {
				return out, fmt.Errorf("the client stays connected to member %d while member %d leads", g+1, lead+1)
			}
			time.Sleep(500 * time.Millisecond)
			t--
			continue
		}
		m := c.mark()
		t0 := time.Now()
		cl.kill(lead)
		tr := failoverTrial{killed: lead, newLeader: -1, ms: -1}
		deadline := t0.Add(bound)
		for time.Now().Before(deadline) {
			if ok := c.firstSuccessAfter(m); !ok.IsZero() {
				tr.ms = round1(float64(ok.Sub(t0).Microseconds()) / 1000)
				break
			}
			time.Sleep(time.Millisecond)
		}
		if nl, err := cl.leader(bound); err == nil {
			tr.newLeader = nl
		}
		logf("failover %-9s trial %d/%d: killed member %d (leader), next successful acquire after %.1f ms; new leader %d",
			cl.system(), t+1, trials, lead+1, tr.ms, tr.newLeader+1)
		out = append(out, tr)
		if err := cl.restart(lead); err != nil {
			return out, err
		}
		if err := cl.settled(lead, bound); err != nil {
			return out, err
		}
		time.Sleep(time.Second) // let the restarted member catch up before the next kill
	}
	return out, nil
}

// failoverStats: median, min and max of the trials that saw a success; failed counts the others.
func failoverStats(trials []failoverTrial) (ms []float64, median, lo, hi float64, failed int) {
	var ok []float64
	for _, t := range trials {
		ms = append(ms, t.ms)
		if t.ms >= 0 {
			ok = append(ok, t.ms)
		} else {
			failed++
		}
	}
	if len(ok) == 0 {
		return ms, 0, 0, 0, failed
	}
	sort.Float64s(ok)
	return ms, medianF(ok), ok[0], ok[len(ok)-1], failed
}

func opName(op byte) string {
	switch op {
	case opAcquire:
		return "ACQUIRE"
	case opRelease:
		return "RELEASE"
	case opAck:
		return "ACK"
	}
	return fmt.Sprintf("op %#x", op)
}

func statusName(st byte) string {
	names := []string{"OK", "TIMED_OUT", "NOT_HELD", "INVALID", "NOT_LEADER", "BUSY", "SHUTTING_DOWN", "AUTH_FAILED", "UNSUPPORTED_VERSION", "CANCELLED"}
	if int(st) < len(names) {
		return names[st]
	}
	return fmt.Sprintf("status %d", st)
}
