package ticketing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// Sessions, resume, restarts, redirects, heartbeat, ACK and timeouts, against the fake server
// (fake_test.go): the failure paths PROTOCOL.md defines, each provoked on purpose.

const bound = 10 * time.Second // upper bound on anything that should happen "soon"

// acquireAsync starts an Acquire and waits until its request reached fc.
func acquireAsync(t *testing.T, c *Client, fc *fakeConn, key string, lease time.Duration, opts ...AcquireOption) (<-chan error, **Lock, wire.Request) {
	t.Helper()
	var lk *Lock
	ch := async(func() (err error) { lk, err = c.Acquire(context.Background(), key, lease, opts...); return })
	return ch, &lk, fc.nextOp(wire.OpAcquire)
}

// TestRequestIDsInWireOrder: requests from many goroutines reach the wire in the order of their
// ids, which start at 1 and have no gaps (PROTOCOL.md, "Request ids").
func TestRequestIDsInWireOrder(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	ctx := context.Background()
	const n = 300
	errs := make(chan error, n)
	for i := range n {
		go func() {
			switch i % 3 {
			case 0:
				errs <- c.Ping(ctx)
			case 1:
				errs <- c.Release(ctx, fmt.Sprint("k", i), uint64(i))
			default:
				_, err := c.Inspect(ctx, fmt.Sprint("k", i))
				errs <- err
			}
		}()
	}
	for want := uint64(1); want <= n; want++ {
		r := fc.next()
		if r.ID != want {
			t.Fatalf("request %d on the wire has id %d", want, r.ID)
		}
		fc.ok(r, 0)
	}
	for range n {
		if err := waitErr(t, errs); err != nil {
			t.Fatal(err)
		}
	}
}

// TestResumeResendsInIDOrder: after a reconnect that resumes the session, every unanswered
// request is sent again with its original id and fields, in id order, before any new request;
// a retried ACQUIRE's deadline counts from its first send.
func TestResumeResendsInIDOrder(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	ctx := context.Background()
	start := time.Now()
	acq, lk, a := acquireAsync(t, c, fc, "a", time.Minute)
	rel := async(func() error { return c.Release(ctx, "r", 5) })
	r := fc.nextOp(wire.OpRelease)
	ping := async(func() error { return c.Ping(ctx) })
	p := fc.nextOp(wire.OpPing)
	fc.ok(p, 0)
	if err := waitErr(t, ping); err != nil {
		t.Fatal(err)
	}

	fs.pause()
	fc.drop()
	waitDisconnected(t, c)
	// A call made while reconnecting waits for the connection.
	ping2 := async(func() error { return c.Ping(ctx) })
	deadline := time.Now().Add(bound)
	for c.waitingCount() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the new Ping never waited for the connection")
		}
		time.Sleep(time.Millisecond)
	}
	fs.unpause()
	fc2 := fs.next()
	if !fc2.Resumed || fc2.Hello.SessionID != fc.Hello.SessionID {
		t.Fatalf("reconnect: resumed %v, session %x, want %x", fc2.Resumed, fc2.Hello.SessionID, fc.Hello.SessionID)
	}
	for _, want := range []wire.Request{a, r} {
		got := fc2.next()
		if got.ID != want.ID || got.Op != want.Op || string(got.Key) != string(want.Key) || got.Token != want.Token || got.Lease != want.Lease || got.WaitMs != want.WaitMs {
			t.Fatalf("re-sent %+v, want %+v", got, want)
		}
	}
	p2 := fc2.nextOp(wire.OpPing)
	if p2.ID <= r.ID {
		t.Fatalf("the new PING has id %d, not above the re-sent %d", p2.ID, r.ID)
	}
	// The retried ACQUIRE is held by this (session, id): OK with the lease left (and, from a real
	// server, the time since it first arrived as detail: 0 here).
	fc2.reply(wire.Response{Op: wire.OpAcquire, ID: a.ID, Token: 77, Lease: 20000})
	fc2.ok(r, 0)
	fc2.ok(p2, 0)
	for _, ch := range []<-chan error{acq, rel, ping2} {
		if err := waitErr(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	if (*lk).Token() != 77 {
		t.Fatalf("token %d", (*lk).Token())
	}
	// t_first + (detail + lease) · 0.998, t_first the first send, not the retry's.
	checkDeadline(t, *lk, start, shrink(20*time.Second))
}

// TestDeadlineCountsFromTheFirstSend: an ACQUIRE re-sent after a resume, whose grant is read
// after the re-send, has its deadline counted from its first send plus the server's detail
// (PROTOCOL.md, "The lost signal"): a grant decided before the re-send and read 300 ms after it
// (counted from the re-send, the deadline was that much after the server's lease end), and a
// waiter granted 1.5 s after it first arrived (counted from the re-send without the queued
// time, the deadline was that much too early).
func TestDeadlineCountsFromTheFirstSend(t *testing.T) {
	for _, tc := range []struct {
		name     string
		detailMs uint32
		delay    time.Duration // between the re-send and the answer
	}{
		{"grant decided before the re-send", 20, 300 * time.Millisecond},
		{"waiter granted long after its re-send", 1500, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFakeServer(t)
			c, fc := dialFake(t, fs)
			start := time.Now()
			acq, lk, a := acquireAsync(t, c, fc, "k", 3*time.Second)
			arrived := time.Now() // the first send was before this
			time.Sleep(200 * time.Millisecond)
			fc.drop()
			fc2 := fs.next()
			if got := fc2.nextOp(wire.OpAcquire); got.ID != a.ID {
				t.Fatalf("re-sent id %d, want %d", got.ID, a.ID)
			}
			time.Sleep(tc.delay)
			fc2.reply(wire.Response{Op: wire.OpAcquire, ID: a.ID, Token: 5, Lease: 3000, Detail: tc.detailMs})
			if err := waitErr(t, acq); err != nil {
				t.Fatal(err)
			}
			span := shrink(time.Duration(tc.detailMs+3000) * time.Millisecond)
			if dl := (*lk).Deadline(); dl.After(arrived.Add(span).Add(2 * time.Millisecond)) {
				t.Errorf("deadline %v after first arrival + (detail + lease)·0.998: later than the server's lease end", dl.Sub(arrived.Add(span)))
			}
			checkDeadline(t, *lk, start, span)
		})
	}
}

// TestOlderExtendAnswerKeepsTheDeadline: two extends of one lock in flight (keep-alive and the
// application, say); the server applies them in id order, so the deadline follows the later
// one, also when the earlier one's answer is processed after it. (Before: the last answer
// processed won, and a longer earlier extend left the deadline past the server's lease end.)
func TestOlderExtendAnswerKeepsTheDeadline(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	acq, lk, a := acquireAsync(t, c, fc, "k", time.Minute)
	fc.ok(a, 3)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
	l := *lk
	ctx := context.Background()
	long := async(func() error { return l.Extend(ctx, time.Hour) })
	e1 := fc.nextOp(wire.OpExtend)
	short := async(func() error { return l.Extend(ctx, 2*time.Second) })
	e2 := fc.nextOp(wire.OpExtend)
	sent2 := time.Now() // after the later extend was sent
	if e2.ID <= e1.ID {
		t.Fatalf("extend ids %d, %d", e1.ID, e2.ID)
	}
	fc.ok(e2, 3)
	if err := waitErr(t, short); err != nil {
		t.Fatal(err)
	}
	fc.ok(e1, 3) // the older extend's answer, processed last
	if err := waitErr(t, long); err != nil {
		t.Fatal(err)
	}
	if d := l.Deadline().Sub(sent2); d > shrink(2*time.Second) {
		t.Fatalf("deadline %v after the later (2 s) extend reached the server: the earlier one-hour extend moved it", d)
	}
	if l.Lease() != 2*time.Second {
		t.Fatalf("lease %v, want the later extend's 2s", l.Lease())
	}
}

// TestLostAfterSuspend: a lock whose deadline passed while the host was suspended is lost
// within wire.LostCheckMs of the resume, although the runtime's timers did not count the
// suspend (faked here by adding suspend time to the client's clock, as CLOCK_BOOTTIME shows it).
func TestLostAfterSuspend(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	fc.answerPings()
	acq, lk, a := acquireAsync(t, c, fc, "k", 10*time.Second)
	fc.ok(a, 3)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	c.clk.suspend.Add(int64(11 * time.Second)) // slept through the lease
	select {
	case <-(*lk).lostChan():
	case <-time.After(bound):
		t.Fatal("a lock whose lease ran out during a suspend was not lost")
	}
	if d := time.Since(resumed); d > wire.LostCheckMs*time.Millisecond+200*time.Millisecond {
		t.Errorf("lost %v after the resume; want within LOST_CHECK_MS (%d ms)", d, wire.LostCheckMs)
	}
	if err := (*lk).Err(); !errors.Is(err, ErrLockLost) {
		t.Fatalf("err %v", err)
	}
}

// TestResumeRetriedAcquireNotHeld: a retried ACQUIRE answered NOT_HELD (granted and since ended,
// or unknown) fails with ErrConnectionLost: nothing is held for it.
func TestResumeRetriedAcquireNotHeld(t *testing.T) {
	v := loadVectors(t)
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	setNextID(c, 4)
	acq, _, a := acquireAsync(t, c, fc, "k", time.Second)
	fc.drop()
	fc2 := fs.next()
	if got := fc2.nextOp(wire.OpAcquire); got.ID != a.ID {
		t.Fatalf("retry id %d, want %d", got.ID, a.ID)
	}
	fc2.write(v.response(t, "acquire_retry_not_held"))
	if err := waitErr(t, acq); !errors.Is(err, ErrConnectionLost) || !strings.Contains(err.Error(), "holds nothing") {
		t.Fatalf("Acquire: %v", err)
	}
}

// TestNotResumedFailsInFlight: the same state id without RESUMED (the session ended) fails the
// unanswered requests with ErrConnectionLost and keeps the held locks.
func TestNotResumedFailsInFlight(t *testing.T) {
	fs := newFakeServer(t)
	fs.set(func(fs *fakeServer) { fs.noResume = true })
	c, fc := dialFake(t, fs)
	ctx := context.Background()
	acq, lk, a := acquireAsync(t, c, fc, "held", time.Minute)
	fc.ok(a, 5)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
	wait, _, _ := acquireAsync(t, c, fc, "queued", time.Minute)
	fc.drop()
	fc2 := fs.next()
	if err := waitErr(t, wait); !errors.Is(err, ErrConnectionLost) || !IsRetryable(err) {
		t.Fatalf("queued Acquire after a session ended: %v", err)
	}
	fc2.none(100 * time.Millisecond) // nothing re-sent
	select {
	case <-(*lk).Lost():
		t.Fatalf("held lock lost: %v", (*lk).Err())
	default:
	}
	rel := async(func() error { return (*lk).Release(ctx) })
	fc2.ok(fc2.nextOp(wire.OpRelease), 0)
	if err := waitErr(t, rel); err != nil {
		t.Fatal(err)
	}
}

// TestRestartLosesEverything: a different state id on reconnect fires lost "server restarted"
// for every lock, fails every request in flight with ErrServerRestarted (a queued acquire is not
// re-queued), and starts a new session; no operation on an old lock succeeds.
func TestRestartLosesEverything(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	ctx := context.Background()
	acq, lk, a := acquireAsync(t, c, fc, "held", time.Minute, WithKeepAlive())
	fc.ok(a, 5)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
	held := *lk
	wait, _, _ := acquireAsync(t, c, fc, "queued", time.Minute)
	oldSession := c.SessionID()

	fs.restart()
	fc.drop()
	// The old session's HELLO meets the new state id: the client hangs up, and connects again
	// with a new session. (The fake may hand the two connections over in either order.)
	fcSame, fcNew := fs.next(), fs.next()
	if fcNew.Hello.SessionID == oldSession {
		fcSame, fcNew = fcNew, fcSame
	}
	if fcSame.Hello.SessionID != oldSession {
		t.Fatalf("no reconnect with the old session %x", oldSession)
	}
	fcSame.waitClosed()
	if fcNew.Hello.SessionID == oldSession || c.SessionID() != fcNew.Hello.SessionID {
		t.Fatalf("no new session after a restart: %x (old %x, client %x)", fcNew.Hello.SessionID, oldSession, c.SessionID())
	}
	waitLost(t, held, ReasonServerRestarted)
	if err := waitErr(t, wait); !errors.Is(err, ErrServerRestarted) || !strings.Contains(err.Error(), "restarted") {
		t.Fatalf("queued Acquire across a restart: %v", err)
	}
	fcNew.answerPings()
	fcNew.none(100 * time.Millisecond) // not re-queued, no keep-alive extend

	if err := held.Extend(ctx, time.Minute); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Extend of a lost lock: %v", err)
	}
	// A lock lost to a restart: Release answers at once, and sends nothing (the new server has
	// nothing of the old state to release).
	var le *LockLostError
	if err := held.Release(ctx); !errors.As(err, &le) || le.Reason != ReasonServerRestarted {
		t.Fatalf("Release of a lock lost in a restart: %v", err)
	}
	fcNew.none(100 * time.Millisecond)
	ver := async(func() error {
		ok, err := held.Verify(ctx)
		if ok {
			return errors.New("Verify says held")
		}
		return err
	})
	in := fcNew.nextOp(wire.OpInspect)
	if in.Token != held.Token() {
		t.Fatalf("Verify sent token %d", in.Token)
	}
	fcNew.ok(in, 0)
	if err := waitErr(t, ver); err != nil {
		t.Fatal(err)
	}
}

// TestGoawayMovesTheSession: GOAWAY with a leader hint moves the session to the hinted node,
// which resumes it; the request in flight is re-sent there with its id.
func TestGoawayMovesTheSession(t *testing.T) {
	v := loadVectors(t)
	fsA, fsB := newFakeServer(t), newFakeServer(t)
	c, fcA := dialFake(t, fsA)
	fsB.set(func(b *fakeServer) { b.stateID = fsA.stateID; b.sessions[fcA.Hello.SessionID] = true })
	acq, lk, a := acquireAsync(t, c, fcA, "k", time.Minute)
	goaway := wire.AppendResponse(nil, &wire.Response{Op: wire.OpGoaway, Detail: wire.GoawayLeadership, Data: []byte(fsB.Addr)})
	fcA.write(goaway)
	fcA.waitClosed()
	fcB := fsB.next()
	if !fcB.Resumed {
		t.Fatal("not resumed on the new leader")
	}
	if r := fcB.nextOp(wire.OpAcquire); r.ID != a.ID {
		t.Fatalf("re-sent id %d, want %d", r.ID, a.ID)
	}
	fcB.ok(a, 9)
	if err := waitErr(t, acq); err != nil || (*lk).Token() != 9 {
		t.Fatalf("Acquire across GOAWAY: %v", err)
	}
	// The vector GOAWAY (no hint, STOPPING) is handled too: the client moves to the next
	// endpoint (the only one in its list, A) and resumes there.
	fsA.set(func(a *fakeServer) { a.sessions[fcA.Hello.SessionID] = true })
	fcB.write(v.response(t, "goaway_stopping_no_hint"))
	fcB.waitClosed()
	if fc := fsA.next(); !fc.Resumed {
		t.Fatal("not resumed after GOAWAY without a hint")
	}
	select {
	case <-(*lk).Lost():
		t.Fatal("GOAWAY lost a held lock")
	default:
	}
}

// TestNotLeaderFollowsTheHint: a request answered NOT_LEADER is re-sent, with its id, on a
// connection to the hinted leader.
func TestNotLeaderFollowsTheHint(t *testing.T) {
	fsA, fsB := newFakeServer(t), newFakeServer(t)
	c, fcA := dialFake(t, fsA)
	fsB.set(func(b *fakeServer) { b.stateID = fsA.stateID; b.sessions[fcA.Hello.SessionID] = true })
	ping := async(func() error { return c.Ping(context.Background()) })
	p := fcA.nextOp(wire.OpPing)
	fcA.reply(wire.Response{Op: wire.OpPing, Status: wire.StatusNotLeader, ID: p.ID, Data: []byte(fsB.Addr)})
	fcB := fsB.next()
	if r := fcB.nextOp(wire.OpPing); r.ID != p.ID {
		t.Fatalf("re-sent id %d, want %d", r.ID, p.ID)
	}
	fcB.ok(p, 0)
	if err := waitErr(t, ping); err != nil {
		t.Fatal(err)
	}
}

// TestChallengeLeaderHint: a follower's CHALLENGE NOT_LEADER sends Dial to the leader.
func TestChallengeLeaderHint(t *testing.T) {
	fsA, fsB := newFakeServer(t), newFakeServer(t)
	fsA.set(func(a *fakeServer) {
		a.challenge = func(*wire.Hello) *wire.Challenge {
			return &wire.Challenge{Status: wire.StatusNotLeader, Version: wire.Version, Data: []byte(fsB.Addr)}
		}
	})
	c, err := Dial(ctxT(t), WithEndpoints(fsA.Addr), WithHeartbeat(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fcB := fsB.next()
	ping := async(func() error { return c.Ping(context.Background()) })
	fcB.ok(fcB.nextOp(wire.OpPing), 0)
	if err := waitErr(t, ping); err != nil {
		t.Fatal(err)
	}
	// A follower that knows no leader: Dial fails (one round, one endpoint), naming it.
	fsA.set(func(a *fakeServer) {
		a.challenge = func(*wire.Hello) *wire.Challenge {
			return &wire.Challenge{Status: wire.StatusNotLeader, Version: wire.Version}
		}
	})
	// Dial keeps trying a cluster that answers NOT_LEADER until its request timeout (rule 1):
	// 1 s here, well inside ctxT's bound, so the verdict is the last round's and never a dial
	// cut short by the test's own context on a loaded machine.
	_, err = Dial(ctxT(t), WithEndpoints(fsA.Addr), WithHeartbeat(0), WithRequestTimeout(time.Second))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrNotLeader) || !strings.Contains(err.Error(), "no leader known") {
		t.Fatalf("Dial to a follower without a leader: %v", err)
	}
}

// TestShuttingDownMovesToTheNextEndpoint: with several endpoints, SHUTTING_DOWN sends the request
// again, as a new request, to the next endpoint.
func TestShuttingDownMovesToTheNextEndpoint(t *testing.T) {
	fsA, fsB := newFakeServer(t), newFakeServer(t)
	c, fcA := dialFake(t, fsA, WithEndpoints(fsA.Addr, fsB.Addr))
	fsB.set(func(b *fakeServer) { b.stateID = fsA.stateID; b.sessions[fcA.Hello.SessionID] = true })
	acq, lk, a := acquireAsync(t, c, fcA, "k", time.Minute)
	fcA.reply(wire.Response{Op: wire.OpAcquire, Status: wire.StatusShuttingDown, ID: a.ID, Data: []byte("server shutting down")})
	fcB := fsB.next()
	r := fcB.nextOp(wire.OpAcquire)
	if r.ID <= a.ID || string(r.Key) != "k" {
		t.Fatalf("moved request %+v, want a new id above %d", r, a.ID)
	}
	fcB.ok(r, 3)
	if err := waitErr(t, acq); err != nil || (*lk).Token() != 3 {
		t.Fatalf("Acquire: %v", err)
	}
}

// TestHeartbeatDetectsAFrozenServer: an unanswered PING fails the connection and the calls in
// flight with ErrTimeout (a queued acquire without a wait limit included); the acquire counts as
// cancelled: on the next connection it is re-sent and withdrawn with CANCEL, and a grant that
// still arrives is released.
// TestHeartbeatReplacesASilentConnection: a connection that does not answer a PING (a frozen
// node) is given up and replaced; the session resumes on the new connection and the call in
// flight goes on there (it is not failed).
func TestHeartbeatReplacesASilentConnection(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs, WithHeartbeat(50*time.Millisecond), WithRequestTimeout(300*time.Millisecond))
	start := time.Now()
	acq, lk, a := acquireAsync(t, c, fc, "k", time.Minute)
	if p := fc.next(); p.Op != wire.OpPing { // the heartbeat, never answered
		t.Fatalf("got %v, want the heartbeat PING", p.Op)
	}
	fs.set(func(fs *fakeServer) { fs.autoPing = true })
	fc.waitClosed()
	fc2 := fs.next()
	if !fc2.Resumed {
		t.Fatal("the session was not resumed on the new connection")
	}
	if r := fc2.nextOp(wire.OpAcquire); r.ID != a.ID {
		t.Fatalf("re-sent id %d, want %d", r.ID, a.ID)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("replaced after %v", d)
	}
	fc2.ok(a, 11)
	if err := waitErr(t, acq); err != nil || (*lk).Token() != 11 {
		t.Fatalf("Acquire across the replaced connection: %v", err)
	}
}

// TestSilentNodeIsTriedLast: after a node stopped answering, the next round starts at the next
// endpoint (a frozen node's kernel accepts connections; the leader is elsewhere).
func TestSilentNodeIsTriedLast(t *testing.T) {
	fs1, fs2 := newFakeServer(t), newFakeServer(t)
	fs2.set(func(fs *fakeServer) { fs.stateID = fs1.stateID })
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c, err := Dial(ctx, WithEndpoints(fs1.Addr, fs2.Addr), WithHeartbeat(50*time.Millisecond), WithBackoff(5*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fc := fs1.next()
	fs2.set(func(fs *fakeServer) { fs.sessions[fc.Hello.SessionID] = true; fs.autoPing = true })
	acq, _, a := acquireAsync(t, c, fc, "k", time.Minute)
	if p := fc.next(); p.Op != wire.OpPing { // never answered
		t.Fatalf("got %v, want the heartbeat PING", p.Op)
	}
	fc.waitClosed()
	fc2 := fs2.next()
	if !fc2.Resumed || fc2.Hello.SessionID != fc.Hello.SessionID {
		t.Fatal("the session did not resume on the second endpoint")
	}
	if r := fc2.nextOp(wire.OpAcquire); r.ID != a.ID {
		t.Fatalf("re-sent id %d, want %d", r.ID, a.ID)
	}
	fc2.ok(a, 3)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
	fs1.noConn(100 * time.Millisecond) // the silent node was not dialled again
}

// TestSilentNodeIsNotFollowedAsAHint: the other nodes keep naming a frozen leader until they
// elect another one; for a while the client follows no hint to the node it just found silent
// (it would accept TCP and cost the handshake wait) and goes on to the next endpoint.
func TestSilentNodeIsNotFollowedAsAHint(t *testing.T) {
	fs1, fs2, fs3 := newFakeServer(t), newFakeServer(t), newFakeServer(t)
	fs2.set(func(fs *fakeServer) {
		fs.challenge = func(*wire.Hello) *wire.Challenge {
			return &wire.Challenge{Status: wire.StatusNotLeader, Version: wire.Version, Data: []byte(fs1.Addr)}
		}
	})
	fs3.set(func(fs *fakeServer) { fs.stateID = fs1.stateID })
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c, err := Dial(ctx, WithEndpoints(fs1.Addr, fs2.Addr, fs3.Addr), WithHeartbeat(50*time.Millisecond), WithBackoff(5*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fc := fs1.next()
	fs3.set(func(fs *fakeServer) { fs.sessions[fc.Hello.SessionID] = true; fs.autoPing = true })
	acq, _, a := acquireAsync(t, c, fc, "k", time.Minute)
	if p := fc.next(); p.Op != wire.OpPing { // never answered
		t.Fatalf("got %v, want the heartbeat PING", p.Op)
	}
	fc.waitClosed()
	fc3 := fs3.next()
	if !fc3.Resumed {
		t.Fatal("the session did not resume on the third endpoint")
	}
	if r := fc3.nextOp(wire.OpAcquire); r.ID != a.ID {
		t.Fatalf("re-sent id %d, want %d", r.ID, a.ID)
	}
	fc3.ok(a, 3)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
	fs1.noConn(100 * time.Millisecond) // the hint to the silent node was not followed
}

// TestRequestTimeout: every call is bounded by the request timeout except the time an ACQUIRE
// spends queued: an acquire with a wait limit is bounded by wait + timeout; one without a limit
// waits on.
func TestRequestTimeout(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs, WithRequestTimeout(200*time.Millisecond))
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		min  time.Duration
	}{
		{"ping", func() error { return c.Ping(ctx) }, 200 * time.Millisecond},
		{"inspect", func() error { _, err := c.Inspect(ctx, "k"); return err }, 200 * time.Millisecond},
		{"release", func() error { return c.Release(ctx, "k", 1) }, 200 * time.Millisecond},
		{"acquire wait 100ms", func() error {
			_, err := c.Acquire(ctx, "k", time.Second, WithWaitTimeout(100*time.Millisecond))
			return err
		}, 300 * time.Millisecond},
	} {
		start := time.Now()
		err := waitErr(t, async(tc.call))
		d := time.Since(start)
		if !errors.Is(err, ErrTimeout) || !IsRetryable(err) || d < tc.min || d > tc.min+2*time.Second {
			t.Errorf("%s: %v after %v", tc.name, err, d)
		}
		fc.next()
	}
	if r := fc.nextOp(wire.OpCancel); r.Op != wire.OpCancel {
		t.Fatal("the timed-out acquire was not withdrawn")
	}
	// Without a wait limit, the queued time is not bounded by the request timeout.
	acq, _, a := acquireAsync(t, c, fc, "q", time.Second)
	select {
	case err := <-acq:
		t.Fatalf("Acquire without a wait limit ended after the request timeout: %v", err)
	case <-time.After(600 * time.Millisecond):
	}
	fc.ok(a, 4)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
}

// TestRequestTimeoutWaitingForConnection: a call made while the client reconnects waits for the
// connection only up to its request timeout, then fails ErrTimeout (naming the last connect
// error once a round has failed: docs/clients.md rule 1) and leaves the waiting list; a call in flight at the drop is still
// re-sent on the next connection.
func TestRequestTimeoutWaitingForConnection(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs, WithRequestTimeout(300*time.Millisecond))
	ctx := context.Background()
	rel := async(func() error { return c.Release(ctx, "r", 5) })
	r := fc.nextOp(wire.OpRelease)
	fs.pause()
	fc.drop()
	waitDisconnected(t, c)
	start := time.Now()
	err := waitErr(t, async(func() error { return c.Ping(ctx) }))
	d := time.Since(start)
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "no connection to the server within 300ms") ||
		d < 300*time.Millisecond || d > 300*time.Millisecond+2*time.Second {
		t.Fatalf("Ping while reconnecting: %v after %v", err, d)
	}
	if n := c.waitingCount(); n != 0 {
		t.Fatalf("%d calls still waiting for the connection", n)
	}
	// The RELEASE sent before the drop timed out too (no answer within 300ms); it is re-sent on
	// resume all the same (its id keeps its place), and its late answer is dropped.
	if err := waitErr(t, rel); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Release in flight: %v", err)
	}
	fs.unpause()
	fc2 := fs.next()
	if got := fc2.next(); got.ID != r.ID || got.Op != wire.OpRelease {
		t.Fatalf("re-sent %+v, want the RELEASE %d", got, r.ID)
	}
}

// TestSessionGrace: without a reconnect within the announced session grace, calls in flight fail
// with ErrConnectionLost; with no grace (0), at once.
func TestSessionGrace(t *testing.T) {
	for _, grace := range []uint32{300, 0} {
		t.Run(fmt.Sprint(grace), func(t *testing.T) {
			fs := newFakeServer(t)
			fs.set(func(fs *fakeServer) { fs.graceMs = grace })
			c, fc := dialFake(t, fs)
			ping := async(func() error { return c.Ping(context.Background()) })
			fc.nextOp(wire.OpPing)
			fs.pause()
			defer fs.unpause()
			start := time.Now()
			fc.drop()
			err := waitErr(t, ping)
			d := time.Since(start)
			if !errors.Is(err, ErrConnectionLost) || d < time.Duration(grace)*time.Millisecond-50*time.Millisecond || d > time.Duration(grace)*time.Millisecond+2*time.Second {
				t.Fatalf("Ping after %v: %v", d, err)
			}
		})
	}
}

// TestAck: ACK goes out after 1,024 answers, one at a time, with x the lowest id still awaited
// that is not an ACQUIRE (or the next id when there is none).
func TestAck(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	ctx := context.Background()
	_, _, _ = acquireAsync(t, c, fc, "queued", time.Minute) // id 1, never answered: not counted
	pings := func(n int) (ack *wire.Request) {
		for range n {
			ch := async(func() error { return c.Ping(ctx) })
			r := fc.next()
			if r.Op == wire.OpAck {
				ack = &r
				r = fc.next()
			}
			fc.ok(r, 0)
			if err := waitErr(t, ch); err != nil {
				t.Fatal(err)
			}
		}
		return ack
	}
	if ack := pings(wire.AckEvery - 1); ack != nil {
		t.Fatalf("ACK after %d answers", wire.AckEvery-1)
	}
	ch := async(func() error { return c.Ping(ctx) })
	last := fc.nextOp(wire.OpPing)
	fc.ok(last, 0)
	ack := fc.nextOp(wire.OpAck)
	if ack.Token != ack.ID || ack.ID != last.ID+1 {
		t.Fatalf("ACK id %d x %d, want x = its own id (only an ACQUIRE awaited)", ack.ID, ack.Token)
	}
	waitErr(t, ch)
	// Never two at once: 1,100 more answers while the ACK is unanswered send none.
	if again := pings(1100); again != nil {
		t.Fatalf("second ACK (x %d) while the first is unanswered", again.Token)
	}
	// A RELEASE awaited: x is its id.
	rel := async(func() error { return c.Release(ctx, "r", 1) })
	awaited := fc.nextOp(wire.OpRelease)
	fc.reply(wire.Response{Op: wire.OpAck, ID: ack.ID, Detail: 3})
	ch = async(func() error { return c.Ping(ctx) })
	fc.ok(fc.nextOp(wire.OpPing), 0) // the 1,101st answer since the first ACK was sent
	waitErr(t, ch)
	ack2 := fc.nextOp(wire.OpAck)
	if ack2.Token != awaited.ID {
		t.Fatalf("ACK x %d, want the awaited RELEASE's id %d", ack2.Token, awaited.ID)
	}
	fc.ok(awaited, 0)
	waitErr(t, rel)
}

// TestExpiredReasons: EXPIRED's reason becomes the lost reason; an unknown reason counts as
// expired; EXPIRED for a token not held is ignored.
func TestExpiredReasons(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	for i, tc := range []struct {
		reason uint32
		want   LostReason
	}{{wire.ExpiredLease, ReasonExpired}, {wire.ExpiredStopping, ReasonServerStopping}, {99, ReasonExpired}} {
		acq, lk, a := acquireAsync(t, c, fc, fmt.Sprint("k", i), time.Minute)
		token := uint64(100 + i)
		fc.ok(a, token)
		if err := waitErr(t, acq); err != nil {
			t.Fatal(err)
		}
		fc.reply(wire.Response{Op: wire.OpExpired, Token: 999}) // nobody's
		fc.reply(wire.Response{Op: wire.OpExpired, Token: token, Detail: tc.reason, Data: a.Key})
		waitLost(t, *lk, tc.want)
	}
}

// TestLostSignalTiming: Lost fires at the local deadline less min(5ms, lease/10), never before.
func TestLostSignalTiming(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	for _, lease := range []time.Duration{20 * time.Millisecond, 300 * time.Millisecond} {
		acq, lk, a := acquireAsync(t, c, fc, "k", lease)
		fc.ok(a, 1)
		if err := waitErr(t, acq); err != nil {
			t.Fatal(err)
		}
		l := *lk
		<-l.Lost()
		lostAt := time.Now()
		fireAt := l.Deadline().Add(-min(5*time.Millisecond, lease/10))
		if lostAt.Before(fireAt) {
			t.Errorf("lease %v: lost %v before deadline - margin", lease, fireAt.Sub(lostAt))
		}
		waitLost(t, l, ReasonExpired)
	}
}

// TestLostSignalsOfManyLocks: every held lock's lost signal fires at its own deadline, none
// before, whatever the order the locks were taken in, and a lock released first never fires
// (the client keeps the locks' deadlines in one heap watched by one timer, which fires early
// when the earliest lock is released and is then set again).
func TestLostSignalsOfManyLocks(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	ctx := context.Background()
	var locks []*Lock
	for i, lease := range []time.Duration{300 * time.Millisecond, 100 * time.Millisecond, 450 * time.Millisecond, 200 * time.Millisecond} {
		acq, lk, a := acquireAsync(t, c, fc, fmt.Sprint("k", i), lease)
		fc.ok(a, uint64(10+i))
		if err := waitErr(t, acq); err != nil {
			t.Fatal(err)
		}
		locks = append(locks, *lk)
	}
	released := locks[1] // the earliest deadline
	rel := async(func() error { return released.Release(ctx) })
	fc.ok(fc.nextOp(wire.OpRelease), 0)
	if err := waitErr(t, rel); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Lock{locks[3], locks[0], locks[2]} {
		select {
		case <-l.Lost():
		case <-time.After(bound):
			t.Fatalf("%v: never lost", l)
		}
		lostAt := time.Now()
		if fireAt := l.Deadline().Add(-min(5*time.Millisecond, l.Lease()/10)); lostAt.Before(fireAt) {
			t.Errorf("%v: lost %v before deadline - margin", l, fireAt.Sub(lostAt))
		}
		waitLost(t, l, ReasonExpired)
	}
	select {
	case <-released.Lost():
		t.Fatal("a released lock fired its lost signal")
	default:
	}
	if err := released.Err(); err != nil {
		t.Fatalf("released lock: %v", err)
	}
}

// TestConcurrentRelease: racing Release calls send one RELEASE, all return its result, and Lost
// never closes after the successful release.
func TestConcurrentRelease(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	acq, lk, a := acquireAsync(t, c, fc, "k", time.Minute)
	fc.ok(a, 1)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- (*lk).Release(context.Background()) }()
	}
	fc.ok(fc.nextOp(wire.OpRelease), 0)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Release: %v", err)
		}
	}
	fc.none(100 * time.Millisecond)
	select {
	case <-(*lk).Lost():
		t.Fatalf("Lost closed after a successful release: %v", (*lk).Err())
	default:
	}
}

// TestArgumentChecks: bad arguments fail with ErrInvalid before anything is sent, with a
// message that says what was expected.
func TestArgumentChecks(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	ctx := context.Background()
	lk := func() *Lock {
		acq, lk, a := acquireAsync(t, c, fc, "held", time.Minute)
		fc.ok(a, 1)
		waitErr(t, acq)
		return *lk
	}()
	for _, tc := range []struct {
		name string
		err  error
		msg  string
	}{
		{"empty key", errOf(c.Acquire(ctx, "", time.Second)), "the key is empty"},
		{"key too long", errOf(c.Acquire(ctx, strings.Repeat("k", MaxKeyLen+1), time.Second)), "65536 bytes"},
		{"lease 0", errOf(c.Acquire(ctx, "k", 0)), "below the minimum of 1ms"},
		{"lease -5ms", errOf(c.Acquire(ctx, "k", -5*time.Millisecond)), "below the minimum of 1ms"},
		{"lease 30ns", errOf(c.Acquire(ctx, "k", 30)), "did you mean 30*time.Millisecond or 30*time.Second?"},
		{"lease too long", errOf(c.Acquire(ctx, "k", MaxLease+time.Millisecond)), "above the protocol's maximum"},
		{"wait -5ms", errOf(c.Acquire(ctx, "k", time.Second, WithWaitTimeout(-5*time.Millisecond))), "WithWaitTimeout"},
		{"keep-alive negative", errOf(c.Acquire(ctx, "k", time.Second, WithKeepAlive(-time.Second))), "negative"},
		{"keep-alive not below the lease", errOf(c.Acquire(ctx, "k", time.Second, WithKeepAlive(time.Second))), "not below the lease"},
		{"max hold without keep-alive", errOf(c.Acquire(ctx, "k", time.Second, WithMaxHold(time.Minute))), "needs WithKeepAlive"},
		{"max hold 0", errOf(c.Acquire(ctx, "k", time.Second, WithKeepAlive(), WithMaxHold(0))), "not positive"},
		{"try-acquire empty key", errOf(c.TryAcquire(ctx, "", time.Second)), "the key is empty"},
		{"release token 0", c.Release(ctx, "k", 0), "token must be positive"},
		{"release empty key", c.Release(ctx, "", 1), "the key is empty"},
		{"extend lease 0", errOf(c.Extend(ctx, "k", 1, 0)), "below the minimum"},
		{"lock extend lease 0", lk.Extend(ctx, 0), "below the minimum"},
		{"verify token 0", errOf(c.Verify(ctx, "k", 0)), "token must be positive"},
		{"inspect empty key", errOf(c.Inspect(ctx, "")), "the key is empty"},
		{"with lock empty key", c.WithLock(ctx, "", time.Second, func(context.Context, *Lock) error { return nil }), "the key is empty"},
	} {
		if !errors.Is(tc.err, ErrInvalid) || !strings.Contains(tc.err.Error(), tc.msg) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", tc.name, tc.err, tc.msg)
		}
		checkMessage(t, tc.err)
	}
	fc.none(100 * time.Millisecond)

	for _, tc := range []struct {
		name string
		opts []Option
		msg  string
	}{
		{"no endpoints", []Option{WithEndpoints()}, "endpoint list is empty"},
		{"endpoint without port", []Option{WithEndpoints("localhost")}, "not host:port"},
		{"empty token", []Option{WithToken("")}, "token is empty"},
		{"dial timeout 0", []Option{WithDialTimeout(0)}, "WithDialTimeout"},
		{"request timeout -1s", []Option{WithRequestTimeout(-time.Second)}, "WithRequestTimeout"},
		{"heartbeat -1s", []Option{WithHeartbeat(-time.Second)}, "negative"},
		{"backoff max < min", []Option{WithBackoff(time.Second, time.Millisecond)}, "WithBackoff"},
		{"cleanup timeout 0", []Option{WithCleanupTimeout(0)}, "WithCleanupTimeout"},
	} {
		_, err := Dial(ctx, append([]Option{WithEndpoints(fs.Addr)}, tc.opts...)...)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Dial with %s: %v", tc.name, err)
		}
		checkMessage(t, err)
	}
	fs.noConn(100 * time.Millisecond)
}

func errOf[T any](_ T, err error) error { return err }

// checkMessage: one line, one "ticketing: " prefix.
func checkMessage(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	s := err.Error()
	if strings.ContainsAny(s, "\r\n") || strings.Count(s, "ticketing: ") != 1 || !strings.HasPrefix(s, "ticketing: ") {
		t.Errorf("message %q: want one line with one leading %q", s, "ticketing: ")
	}
}

// TestRefuseHeld: WithRefuseHeld refuses a key this client holds, at once, sending nothing; the
// default queues behind the held lock.
func TestRefuseHeld(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	acq, lk, a := acquireAsync(t, c, fc, "k", time.Minute)
	fc.ok(a, 1)
	waitErr(t, acq)
	_, err := c.Acquire(context.Background(), "k", time.Minute, WithRefuseHeld())
	if !errors.Is(err, ErrAlreadyHeld) || !strings.Contains(err.Error(), `"k"`) {
		t.Fatalf("refuse held: %v", err)
	}
	checkMessage(t, err)
	fc.none(50 * time.Millisecond)
	rel := async(func() error { return (*lk).Release(context.Background()) })
	fc.ok(fc.nextOp(wire.OpRelease), 0)
	waitErr(t, rel)
	// Released: no longer refused.
	acq, _, a = acquireAsync(t, c, fc, "k", time.Minute, WithRefuseHeld())
	fc.ok(a, 2)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
}

// TestKeepAliveAndMaxHold: keep-alive extends every lease/3 with the lease; it stops at Release
// (nothing sent after), and at the max hold, after which the lock runs out its lease.
func TestKeepAliveAndMaxHold(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	// Leases of 1.5 s, extended every 500 ms: with 300 ms (extends every 100 ms) a stall of 200 ms
	// on a loaded machine (two CPU hogs beside the race detector) let a lease run out before its
	// extend was answered, the keep-alive rightly stopped, and no third EXTEND came.
	acq, lk, a := acquireAsync(t, c, fc, "k", 1500*time.Millisecond, WithKeepAlive())
	fc.ok(a, 1)
	waitErr(t, acq)
	for range 3 {
		e := fc.nextOp(wire.OpExtend)
		if e.Token != 1 || e.Lease != 1500 {
			t.Fatalf("extend %+v", e)
		}
		fc.ok(e, 1)
	}
	rel := async(func() error { return (*lk).Release(context.Background()) })
	r := fc.next()
	if r.Op == wire.OpExtend { // one in flight when Release began
		fc.ok(r, 1)
		r = fc.next()
	}
	if r.Op != wire.OpRelease {
		t.Fatalf("got %v, want RELEASE", r.Op)
	}
	fc.ok(r, 0)
	waitErr(t, rel)
	fc.none(300 * time.Millisecond)

	acq, lk, a = acquireAsync(t, c, fc, "k2", 1500*time.Millisecond, WithKeepAlive(), WithMaxHold(1200*time.Millisecond))
	fc.ok(a, 2)
	waitErr(t, acq)
	// Extends every 500ms until the cap at 1.2s (one or two, depending on timing), then none:
	// the lock runs out its lease.
	extends := 0
	for lost := false; !lost; {
		select {
		case r := <-fc.reqs:
			if r.Op != wire.OpExtend {
				t.Fatalf("got %v, want EXTEND", r.Op)
			}
			fc.ok(r, 2)
			extends++
		case <-(*lk).Lost():
			lost = true
		case <-time.After(bound):
			t.Fatal("the lock with a max hold was never lost")
		}
	}
	if extends < 1 || extends > 3 {
		t.Errorf("%d extends before the cap of 1.2s at every 500ms", extends)
	}
	waitLost(t, *lk, ReasonExpired)
	fc.none(100 * time.Millisecond)
}

// TestCloseIsBounded: Close withdraws a queued acquire (CANCEL) and returns within the cleanup
// timeout with a frozen server; calls in flight fail with ErrClosed; held locks are not
// released unless WithReleaseOnClose.
func TestCloseIsBounded(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs, WithCleanupTimeout(200*time.Millisecond))
	acq, lk, a := acquireAsync(t, c, fc, "held", time.Minute)
	fc.ok(a, 1)
	waitErr(t, acq)
	wait, _, q := acquireAsync(t, c, fc, "queued", time.Minute)
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	if err := waitErr(t, wait); !errors.Is(err, ErrClosed) {
		t.Fatalf("queued Acquire after Close: %v", err)
	}
	fc.waitClosed()
	cancels := 0
	for len(fc.reqs) > 0 { // the CANCEL of the queued acquire, and nothing else
		switch r := <-fc.reqs; {
		case r.Op == wire.OpCancel && r.Token == q.ID:
			cancels++
		default:
			t.Fatalf("Close sent %v", r.Op)
		}
	}
	if cancels != 1 {
		t.Fatalf("Close sent %d CANCELs of the queued acquire, want 1", cancels)
	}
	if err := c.Ping(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
	if err := (*lk).Release(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Release after Close: %v", err)
	}

	// WithReleaseOnClose: Close releases what is held, bounded by the request timeout.
	c2, fc2 := dialFake(t, newFakeServer(t), WithReleaseOnClose(), WithRequestTimeout(300*time.Millisecond))
	acq, _, a = acquireAsync(t, c2, fc2, "a", time.Minute)
	fc2.ok(a, 1)
	waitErr(t, acq)
	acq, _, a = acquireAsync(t, c2, fc2, "b", time.Minute)
	fc2.ok(a, 2)
	waitErr(t, acq)
	closed := async(c2.Close)
	got := map[uint64]bool{}
	r1 := fc2.nextOp(wire.OpRelease)
	got[r1.Token] = true
	fc2.ok(r1, 0)
	got[fc2.nextOp(wire.OpRelease).Token] = true // never answered: the request timeout bounds it
	start = time.Now()
	if err := waitErr(t, closed); err != nil {
		t.Fatal(err)
	}
	if !got[1] || !got[2] || time.Since(start) > 2*time.Second {
		t.Fatalf("release on close: %v in %v", got, time.Since(start))
	}
}

// TestDialFailures: nobody listening is ErrUnavailable promptly; a peer that accepts and never
// answers fails within the dial timeout.
func TestDialFailures(t *testing.T) {
	fs := newFakeServer(t)
	dead := fs.Addr
	fs.close()
	start := time.Now()
	_, err := Dial(ctxT(t), WithEndpoints(dead), WithDialTimeout(time.Second))
	if !errors.Is(err, ErrUnavailable) || !IsRetryable(err) || time.Since(start) > 2*time.Second || !strings.Contains(err.Error(), dead) {
		t.Fatalf("Dial to nobody: %v after %v", err, time.Since(start))
	}
	checkMessage(t, err)

	silent := newFakeServer(t)
	silent.pause()
	defer silent.unpause()
	start = time.Now()
	_, err = Dial(ctxT(t), WithEndpoints(silent.Addr), WithDialTimeout(300*time.Millisecond))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrTimeout) || time.Since(start) > 2*time.Second || !strings.Contains(err.Error(), "timed out: no handshake within 300ms") {
		t.Fatalf("Dial to a silent peer: %v after %v", err, time.Since(start))
	}
	checkMessage(t, err)

	// Two endpoints, both down: one line naming both.
	_, err = Dial(ctxT(t), WithEndpoints(dead, "127.0.0.1:1"), WithDialTimeout(time.Second))
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), dead) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("two endpoints: %v", err)
	}
	checkMessage(t, err)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

// waitDisconnected waits until c has noticed that its connection is gone.
func waitDisconnected(t *testing.T, c *Client) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		c.mu.Lock()
		live := c.live
		c.mu.Unlock()
		if live == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the client never noticed the dropped connection")
		}
		time.Sleep(time.Millisecond)
	}
}

// waitingCount is the number of calls waiting for a connection (for tests).
func (c *Client) waitingCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiting)
}
