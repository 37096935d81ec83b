package locktable

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"testing"
	"unsafe"
)

// ev is an Event with its key copied, comparable with ==.
type ev struct {
	Kind  EventKind
	Owner Owner
	ReqID uint64
	Token uint64
	Lease int64
	Key   string
}

// h wraps a table with assertion helpers that check invariants after every
// call.
type h struct {
	t  *testing.T
	tb *Table
}

func newH(t *testing.T, cfg Config) *h {
	t.Helper()
	return &h{t: t, tb: New(cfg)}
}

func (x *h) inv() {
	x.t.Helper()
	if err := x.tb.check(); err != nil {
		x.t.Fatalf("invariant: %v", err)
	}
}

func (x *h) acq(now int64, o Owner, req uint64, key string, lease, wait int64, want Status) uint64 {
	x.t.Helper()
	r := x.tb.Acquire(now, o, req, []byte(key), lease, wait)
	x.inv()
	if r.Status != want {
		x.t.Fatalf("Acquire(%d, owner %d, req %d, %q): %v, want %v", now, o, req, key, r, want)
	}
	return r.Token
}

func (x *h) rel(now int64, key string, tok uint64, want Status) {
	x.t.Helper()
	if s := x.tb.Release(now, []byte(key), tok); s != want {
		x.t.Fatalf("Release(%q, %d): %v, want %v", key, tok, s, want)
	}
	x.inv()
}

func (x *h) ext(now int64, key string, tok uint64, lease int64, want Status) {
	x.t.Helper()
	if s := x.tb.Extend(now, 0, 0, []byte(key), tok, lease).Status; s != want {
		x.t.Fatalf("Extend(%q, %d): %v, want %v", key, tok, s, want)
	}
	x.inv()
}

func (x *h) adv(now int64) {
	x.t.Helper()
	x.tb.Advance(now)
	x.inv()
}

// events returns and clears the pending events.
func (x *h) events() []ev {
	var out []ev
	for _, e := range x.tb.Events() {
		lease := e.Lease
		if e.Kind != EvGranted && e.Kind != EvExtended {
			lease = 0 // the lease asked for, on TimedOut and Aborted: checked by the model test
		}
		out = append(out, ev{e.Kind, e.Owner, e.ReqID, e.Token, lease, keyOf(e)})
	}
	x.tb.ClearEvents()
	return out
}

func (x *h) wantEvents(want ...ev) {
	x.t.Helper()
	got := x.events()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		x.t.Fatalf("events:\n got %+v\nwant %+v", got, want)
	}
}

func (x *h) info(key string) Info {
	x.t.Helper()
	i, ok := x.tb.Inspect([]byte(key))
	if !ok {
		x.t.Fatalf("Inspect(%q): not present", key)
	}
	return i
}

func (x *h) absent(key string) {
	x.t.Helper()
	if i, ok := x.tb.Inspect([]byte(key)); ok {
		x.t.Fatalf("Inspect(%q) = %+v, want absent", key, i)
	}
}

func (x *h) stats(keys, held, waiters int) {
	x.t.Helper()
	k, hd, w := x.tb.Stats()
	if k != keys || hd != held || w != waiters {
		x.t.Fatalf("Stats = %d,%d,%d want %d,%d,%d", k, hd, w, keys, held, waiters)
	}
}

func TestImmediateGrantReleaseFreesKey(t *testing.T) {
	x := newH(t, Config{})
	tok := x.acq(5, 1, 10, "a", 100, 0, OK)
	if tok != 1 {
		t.Fatalf("token %d", tok)
	}
	if got, want := x.info("a"), (Info{Holder: 1, HolderReqID: 10, Token: 1, GrantedAt: 5, Deadline: 105, Held: true}); got != want {
		t.Fatalf("Inspect %+v want %+v", got, want)
	}
	if d, ok := x.tb.NextDeadline(); !ok || d != 105 {
		t.Fatalf("NextDeadline %d %v", d, ok)
	}
	x.stats(1, 1, 0)
	x.rel(6, "a", tok, OK)
	x.absent("a")
	x.stats(0, 0, 0)
	if _, ok := x.tb.NextDeadline(); ok {
		t.Fatal("deadline left after release")
	}
	x.rel(7, "a", tok, NotHeld) // already released
	x.wantEvents()
	// A fresh grant takes a new token.
	if tok2 := x.acq(8, 1, 11, "a", 100, 0, OK); tok2 != 2 {
		t.Fatalf("second token %d", tok2)
	}
}

func TestTryOnce(t *testing.T) {
	x := newH(t, Config{})
	tok := x.acq(0, 1, 1, "k", 100, 0, OK)
	x.acq(1, 2, 1, "k", 100, 0, TimedOut)
	x.stats(1, 1, 0)
	if i := x.info("k"); i.Token != tok || i.Holder != 1 || i.Waiters != 0 {
		t.Fatalf("holder disturbed: %+v", i)
	}
	if x.tb.LastToken() != 1 {
		t.Fatal("try-once took a token")
	}
	x.wantEvents()
}

func TestFIFO50WithIncreasingTokens(t *testing.T) {
	x := newH(t, Config{})
	tok := x.acq(0, 1000, 1, "q", 1000, 0, OK)
	for i := 0; i < 50; i++ {
		x.acq(int64(i), Owner(i), uint64(100+i), "q", 1000, -1, Queued)
	}
	x.stats(1, 1, 50)
	now := int64(100)
	for i := 0; i < 50; i++ {
		x.rel(now, "q", tok, OK)
		got := x.events()
		if len(got) != 1 || got[0].Kind != EvGranted || got[0].Owner != Owner(i) || got[0].ReqID != uint64(100+i) {
			t.Fatalf("hand-off %d: %+v", i, got)
		}
		if got[0].Token <= tok {
			t.Fatalf("token not increasing: %d after %d", got[0].Token, tok)
		}
		tok = got[0].Token
		if inf := x.info("q"); inf.Holder != Owner(i) || inf.Token != tok || inf.Waiters != 49-i {
			t.Fatalf("after hand-off %d: %+v", i, inf)
		}
		now++
	}
	x.rel(now, "q", tok, OK)
	x.absent("q")
	x.stats(0, 0, 0)
}

func TestStaleTokenAfterExpiry(t *testing.T) {
	x := newH(t, Config{})
	a := x.acq(0, 1, 1, "k", 10, 0, OK)
	x.acq(1, 2, 7, "k", 50, -1, Queued)
	x.adv(9)
	x.wantEvents()
	x.adv(10)
	x.wantEvents(
		ev{EvExpired, 1, 1, a, 0, "k"},
		ev{EvGranted, 2, 7, a + 1, 50, "k"},
	)
	b := a + 1
	x.rel(11, "k", a, NotHeld)
	x.ext(11, "k", a, 1000, NotHeld)
	x.rel(11, "k", 0, NotHeld)
	x.rel(11, "k", 999, NotHeld)
	x.rel(11, "other", b, NotHeld)
	if i := x.info("k"); !i.Held || i.Holder != 2 || i.Token != b || i.Deadline != 60 {
		t.Fatalf("new holder disturbed: %+v", i)
	}
	x.rel(12, "k", b, OK)
	x.absent("k")
}

func TestLeaseStartsAtHandOff(t *testing.T) {
	x := newH(t, Config{})
	a := x.acq(0, 1, 1, "k", 100, 0, OK)
	x.acq(5, 2, 2, "k", 50, -1, Queued)
	x.rel(70, "k", a, OK)
	x.wantEvents(ev{EvGranted, 2, 2, a + 1, 50, "k"})
	if i := x.info("k"); i.GrantedAt != 70 || i.Deadline != 120 {
		t.Fatalf("lease not from hand-off: %+v", i)
	}
	x.adv(119)
	x.wantEvents()
	x.adv(120)
	x.wantEvents(ev{EvExpired, 2, 2, a + 1, 0, "k"})
	x.absent("k")
}

func TestLateAdvanceGrantsFullLease(t *testing.T) {
	x := newH(t, Config{})
	a := x.acq(0, 1, 1, "k", 100, 0, OK)
	x.acq(1, 2, 2, "k", 30, -1, Queued)
	x.adv(250) // the server was late: the expiry is processed at 250
	x.wantEvents(ev{EvExpired, 1, 1, a, 0, "k"}, ev{EvGranted, 2, 2, a + 1, 30, "k"})
	if i := x.info("k"); i.GrantedAt != 250 || i.Deadline != 280 {
		t.Fatalf("lease cut short: %+v", i)
	}
}

func TestWaitTimeout(t *testing.T) {
	x := newH(t, Config{})
	a := x.acq(0, 1, 1, "k", 1000, 0, OK)
	x.acq(10, 2, 2, "k", 100, 30, Queued)
	x.acq(11, 3, 3, "k", 100, -1, Queued)
	if d, _ := x.tb.NextDeadline(); d != 40 {
		t.Fatalf("NextDeadline %d", d)
	}
	x.adv(39)
	x.wantEvents()
	x.adv(40)
	x.wantEvents(ev{EvTimedOut, 2, 2, 0, 0, "k"})
	if i := x.info("k"); i.Waiters != 1 {
		t.Fatalf("waiters %d", i.Waiters)
	}
	x.rel(50, "k", a, OK)
	x.wantEvents(ev{EvGranted, 3, 3, a + 1, 100, "k"})
	// A timed-out request id is free to be used again.
	x.acq(51, 2, 2, "k", 100, -1, Queued)
}

func TestDeadlineTiesInSetOrder(t *testing.T) {
	// Lease deadline set before the wait deadline: the expiry wins, the
	// waiter is granted.
	x := newH(t, Config{})
	a := x.acq(0, 1, 1, "k", 40, 0, OK)
	x.acq(10, 2, 2, "k", 5, 30, Queued)
	x.adv(100)
	x.wantEvents(ev{EvExpired, 1, 1, a, 0, "k"}, ev{EvGranted, 2, 2, a + 1, 5, "k"})
	if i := x.info("k"); i.Holder != 2 || i.GrantedAt != 100 || i.Deadline != 105 {
		t.Fatalf("after tie: %+v", i)
	}
}

func TestDeadlineTiesWaitFirst(t *testing.T) {
	// The lease is extended after the waiter queued: same deadline, the
	// wait timeout was set first and is processed first.
	x := newH(t, Config{})
	a := x.acq(0, 1, 1, "k", 5, 0, OK)
	x.acq(10, 2, 2, "k", 5, 30, Queued)
	x.ext(3, "k", a, 37, OK) // deadline 40, set after the wait deadline 40
	x.adv(40)
	x.wantEvents(ev{EvTimedOut, 2, 2, 0, 0, "k"}, ev{EvExpired, 1, 1, a, 0, "k"})
	x.absent("k")
}

func TestDropOwner(t *testing.T) {
	x := newH(t, Config{})
	a := x.acq(0, 1, 1, "k", 100, 0, OK)
	x.acq(0, 2, 1, "k", 100, -1, Queued)
	x.acq(0, 3, 1, "k", 100, 50, Queued)
	x.acq(0, 2, 2, "k", 100, 20, Queued)
	x.acq(0, 2, 3, "j", 100, 0, OK) // owner 2 also holds j
	x.acq(0, 4, 1, "j", 100, 10, Queued)
	x.acq(0, 2, 4, "j", 100, -1, Queued)
	if n, _ := x.tb.DropOwner(1, 2); n != 3 {
		t.Fatalf("DropOwner removed %d", n)
	}
	x.inv()
	x.stats(2, 2, 2)
	if n, _ := x.tb.DropOwner(1, 2); n != 0 {
		t.Fatalf("second DropOwner removed %d", n)
	}
	if i := x.info("j"); i.Holder != 2 || i.Waiters != 1 {
		t.Fatalf("held lock of dropped owner disturbed: %+v", i)
	}
	x.rel(2, "k", a, OK)
	x.wantEvents(ev{EvGranted, 3, 1, 3, 100, "k"})
	x.adv(1000)
	got := x.events()
	for _, e := range got {
		if e.Owner == 2 && e.Kind != EvExpired {
			t.Fatalf("dropped owner got %+v", e)
		}
	}
	x.stats(0, 0, 0)
}

func TestCancel(t *testing.T) {
	x := newH(t, Config{})
	a := x.acq(0, 1, 1, "k", 100, 0, OK)
	x.acq(0, 2, 5, "k", 100, 30, Queued)
	x.acq(0, 3, 5, "k", 100, -1, Queued)
	if x.tb.Cancel(1, 2, 6) || x.tb.Cancel(1, 4, 5) || x.tb.Cancel(1, 1, 1) {
		t.Fatal("Cancel of an unknown request succeeded")
	}
	if !x.tb.Cancel(1, 2, 5) {
		t.Fatal("Cancel failed")
	}
	x.inv()
	if x.tb.Cancel(1, 2, 5) {
		t.Fatal("second Cancel succeeded")
	}
	if d, _ := x.tb.NextDeadline(); d != 100 {
		t.Fatalf("wait timer left behind: %d", d)
	}
	x.rel(2, "k", a, OK)
	x.wantEvents(ev{EvGranted, 3, 5, 2, 100, "k"})
}

func TestLockDelayAfterExpiryOnly(t *testing.T) {
	x := newH(t, Config{LockDelay: 50})
	a := x.acq(0, 1, 1, "k", 10, 0, OK)
	x.acq(1, 2, 2, "k", 20, -1, Queued)
	x.adv(10)
	x.wantEvents(ev{EvExpired, 1, 1, a, 0, "k"})
	if i := x.info("k"); i.Held || i.DelayUntil != 60 || i.Waiters != 1 || i.Token != 0 {
		t.Fatalf("in delay: %+v", i)
	}
	x.acq(11, 3, 3, "k", 10, 0, TimedOut)
	x.rel(12, "k", a, NotHeld)
	x.acq(13, 4, 4, "k", 10, -1, Queued)
	x.adv(59)
	x.wantEvents()
	x.adv(60)
	x.wantEvents(ev{EvGranted, 2, 2, a + 1, 20, "k"})
	if i := x.info("k"); i.DelayUntil != 0 || i.GrantedAt != 60 || i.Deadline != 80 {
		t.Fatalf("after delay: %+v", i)
	}
	// Release hands off at once: no delay.
	x.rel(61, "k", a+1, OK)
	x.wantEvents(ev{EvGranted, 4, 4, a + 2, 10, "k"})
	x.rel(62, "k", a+2, OK)
	x.absent("k")
	x.acq(62, 5, 5, "k", 10, 0, OK)
}

func TestLockDelayWithoutWaiters(t *testing.T) {
	x := newH(t, Config{LockDelay: 50, MaxLocks: 1})
	a := x.acq(0, 1, 1, "k", 10, 0, OK)
	x.adv(15)
	x.wantEvents(ev{EvExpired, 1, 1, a, 0, "k"})
	x.stats(1, 0, 0) // still present, in delay
	if r := x.tb.Acquire(16, 2, 2, []byte("other"), 10, 0); r.Status != Busy || r.Limit != LimitLocks {
		t.Fatalf("delayed key not counted against MaxLocks: %+v", r)
	}
	x.acq(16, 2, 2, "k", 10, 0, TimedOut)
	x.adv(65)
	x.wantEvents()
	x.absent("k")
	x.acq(66, 2, 3, "other", 10, 0, OK)
}

func TestExtend(t *testing.T) {
	x := newH(t, Config{})
	a := x.acq(0, 1, 1, "k", 10, 0, OK)
	x.ext(5, "k", a, 100, OK)
	if i := x.info("k"); i.Deadline != 105 || i.GrantedAt != 0 {
		t.Fatalf("extend: %+v", i)
	}
	x.ext(6, "k", a+1, 100, NotHeld)
	x.ext(6, "nope", a, 100, NotHeld)
	x.adv(104)
	x.wantEvents()
	x.adv(105)
	x.wantEvents(ev{EvExpired, 1, 1, a, 0, "k"})
	x.ext(106, "k", a, 100, NotHeld)
	// Saturating deadline.
	b := x.acq(200, 1, 2, "k", 10, 0, OK)
	x.ext(200, "k", b, math.MaxInt64, OK)
	if i := x.info("k"); i.Deadline != math.MaxInt64 {
		t.Fatalf("deadline not saturated: %d", i.Deadline)
	}
}

func TestLimits(t *testing.T) {
	x := newH(t, Config{MaxWaitersPerKey: 2, MaxWaitersTotal: 3, MaxLocks: 2})
	x.acq(0, 1, 1, "a", 100, 0, OK)
	x.acq(0, 1, 2, "b", 100, 0, OK)
	r := x.tb.Acquire(0, 1, 3, []byte("c"), 100, 0)
	if r != (Result{Status: Busy, Limit: LimitLocks}) {
		t.Fatalf("MaxLocks: %+v", r)
	}
	x.acq(0, 2, 1, "a", 100, -1, Queued)
	x.acq(0, 3, 1, "a", 100, -1, Queued)
	if r := x.tb.Acquire(0, 4, 1, []byte("a"), 100, -1); r != (Result{Status: Busy, Limit: LimitWaitersPerKey}) {
		t.Fatalf("MaxWaitersPerKey: %+v", r)
	}
	x.acq(0, 4, 1, "b", 100, -1, Queued)
	if r := x.tb.Acquire(0, 5, 1, []byte("b"), 100, -1); r != (Result{Status: Busy, Limit: LimitWaitersTotal}) {
		t.Fatalf("MaxWaitersTotal: %+v", r)
	}
	x.inv()
	x.stats(2, 2, 3)
	if x.tb.LastToken() != 2 {
		t.Fatalf("Busy took a token")
	}
	// A Busy request is not queued: its id is not a duplicate afterwards.
	x.tb.Cancel(0, 4, 1)
	x.acq(0, 5, 1, "b", 100, -1, Queued)
}

func TestDuplicate(t *testing.T) {
	x := newH(t, Config{})
	a := x.acq(0, 1, 1, "a", 100, 0, OK)
	x.acq(0, 2, 9, "a", 100, -1, Queued)
	x.acq(0, 2, 9, "a", 100, -1, Duplicate)
	x.acq(0, 2, 9, "zzz", 100, 0, Duplicate) // any key: ids are per owner
	x.absent("zzz")
	x.acq(0, 3, 9, "a", 100, -1, Queued) // other owner, same id: fine
	x.stats(1, 1, 2)
	x.rel(1, "a", a, OK)
	x.wantEvents(ev{EvGranted, 2, 9, 2, 100, "a"})
	// Granted, so no longer queued: the id no longer counts as a duplicate.
	x.acq(1, 2, 9, "b", 100, 0, OK)
}

func TestAbort(t *testing.T) {
	x := newH(t, Config{LockDelay: 100})
	x.acq(0, 1, 1, "a", 10, 0, OK)
	x.acq(0, 1, 2, "b", 1000, 0, OK)
	x.acq(1, 2, 1, "b", 10, -1, Queued)
	x.acq(2, 3, 1, "a", 10, 5000, Queued)
	x.acq(3, 2, 2, "a", 10, -1, Queued)
	x.acq(4, 4, 1, "b", 10, 5000, Queued)
	x.adv(10) // a expires into lock-delay
	x.wantEvents(ev{EvExpired, 1, 1, 1, 0, "a"})
	x.tb.Abort(11)
	x.inv()
	x.wantEvents(
		ev{EvAborted, 2, 1, 0, 0, "b"},
		ev{EvAborted, 3, 1, 0, 0, "a"},
		ev{EvAborted, 2, 2, 0, 0, "a"},
		ev{EvAborted, 4, 1, 0, 0, "b"},
	)
	x.stats(2, 1, 0) // b held, a in delay
	if d, _ := x.tb.NextDeadline(); d != 110 {
		t.Fatalf("NextDeadline %d", d)
	}
	x.adv(110)
	x.wantEvents()
	x.stats(1, 1, 0)
}

func TestDropOwnerAndCancelFreeIdleKeys(t *testing.T) {
	x := newH(t, Config{LockDelay: 10})
	a := x.acq(0, 1, 1, "k", 5, 0, OK)
	x.acq(0, 2, 1, "k", 5, -1, Queued)
	x.acq(0, 3, 1, "k", 5, -1, Queued)
	x.adv(5) // into delay with two waiters
	x.events()
	x.tb.DropOwner(6, 2)
	x.tb.Cancel(6, 3, 1)
	x.inv()
	x.stats(1, 0, 0)
	x.adv(15)
	x.wantEvents()
	x.stats(0, 0, 0)
	x.rel(16, "k", a, NotHeld)
}

func TestManyKeysAndWaitersGrowth(t *testing.T) {
	x := newH(t, Config{})
	toks := map[string]uint64{}
	for i := 0; i < 5000; i++ {
		k := fmt.Sprintf("key-%d-%s", i, string(make([]byte, i%70)))
		toks[k] = x.tb.Acquire(0, Owner(i%7), uint64(i), []byte(k), 100, 0).Token
		x.tb.Acquire(0, Owner(i%13), uint64(1e6+i), []byte(k), 100, int64(1+i%50))
		x.tb.Acquire(0, Owner(1000+i), 1, []byte(k), 100, -1)
	}
	x.inv()
	x.stats(5000, 5000, 10000)
	x.tb.DropOwner(0, 3)
	x.inv()
	x.adv(25)
	x.events()
	for k, tok := range toks {
		if x.tb.Release(30, []byte(k), tok) != OK {
			t.Fatalf("release %q", k)
		}
	}
	x.inv()
	x.adv(1000)
	x.adv(2000)
	x.events()
	x.stats(0, 0, 0)
}

func TestEventSince(t *testing.T) {
	x := newH(t, Config{})
	a := x.acq(3, 1, 1, "k", 100, 0, OK)
	x.tb.Acquire(7, 2, 2, []byte("k"), 50, -1)
	x.tb.Acquire(9, 3, 3, []byte("k"), 50, 20)
	x.tb.Acquire(11, 4, 4, []byte("k"), 50, -1)
	x.tb.Release(20, []byte("k"), a)
	x.tb.Advance(29)
	x.tb.Advance(70)
	x.tb.Abort(71)
	var got []string
	for _, e := range x.tb.Events() {
		got = append(got, fmt.Sprintf("%v o%d since %d", e.Kind, e.Owner, e.Since))
	}
	want := []string{
		"EvGranted o2 since 7",  // queued at 7, granted at 20
		"EvTimedOut o3 since 9", // queued at 9
		"EvExpired o2 since 20", // granted at 20
		"EvGranted o4 since 11",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	x.tb.ClearEvents()
	x.tb.Acquire(72, 5, 5, []byte("k"), 50, -1)
	x.tb.Abort(73)
	if e := x.tb.Events(); len(e) != 1 || e[0].Kind != EvAborted || e[0].Since != 72 {
		t.Fatalf("abort: %+v", e)
	}
}

// Start-up grace: no grant before AvailableFrom; a waiter queued during it is granted at its
// end, a try-once gets TimedOut, and after it keys are granted at once.
func TestAvailableFrom(t *testing.T) {
	x := newH(t, Config{AvailableFrom: 100})
	x.acq(0, 1, 1, "k", 10, 0, TimedOut)
	if i := x.info("k"); i.Held || i.DelayUntil != 100 {
		t.Fatalf("during grace: %+v", i)
	}
	x.acq(5, 2, 2, "k", 30, -1, Queued)
	x.acq(6, 3, 3, "j", 30, 50, Queued)
	x.adv(56)
	x.wantEvents(ev{EvTimedOut, 3, 3, 0, 0, "j"})
	x.adv(99)
	x.wantEvents()
	x.adv(100)
	x.wantEvents(ev{EvGranted, 2, 2, 1, 30, "k"})
	x.absent("j")
	x.acq(101, 4, 4, "m", 10, 0, OK)
	x.stats(2, 2, 0)
}

// An entry is 144 bytes: every idle lock pays for it (bench (d), bytes per idle lock), so a field
// added to entry, or a field order that leaves padding, costs every lock held.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 96 {
		t.Fatalf("entry is %d bytes, want 96", n)
	}
}

// TestKeyStore: every length from 0 to the format's ceiling round-trips through its size class;
// a view ends with its key (an append copies); a released slot keeps its bytes until put takes
// it again, last released first.
func TestKeyStore(t *testing.T) {
	var s keyStore
	type held struct {
		slot int32
		key  []byte
	}
	var all []held
	for _, n := range []int{0, 1, 7, 8, 9, 16, 17, 24, 25, 100, 192, 193, 255, 256, 257, 511, 512, 513, 4096, 40000, 65535} {
		for k := 0; k < 3; k++ {
			key := make([]byte, n)
			for i := range key {
				key[i] = byte(n + k + i)
			}
			all = append(all, held{s.put(key), key})
		}
	}
	for _, h := range all {
		v := s.get(h.slot, uint16(len(h.key)))
		if !bytes.Equal(v, h.key) || cap(v) != len(h.key) {
			t.Fatalf("key of %d bytes in slot %d: got %d bytes (cap %d), different", len(h.key), h.slot, len(v), cap(v))
		}
		if c := keyClassOf(len(h.key)); keySizes[c] < len(h.key) || (c > 0 && keySizes[c-1] >= len(h.key)) {
			t.Fatalf("key of %d bytes in class %d (%d bytes)", len(h.key), c, keySizes[c])
		}
	}
	a, b := all[len(all)-6], all[len(all)-5] // two 40,000-byte keys
	view := s.get(a.slot, uint16(len(a.key)))
	s.release(b.slot, uint16(len(b.key)))
	s.release(a.slot, uint16(len(a.key)))
	if !bytes.Equal(view, a.key) {
		t.Fatal("a released slot's bytes changed before the slot was taken again")
	}
	if got := s.put([]byte("x")); got == a.slot {
		t.Fatal("a 1-byte key took a slot of the 64 KiB class")
	}
	if got := s.put(bytes.Repeat([]byte("y"), 33000)); got != a.slot {
		t.Fatalf("put took slot %d, want the last released %d", got, a.slot)
	}
	if view[0] != 'y' {
		t.Fatal("the retaken slot does not hold the new key")
	}
}
