package locktable

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// ---------------------------------------------------------------------------
// Reference model: the rules of PRODUCT.md written as plainly as possible,
// with maps, slices and linear scans. No performance concerns at all.
//
// Timer ties: every time a deadline is set (a grant's lease, an Extend, a
// lock-delay, a waiter's wait timeout) the model takes the next number of a
// counter; among equal deadlines the smaller number goes first.

type refWaiter struct {
	owner   Owner
	reqID   uint64
	key     string
	lease   int64
	hasWait bool
	waitAt  int64
	waitSeq uint64
	since   int64
}

type refKey struct {
	revocable   bool  // granted while its owner was detached
	linked      bool  // still counted as its owner's (false once the owner was dropped)
	holderLease int64 // the lease the holder's acquire asked for
	queuedMs    uint32
	answers     int // grant answers addressed to a connection (the session model counts them)
	held        bool
	holder      Owner
	holderReq   uint64
	token       uint64
	grantedAt   int64
	deadline    int64
	leaseSeq    uint64
	inDelay     bool
	delayUntil  int64
	delaySeq    uint64
	queue       []*refWaiter
}

type refModel struct {
	detached map[Owner]bool
	// Session grace timers (the session model's): owner -> deadline and its seq.
	sessExp   map[Owner][2]int64
	onSession func(now int64, o Owner) // a grace timer fired
	cfg       Config
	keys      map[string]*refKey
	all       []*refWaiter // every queued acquire, in the order they queued
	seq       uint64
	tok       uint64
	events    []ev
	since     []int64 // Event.Since of each event in events
}

func newRef(cfg Config) *refModel {
	return &refModel{cfg: cfg, keys: map[string]*refKey{}, detached: map[Owner]bool{}, sessExp: map[Owner][2]int64{}}
}

func sat(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

func (m *refModel) grant(now, since int64, k *refKey, o Owner, req uint64, lease int64) uint64 {
	m.tok++
	m.seq++
	k.held, k.holder, k.holderReq, k.token = true, o, req, m.tok
	k.grantedAt, k.deadline, k.leaseSeq = now, sat(now, lease), m.seq
	k.revocable, k.linked, k.holderLease = m.detached[o], true, lease
	k.queuedMs, k.answers = msOf(now-since), 0
	return m.tok
}

func (m *refModel) removeWaiter(w *refWaiter) {
	k := m.keys[w.key]
	for i, x := range k.queue {
		if x == w {
			k.queue = append(k.queue[:i:i], k.queue[i+1:]...)
			break
		}
	}
	for i, x := range m.all {
		if x == w {
			m.all = append(m.all[:i:i], m.all[i+1:]...)
			break
		}
	}
}

func (m *refModel) freeIfIdle(key string) {
	if k, ok := m.keys[key]; ok && !k.held && !k.inDelay && len(k.queue) == 0 {
		delete(m.keys, key)
	}
}

// becameFree: grant the head of the queue, or forget the key.
func (m *refModel) becameFree(now int64, key string) {
	k := m.keys[key]
	if len(k.queue) == 0 {
		delete(m.keys, key)
		return
	}
	w := k.queue[0]
	m.removeWaiter(w)
	tok := m.grant(now, w.since, k, w.owner, w.reqID, w.lease)
	m.events = append(m.events, ev{EvGranted, w.owner, w.reqID, tok, w.lease, key})
	m.since = append(m.since, w.since)
}

func (m *refModel) Acquire(now int64, o Owner, req uint64, key string, lease, wait int64) Result {
	for _, w := range m.all {
		if w.owner == o && w.reqID == req {
			return Result{Status: Duplicate}
		}
	}
	k, present := m.keys[key]
	free := !present || (!k.held && !k.inDelay && len(k.queue) == 0)
	if free {
		if !present {
			if m.cfg.MaxLocks > 0 && len(m.keys) >= m.cfg.MaxLocks {
				return Result{Status: Busy, Limit: LimitLocks}
			}
			k = &refKey{}
			m.keys[key] = k
		}
		return Result{Status: OK, Token: m.grant(now, now, k, o, req, lease)}
	}
	if wait == 0 {
		return Result{Status: TimedOut}
	}
	if m.cfg.MaxWaitersPerKey > 0 && len(k.queue) >= m.cfg.MaxWaitersPerKey {
		return Result{Status: Busy, Limit: LimitWaitersPerKey}
	}
	if m.cfg.MaxWaitersTotal > 0 && len(m.all) >= m.cfg.MaxWaitersTotal {
		return Result{Status: Busy, Limit: LimitWaitersTotal}
	}
	w := &refWaiter{owner: o, reqID: req, key: key, lease: lease, since: now}
	if wait > 0 {
		m.seq++
		w.hasWait, w.waitAt, w.waitSeq = true, sat(now, wait), m.seq
	}
	k.queue = append(k.queue, w)
	m.all = append(m.all, w)
	return Result{Status: Queued}
}

func (m *refModel) Release(now int64, key string, tok uint64) Status {
	k, ok := m.keys[key]
	if !ok || !k.held || k.token != tok {
		return NotHeld
	}
	k.held, k.revocable, k.linked = false, false, false
	m.becameFree(now, key)
	return OK
}

func (m *refModel) Extend(now int64, key string, tok uint64, lease int64) Status {
	k, ok := m.keys[key]
	if !ok || !k.held || k.token != tok {
		return NotHeld
	}
	m.seq++
	k.deadline, k.leaseSeq = sat(now, lease), m.seq
	return OK
}

func (m *refModel) Cancel(o Owner, req uint64) bool {
	for _, w := range m.all {
		if w.owner == o && w.reqID == req {
			m.removeWaiter(w)
			m.freeIfIdle(w.key)
			return true
		}
	}
	return false
}

func (m *refModel) DropOwner(now int64, o Owner) int {
	var mine []*refWaiter
	for _, w := range m.all {
		if w.owner == o {
			mine = append(mine, w)
		}
	}
	for _, w := range mine {
		m.removeWaiter(w)
		m.freeIfIdle(w.key)
	}
	// Its held locks, most recently granted first: revocable ones are revoked, the others
	// forgotten by owner (they run their lease).
	for _, key := range m.heldBy(o) {
		k := m.keys[key]
		if k.revocable {
			k.held, k.revocable, k.linked = false, false, false
			m.becameFree(now, key)
		} else {
			k.linked = false
		}
	}
	delete(m.detached, o)
	return len(mine)
}

// heldBy lists the keys held by owner o (still linked), most recent grant first.
func (m *refModel) heldBy(o Owner) []string {
	var keys []string
	for name, k := range m.keys {
		if k.held && k.linked && k.holder == o {
			keys = append(keys, name)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return m.keys[keys[i]].token > m.keys[keys[j]].token })
	return keys
}

// SetDetached: grants to a detached owner are revocable; attaching makes them ordinary.
func (m *refModel) SetDetached(o Owner, d bool) {
	m.detached[o] = d
	if !d {
		for _, key := range m.heldBy(o) {
			m.keys[key].revocable = false
		}
	}
}

// FindHeld: the key owner o holds through request req.
func (m *refModel) FindHeld(o Owner, req uint64) (string, bool) {
	for _, key := range m.heldBy(o) {
		if m.keys[key].holderReq == req {
			return key, true
		}
	}
	return "", false
}

// Revoke takes back a revocable grant: the lock passes on at once.
func (m *refModel) Revoke(now int64, o Owner, req uint64) bool {
	key, ok := m.FindHeld(o, req)
	if !ok || !m.keys[key].revocable {
		return false
	}
	k := m.keys[key]
	k.held, k.revocable, k.linked = false, false, false
	m.becameFree(now, key)
	return true
}

func (m *refModel) Abort() {
	for len(m.all) > 0 {
		w := m.all[0]
		m.events = append(m.events, ev{EvAborted, w.owner, w.reqID, 0, w.lease, w.key})
		m.since = append(m.since, w.since)
		m.removeWaiter(w)
		m.freeIfIdle(w.key)
	}
}

// next finds the earliest pending deadline: its time, and what it is.
func (m *refModel) next() (at int64, seq uint64, key string, w *refWaiter, ok bool) {
	consider := func(a int64, s uint64, k string, ww *refWaiter) {
		if !ok || a < at || (a == at && s < seq) {
			at, seq, key, w, ok = a, s, k, ww, true
		}
	}
	for name, k := range m.keys {
		if k.held {
			consider(k.deadline, k.leaseSeq, name, nil)
		}
		if k.inDelay {
			consider(k.delayUntil, k.delaySeq, name, nil)
		}
	}
	for _, ww := range m.all {
		if ww.hasWait {
			consider(ww.waitAt, ww.waitSeq, ww.key, ww)
		}
	}
	for o, e := range m.sessExp {
		consider(e[0], uint64(e[1]), sessTimerKey(o), nil)
	}
	return
}

func sessTimerKey(o Owner) string { return fmt.Sprintf("\x00session %d", o) }

func (m *refModel) Advance(now int64) {
	for {
		at, _, key, w, ok := m.next()
		if !ok || at > now {
			return
		}
		if strings.HasPrefix(key, "\x00session ") {
			var o Owner
			fmt.Sscanf(key[len("\x00session "):], "%d", &o)
			delete(m.sessExp, o)
			m.onSession(now, o)
			continue
		}
		k := m.keys[key]
		switch {
		case w != nil:
			m.events = append(m.events, ev{EvTimedOut, w.owner, w.reqID, 0, w.lease, key})
			m.since = append(m.since, w.since)
			m.removeWaiter(w)
			m.freeIfIdle(key)
		case k.held:
			m.events = append(m.events, ev{EvExpired, k.holder, k.holderReq, k.token, 0, key})
			m.since = append(m.since, k.grantedAt)
			k.held, k.revocable, k.linked = false, false, false
			if m.cfg.LockDelay > 0 {
				m.seq++
				k.inDelay, k.delayUntil, k.delaySeq = true, sat(now, m.cfg.LockDelay), m.seq
			} else {
				m.becameFree(now, key)
			}
		default: // lock-delay over
			k.inDelay, k.delayUntil = false, 0
			m.becameFree(now, key)
		}
	}
}

func (m *refModel) NextDeadline() (int64, bool) {
	at, _, _, _, ok := m.next()
	return at, ok
}

func (m *refModel) Inspect(key string) (Info, bool) {
	k, ok := m.keys[key]
	if !ok {
		return Info{}, false
	}
	i := Info{Waiters: len(k.queue)}
	if k.held {
		i.Held, i.Holder, i.HolderReqID, i.Token, i.GrantedAt, i.Deadline = true, k.holder, k.holderReq, k.token, k.grantedAt, k.deadline
		i.Revocable = k.revocable
	}
	if k.inDelay {
		i.DelayUntil = k.delayUntil
	}
	return i, true
}

func (m *refModel) Stats() (keys, held, waiters int) {
	for _, k := range m.keys {
		if k.held {
			held++
		}
	}
	return len(m.keys), held, len(m.all)
}

// ---------------------------------------------------------------------------
// Randomized histories: the same random operations applied to the table and
// to the model; every answer, every event, Stats, NextDeadline and Inspect of
// every key must agree exactly, and the table's invariants must hold.

func TestRandomHistoriesAgainstModel(t *testing.T) {
	configs := []Config{
		{},
		{LockDelay: 15},
		{MaxWaitersPerKey: 4, MaxWaitersTotal: 5, MaxLocks: 3},
		{MaxWaitersPerKey: 2, MaxLocks: 4, LockDelay: 7},
	}
	seeds, ops := 12, 2500
	if testing.Short() {
		seeds, ops = 3, 1000
	}
	for ci, cfg := range configs {
		for s := 0; s < seeds; s++ {
			t.Run(fmt.Sprintf("cfg%d/seed%d", ci, s), func(t *testing.T) {
				runHistory(t, cfg, uint64(ci*1000+s), ops)
			})
		}
	}
}

func runHistory(t *testing.T, cfg Config, seed uint64, nops int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	tb := New(cfg)
	m := newRef(cfg)
	keys := []string{"a", "b", "c", "dd", "a-much-longer-key-name-over-32-bytes!"}
	const owners = 5
	nextReq := [owners]uint64{}
	var granted []uint64 // every token ever handed out
	tokensOf := map[string][]uint64{}
	now := int64(0)
	var log []string
	seen := map[string]int{}

	fail := func(format string, args ...any) {
		t.Helper()
		tail := log
		if len(tail) > 25 {
			tail = tail[len(tail)-25:]
		}
		for _, l := range tail {
			t.Log(l)
		}
		t.Fatalf(format, args...)
	}
	pickToken := func(key string) uint64 {
		switch r := rng.IntN(10); {
		case r < 6:
			if i, ok := m.Inspect(key); ok && i.Held {
				return i.Token
			}
			fallthrough
		case r < 9:
			if ts := tokensOf[key]; len(ts) > 0 {
				return ts[rng.IntN(len(ts))]
			}
			fallthrough
		default:
			if len(granted) > 0 && rng.IntN(2) == 0 {
				return granted[rng.IntN(len(granted))]
			}
			return rng.Uint64N(50)
		}
	}

	compareEvents := func(op int) {
		t.Helper()
		var got []ev
		var gotSince []int64
		for _, e := range tb.Events() {
			gotSince = append(gotSince, e.Since)
			got = append(got, ev{e.Kind, e.Owner, e.ReqID, e.Token, e.Lease, keyOf(e)})
			seen[e.Kind.String()]++
			if e.Kind == EvGranted {
				granted = append(granted, e.Token)
				tokensOf[keyOf(e)] = append(tokensOf[keyOf(e)], e.Token)
			}
		}
		tb.ClearEvents()
		want, wantSince := m.events, m.since
		m.events, m.since = nil, nil
		if len(got) != 0 || len(want) != 0 {
			if !reflect.DeepEqual(got, want) {
				fail("op %d events:\n got %+v\nwant %+v", op, got, want)
			}
			if !reflect.DeepEqual(gotSince, wantSince) {
				fail("op %d event Since: got %v want %v", op, gotSince, wantSince)
			}
			log = append(log, fmt.Sprintf("   events %+v", got))
		}
	}

	for op := 0; op < nops; op++ {
		now += int64(rng.IntN(5))
		if rng.IntN(3) == 0 {
			tb.Advance(now)
			m.Advance(now)
			log = append(log, fmt.Sprintf("%d: Advance(%d)", op, now))
			compareEvents(op)
		}
		key := keys[rng.IntN(len(keys))]
		o := Owner(rng.IntN(owners))
		var desc string
		switch r := rng.IntN(100); {
		case r < 40:
			var req uint64
			if rng.IntN(10) == 0 && nextReq[o] > 0 {
				req = rng.Uint64N(nextReq[o]) // an old id: maybe still queued
				for _, w := range m.all {
					if w.owner == o && rng.IntN(2) == 0 {
						req = w.reqID // a queued one: Duplicate
						break
					}
				}
			} else {
				nextReq[o]++
				req = nextReq[o]
			}
			lease := 1 + int64(rng.IntN(90))
			var wait int64
			switch rng.IntN(5) {
			case 0:
				wait = 0
			case 1:
				wait = -1
			default:
				wait = 1 + int64(rng.IntN(60))
			}
			got := tb.Acquire(now, o, req, []byte(key), lease, wait)
			got.entry = 0 // the entry granted: table memory the model does not have
			want := m.Acquire(now, o, req, key, lease, wait)
			desc = fmt.Sprintf("Acquire(%d, o%d, r%d, %q, lease %d, wait %d) = %+v", now, o, req, key, lease, wait, got)
			if got != want {
				fail("%s, model %+v", desc, want)
			}
			seen[got.Status.String()+"/"+got.Limit.String()]++
			if got.Status == OK {
				granted = append(granted, got.Token)
				tokensOf[key] = append(tokensOf[key], got.Token)
			}
		case r < 60:
			tok := pickToken(key)
			got, want := tb.Release(now, []byte(key), tok), m.Release(now, key, tok)
			desc = fmt.Sprintf("Release(%d, %q, %d) = %v", now, key, tok, got)
			seen["Release/"+got.String()]++
			if got != want {
				fail("%s, model %v", desc, want)
			}
		case r < 70:
			tok := pickToken(key)
			lease := 1 + int64(rng.IntN(40))
			got, want := tb.Extend(now, 0, 0, []byte(key), tok, lease).Status, m.Extend(now, key, tok, lease)
			desc = fmt.Sprintf("Extend(%d, %q, %d, %d) = %v", now, key, tok, lease, got)
			seen["Extend/"+got.String()]++
			if got != want {
				fail("%s, model %v", desc, want)
			}
		case r < 78:
			req := rng.Uint64N(nextReq[o] + 2)
			if len(m.all) > 0 && rng.IntN(3) > 0 {
				w := m.all[rng.IntN(len(m.all))]
				o, req = w.owner, w.reqID
			}
			got, want := tb.Cancel(now, o, req), m.Cancel(o, req)
			desc = fmt.Sprintf("Cancel(%d, o%d, r%d) = %v", now, o, req, got)
			if got != want {
				fail("%s, model %v", desc, want)
			}
		case r < 82:
			got, _ := tb.DropOwner(now, o)
			want := m.DropOwner(now, o)
			desc = fmt.Sprintf("DropOwner(%d, o%d) = %d", now, o, got)
			if got != want {
				fail("%s, model %d", desc, want)
			}
		case r < 83:
			tb.Abort(now)
			m.Abort()
			desc = fmt.Sprintf("Abort(%d)", now)
		default:
			now += int64(rng.IntN(30))
			tb.Advance(now)
			m.Advance(now)
			desc = fmt.Sprintf("Advance(%d)", now)
		}
		log = append(log, fmt.Sprintf("%d: %s", op, desc))

		compareEvents(op)
		// State.
		if err := tb.check(); err != nil {
			fail("op %d invariant: %v", op, err)
		}
		k1, h1, w1 := tb.Stats()
		k2, h2, w2 := m.Stats()
		if k1 != k2 || h1 != h2 || w1 != w2 {
			fail("op %d Stats %d,%d,%d model %d,%d,%d", op, k1, h1, w1, k2, h2, w2)
		}
		d1, ok1 := tb.NextDeadline()
		d2, ok2 := m.NextDeadline()
		if d1 != d2 || ok1 != ok2 {
			fail("op %d NextDeadline %d,%v model %d,%v", op, d1, ok1, d2, ok2)
		}
		for _, k := range keys {
			i1, ok1 := tb.Inspect([]byte(k))
			i2, ok2 := m.Inspect(k)
			if i1 != i2 || ok1 != ok2 {
				fail("op %d Inspect(%q) %+v,%v model %+v,%v", op, k, i1, ok1, i2, ok2)
			}
		}
	}
	t.Logf("outcomes: %v", seen)
	// Tokens: strictly increasing in grant order, never repeated.
	if !sort.SliceIsSorted(granted, func(i, j int) bool { return granted[i] < granted[j] }) {
		t.Fatal("tokens not increasing in grant order")
	}
	for i := 1; i < len(granted); i++ {
		if granted[i] == granted[i-1] {
			t.Fatal("token repeated")
		}
	}
	// Drain: after everything times out or expires, the table is empty.
	tb.Abort(now)
	tb.Advance(math.MaxInt64)
	if k, h, w := tb.Stats(); k != 0 || h != 0 || w != 0 {
		t.Fatalf("not empty after drain: %d %d %d", k, h, w)
	}
}
