package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
	"github.com/ticketing/ticketing/wire"
)

// Official clients in the chaos workload: the holders' beliefs come from the clients themselves
// (their local deadline and lost signal), not from a formula in the checker. Each client object
// is one session with many acquires in flight on several keys at once (one process, many
// threads). Beside them, raw sessions that die holding several grants and queued acquires, and
// raw sessions that drop their connection right after reading a grant.

// clientChaos is the common part of the official-client workers: keys, lease, waits, the history.
type clientChaos struct {
	h         *history
	eps       []string
	keys      []string
	lease     time.Duration
	waits     []time.Duration // per acquire, one of these (0: try once)
	opTimeout time.Duration
	seed      uint64
	nextID    atomic.Int64 // worker ids in the history, above the raw workload's

	mu     sync.Mutex
	counts map[string]int
	errs   []string
}

func (cc *clientChaos) count(what string) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.counts == nil {
		cc.counts = map[string]int{}
	}
	cc.counts[what]++
}

func (cc *clientChaos) fail(format string, args ...any) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if len(cc.errs) < 20 {
		cc.errs = append(cc.errs, fmt.Sprintf(format, args...))
	}
}

func (cc *clientChaos) leaseNs() int64 { return int64(float64(cc.lease) * (1 - 2*rho)) }

// runGo runs clients Go client objects with workers goroutines each, until stop.
func (cc *clientChaos) runGo(t *testing.T, clients, workers int, stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(cc.eps...))
		cancel()
		if err != nil {
			t.Fatalf("go client: dial: %v", err)
		}
		for j := 0; j < workers; j++ {
			id := int(cc.nextID.Add(1))
			rng := rand.New(rand.NewPCG(cc.seed, uint64(id)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					cc.goRound(id, c, rng)
				}
			}()
		}
		go func() { <-done; c.Close() }()
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

// goRound: acquire a random key (a fifth of the time with keep-alive), write to its fenced
// register, hold, write again, release. The hold the history gets ends at the first of the
// release's start, the lost signal and the lock's own deadline.
func (cc *clientChaos) goRound(id int, c *ticketing.Client, rng *rand.Rand) {
	h := cc.h
	key := cc.keys[rng.IntN(len(cc.keys))]
	wait := cc.waits[rng.IntN(len(cc.waits))]
	opts := []ticketing.AcquireOption{ticketing.WithWaitTimeout(wait)}
	if rng.IntN(5) == 0 {
		opts = append(opts, ticketing.WithKeepAlive())
	}
	ctx, cancel := context.WithTimeout(context.Background(), cc.opTimeout)
	defer cancel()
	t0 := time.Now()
	lk, err := c.Acquire(ctx, key, cc.lease, opts...)
	t1 := time.Now()
	op := histOp{worker: id, key: key, kind: opAcquire, call: h.ns(t0), ret: h.ns(t1), sends: 1, leaseNs: cc.leaseNs()}
	switch {
	case err == nil:
	case errors.Is(err, ticketing.ErrNotAcquired):
		op.out = outTimedOut
		cc.count("go: not acquired")
		h.record(op)
		return
	default:
		// Timed out, connection lost, cancelled: the acquire may have been granted (the client
		// then releases the grant: docs/clients.md, rule 5).
		op.out, op.ret = outUnknown, math.MaxInt64
		cc.count("go acquire: " + errKind(err))
		h.record(op)
		time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
		return
	}
	cc.count("go: granted")
	deadline := lk.Deadline()
	if !deadline.After(t1) {
		// Its answer took longer than its lease (a failover: the log's time stands still while
		// no leader serves, the client's does not). The lock is lost at once; safe, not an
		// error here (the rolling restart, with leases longer than a step, allows none).
		cc.count("go: granted already expired")
	}
	op.out, op.token, op.deadline = outGrant, lk.Token(), h.ns(deadline)
	h.record(op)
	lostAt := make(chan time.Time, 1)
	watchDone := make(chan struct{})
	go func() {
		select {
		case <-lk.Lost():
			lostAt <- time.Now()
		case <-watchDone:
		}
	}()
	h.write(key, op.token, lk.Deadline())
	holdFor := time.Duration(5+rng.IntN(40)) * time.Millisecond
	if rng.IntN(10) == 0 {
		holdFor = cc.lease/8 + time.Duration(rng.Int64N(int64(cc.lease/4)))
	}
	time.Sleep(holdFor)
	if lk.Err() == nil {
		h.write(key, op.token, lk.Deadline())
	}
	t2 := time.Now()
	end := minTime(t2, lk.Deadline())
	rctx, rcancel := context.WithTimeout(context.Background(), cc.opTimeout)
	err = lk.Release(rctx)
	rcancel()
	t3 := time.Now()
	close(watchDone)
	select {
	case at := <-lostAt:
		end = minTime(end, at)
	default:
	}
	rel := histOp{worker: id, key: key, kind: opRelease, token: op.token, call: h.ns(t2), ret: h.ns(t3), out: outReleased, sends: 1}
	var lost *ticketing.LockLostError
	switch {
	case err == nil:
		cc.count("go: released")
	case errors.As(err, &lost) && lost.Reason == ticketing.ReasonNotHeld && end == t2:
		rel.out = outNotHeld // the release itself was answered NOT_HELD
		cc.count("go: release not held")
	default:
		rel.out, rel.ret = outUnknown, math.MaxInt64 // lost before (the server may say OK or NOT_HELD), or no answer
		cc.count("go release: " + errKind(err))
	}
	h.record(rel)
	h.addHold(hold{worker: id, key: key, token: op.token, start: t1, end: end})
}

// errKind names an error of the Go client for the counts.
func errKind(err error) string {
	for _, k := range []struct {
		e    error
		name string
	}{{ticketing.ErrLockLost, "lock lost"}, {ticketing.ErrTimeout, "timeout"}, {ticketing.ErrConnectionLost, "connection lost"},
		{ticketing.ErrUnavailable, "unavailable"}, {ticketing.ErrCancelled, "cancelled"}, {ticketing.ErrBusy, "busy"},
		{ticketing.ErrShuttingDown, "shutting down"}, {ticketing.ErrNotHeld, "not held"}} {
		if errors.Is(err, k.e) {
			return k.name
		}
	}
	return err.Error()
}

// The Python client, through its conformance driver (tests/conformance/DRIVER.md), started from
// the checkout: the client has no dependencies outside the standard library.

type pyDriver struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	wmu    sync.Mutex
	mu     sync.Mutex
	next   int64
	wait   map[int64]chan pyReply
	events map[string]chan time.Time // lock handle -> lost event time
	exited chan struct{}
	stderr *lockedBuffer
}

type pyReply struct {
	at     time.Time
	fields map[string]json.RawMessage
}

func (r pyReply) ok() bool { var b bool; json.Unmarshal(r.fields["ok"], &b); return b }

func (r pyReply) errKind() (kind, reason string) {
	var e struct{ Kind, Reason string }
	json.Unmarshal(r.fields["error"], &e)
	return e.Kind, e.Reason
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf) < 1<<20 {
		b.buf = append(b.buf, p...)
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return string(b.buf) }

// startPyDriver starts the Python driver with the client's sources on PYTHONPATH.
func startPyDriver(t *testing.T) *pyDriver {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	py := filepath.Join(root, "clients/python")
	cmd := exec.Command("python3", filepath.Join(py, "conformance/driver.py"))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(py, "src"), "TICKETING_CONFORMANCE=1")
	d := &pyDriver{cmd: cmd, wait: map[int64]chan pyReply{}, events: map[string]chan time.Time{}, exited: make(chan struct{}), stderr: &lockedBuffer{}}
	cmd.Stderr = d.stderr
	if d.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("python driver: %v", err)
	}
	go d.read(out)
	t.Cleanup(func() {
		d.stdin.Close()
		select {
		case <-d.exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-d.exited
		}
	})
	if r := d.do("hello", nil, 60*time.Second); !r.ok() {
		t.Fatalf("python driver: hello: %s\n%s", r.fields, d.stderr)
	}
	return d
}

func (d *pyDriver) read(out io.Reader) {
	defer close(d.exited)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		at := time.Now()
		var m map[string]json.RawMessage
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		if ev, ok := m["event"]; ok && string(ev) == `"lost"` {
			var lock string
			json.Unmarshal(m["lock"], &lock)
			d.mu.Lock()
			ch := d.events[lock]
			d.mu.Unlock()
			if ch != nil {
				select {
				case ch <- at:
				default:
				}
			}
			continue
		}
		var id int64
		json.Unmarshal(m["id"], &id)
		d.mu.Lock()
		ch := d.wait[id]
		delete(d.wait, id)
		d.mu.Unlock()
		if ch != nil {
			ch <- pyReply{at: at, fields: m}
		}
	}
}

// send sends a command and returns when it was sent and the channel of its reply.
func (d *pyDriver) send(op string, args map[string]any) (time.Time, chan pyReply) {
	d.mu.Lock()
	d.next++
	id := d.next
	ch := make(chan pyReply, 1)
	d.wait[id] = ch
	d.mu.Unlock()
	m := map[string]any{"id": id, "op": op}
	for k, v := range args {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	d.wmu.Lock()
	sent := time.Now()
	d.stdin.Write(append(b, '\n'))
	d.wmu.Unlock()
	return sent, ch
}

// do sends a command and waits for its reply (a reply with no fields when none comes in time).
func (d *pyDriver) do(op string, args map[string]any, within time.Duration) pyReply {
	_, ch := d.send(op, args)
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		return pyReply{at: time.Now(), fields: map[string]json.RawMessage{}}
	case <-d.exited:
		return pyReply{at: time.Now(), fields: map[string]json.RawMessage{}}
	}
}

// runPy runs clients Python client objects with workers concurrent workers each, until stop.
func (cc *clientChaos) runPy(t *testing.T, d *pyDriver, clients, workers int, stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		name := fmt.Sprintf("py%d", i)
		if r := d.do("connect", map[string]any{"client": name, "endpoints": cc.eps, "token": nil, "tls": nil,
			"request_timeout_ms": nil, "heartbeat_ms": nil, "dial_timeout_ms": nil}, 30*time.Second); !r.ok() {
			t.Fatalf("python client: connect: %s\n%s", r.fields, d.stderr)
		}
		for j := 0; j < workers; j++ {
			id := int(cc.nextID.Add(1))
			rng := rand.New(rand.NewPCG(cc.seed, uint64(id)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					cc.pyRound(id, d, name, fmt.Sprintf("%s-w%d-%d", name, id, n), rng)
				}
			}()
		}
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

// pyRound is goRound through the driver. The holder's deadline is read with lock_state right
// after the grant: deadline_in_ms counted from when that command was sent, the earliest moment
// the client could have measured it (so the belief taken is never longer than the client's).
func (cc *clientChaos) pyRound(id int, d *pyDriver, client, lock string, rng *rand.Rand) {
	h := cc.h
	key := cc.keys[rng.IntN(len(cc.keys))]
	wait := cc.waits[rng.IntN(len(cc.waits))]
	lost := make(chan time.Time, 1)
	d.mu.Lock()
	d.events[lock] = lost
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.events, lock)
		d.mu.Unlock()
	}()
	t0, ch := d.send("acquire", map[string]any{"client": client, "key": key, "lease_ms": cc.lease.Milliseconds(),
		"wait_ms": wait.Milliseconds(), "keepalive": false, "lock": lock})
	var r pyReply
	select {
	case r = <-ch:
	case <-time.After(cc.opTimeout + 10*time.Second):
		cc.fail("py w%d: acquire %s: no reply from the driver", id, key)
		h.record(histOp{worker: id, key: key, kind: opAcquire, call: h.ns(t0), ret: math.MaxInt64, out: outUnknown, sends: 1, leaseNs: cc.leaseNs()})
		return
	}
	t1 := r.at
	op := histOp{worker: id, key: key, kind: opAcquire, call: h.ns(t0), ret: h.ns(t1), sends: 1, leaseNs: cc.leaseNs()}
	if !r.ok() {
		kind, _ := r.errKind()
		cc.count("py acquire: " + kind)
		if kind == "not_acquired" {
			op.out = outTimedOut
		} else {
			op.out, op.ret = outUnknown, math.MaxInt64
			time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
		}
		h.record(op)
		return
	}
	cc.count("py: granted")
	var tok string
	json.Unmarshal(r.fields["token"], &tok)
	op.out = outGrant
	op.token, _ = strconv.ParseUint(tok, 10, 64)
	sent, sch := d.send("lock_state", map[string]any{"lock": lock})
	var st pyReply
	select {
	case st = <-sch:
	case <-time.After(cc.opTimeout):
		st.fields = map[string]json.RawMessage{}
	}
	var in float64
	if err := json.Unmarshal(st.fields["deadline_in_ms"], &in); err != nil {
		cc.fail("py w%d: lock_state: no deadline_in_ms: %s", id, st.fields)
		in = 0
	}
	deadline := sent.Add(time.Duration(in * float64(time.Millisecond)))
	if !deadline.After(t1) {
		cc.count("py: granted already expired") // as in goRound
	}
	op.deadline = h.ns(deadline)
	h.record(op)
	h.write(key, op.token, deadline)
	holdFor := time.Duration(5+rng.IntN(40)) * time.Millisecond
	if rng.IntN(10) == 0 {
		holdFor = cc.lease/8 + time.Duration(rng.Int64N(int64(cc.lease/4)))
	}
	time.Sleep(holdFor)
	h.write(key, op.token, deadline)
	t2, rch := d.send("release", map[string]any{"lock": lock})
	end := minTime(t2, deadline)
	rel := histOp{worker: id, key: key, kind: opRelease, token: op.token, call: h.ns(t2), ret: math.MaxInt64, out: outUnknown, sends: 1}
	select {
	case rr := <-rch:
		switch kind, reason := rr.errKind(); {
		case rr.ok():
			rel.out, rel.ret = outReleased, h.ns(rr.at)
			cc.count("py: released")
		case kind == "lock_lost" && reason == "not_held":
			rel.out, rel.ret = outNotHeld, h.ns(rr.at)
			cc.count("py: release not held")
		default:
			cc.count("py release: " + kind)
		}
	case <-time.After(cc.opTimeout + 10*time.Second):
		cc.fail("py w%d: release %s: no reply from the driver", id, key)
	}
	select {
	case at := <-lost:
		end = minTime(end, at)
	default:
	}
	h.record(rel)
	h.addHold(hold{worker: id, key: key, token: op.token, start: t1, end: end})
}

func (cc *clientChaos) report(t *testing.T) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	t.Logf("official clients: %v", cc.counts)
	if len(cc.errs) > 0 {
		t.Errorf("official clients in the chaos workload:\n  %s", joinLines(cc.errs))
	}
}

func joinLines(s []string) string {
	out := ""
	for i, l := range s {
		if i > 0 {
			out += "\n  "
		}
		out += l
	}
	return out
}

// dier: raw sessions that queue acquires on several keys at once, pipelined, and die (the
// connection closed, never resumed) a moment later, holding some grants and queued for others:
// the grants answered while attached run their lease; those made after the connection was gone
// are revoked when the session's grace ends, and the keys pass on at once. Their acquires have
// no outcome the history could know (ghosts: they count towards the tokens only).
func (w *workload) dier(id int, keys []string, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(w.seed, uint64(id)+1000))
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(500+rng.IntN(1000)) * time.Millisecond):
		}
		s := newSession(w.eps, w.hb)
		if err := s.connect(time.Now().Add(5 * time.Second)); err != nil {
			continue
		}
		var b []byte
		n := len(keys)/2 + rng.IntN(len(keys)/2+1)
		for _, k := range rng.Perm(len(keys))[:n] {
			s.lastID++
			wait := uint32(wire.WaitForever)
			if rng.IntN(2) == 0 {
				wait = 1500
			}
			b = wire.AppendRequest(b, &wire.Request{Op: wire.OpAcquire, ID: s.lastID, Key: []byte(keys[k]), Lease: w.leaseMs, WaitMs: wait})
		}
		s.nc.SetWriteDeadline(time.Now().Add(time.Second))
		s.nc.Write(b)
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		s.close()
		w.h.ghost(n)
	}
}

// dropper: a raw session that reads a grant and drops its connection at once, never to come
// back. While queued, it drops and resumes its connection now and then, re-sending its ACQUIRE
// a moment after the resume (a slow client), so that a hand-off can land between the resume
// and the retry: the grant is then answered twice on one connection, and the second answer is
// lost with the connection. The client read the first and holds the lock until its local
// deadline; the server must not revoke it when the session ends (its lease is longer than the
// session grace).
func (w *workload) dropper(id int, key string, leaseMs uint32, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(w.seed, uint64(id)+2000))
	for {
		select {
		case <-stop:
			return
		default:
		}
		w.dropOnce(id, key, leaseMs, rng, stop)
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
	}
}

func (w *workload) dropOnce(id int, key string, leaseMs uint32, rng *rand.Rand, stop <-chan struct{}) {
	h := w.h
	s := newSession(w.eps, w.hb)
	if err := s.connect(time.Now().Add(5 * time.Second)); err != nil {
		return
	}
	s.lastID++
	req := wire.Request{Op: wire.OpAcquire, ID: s.lastID, Key: []byte(key), Lease: leaseMs, WaitMs: wire.WaitForever}
	first := time.Now()
	op := histOp{worker: id, key: key, kind: opAcquire, call: h.ns(first), ret: math.MaxInt64, out: outUnknown, sends: 1,
		leaseNs: int64(float64(time.Duration(leaseMs)*time.Millisecond) * (1 - 2*rho))}
	send := func() bool {
		s.nc.SetWriteDeadline(time.Now().Add(time.Second))
		_, err := s.nc.Write(wire.AppendRequest(nil, &req))
		return err == nil
	}
	// granted drops the connection with a RST (whatever the server writes next is lost) and
	// records the grant: held until its local deadline, never released.
	granted := func(r wire.Response, what string) {
		if tc, ok := s.nc.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		s.close()
		c := &call{first: first, resp: r}
		op.ret, op.out, op.token, op.deadline = h.ns(time.Now()), outGrant, r.Token, h.ns(localDeadline(c))
		h.record(op)
		h.abandoned(id, op)
		w.countDrop(what)
	}
	// answer reads frames for up to d: the ACQUIRE's answer (ok), or a failed connection.
	answer := func(d time.Duration) (r wire.Response, ok, failed bool) {
		until := time.Now().Add(d)
		for {
			r, err := s.read(max(time.Until(until), time.Millisecond))
			if err == nil {
				if r.ID == req.ID && r.Op == wire.OpAcquire {
					return r, true, false
				}
				continue // a push, a ping's answer
			}
			var ne net.Error
			return r, false, !errors.As(err, &ne) || !ne.Timeout()
		}
	}
	if !send() {
		s.close()
		h.record(op)
		return
	}
	for give := first.Add(4 * time.Duration(leaseMs) * time.Millisecond); time.Now().Before(give); {
		r, ok, failed := answer(time.Duration(30+rng.IntN(70)) * time.Millisecond)
		if ok && r.Status == wire.StatusOK {
			granted(r, "granted and dropped")
			return
		}
		if ok || failed {
			break // refused (BUSY, ...), or the connection failed: give the session up
		}
		select {
		case <-stop:
			s.close()
			h.record(op)
			return
		default:
		}
		// Still queued: drop the connection, resume, and re-send the retry a moment later.
		s.close()
		if err := s.connect(time.Now().Add(3 * time.Second)); err != nil || !s.resumed {
			break
		}
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		op.sends++
		w.countDrop("resumed while queued")
		if r, ok, _ := answer(time.Millisecond); ok && r.Status == wire.StatusOK {
			// Handed off after the resume, before the retry: the retry is answered again from
			// the table, a second grant frame, which the drop loses.
			send()
			granted(r, "granted before its retry, dropped after it")
			return
		}
		if !send() {
			break
		}
	}
	s.close()
	h.record(op) // no grant seen: an unknown outcome
}

func (w *workload) countDrop(what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.drops == nil {
		w.drops = map[string]int{}
	}
	w.drops[what]++
}
