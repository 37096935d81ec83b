package locktable

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ticketing/ticketing/wire"
)

// cmdGen produces random command entries: sessions attaching and detaching, batches of every
// request (new ids, retries, reused and stale ids, made-up tokens), time passing (sometimes
// stamped backwards), durable ceilings rising and storage failing. It tracks only what a client
// could know (its ids, tokens it was granted), not the table's state.
type cmdGen struct {
	rng       *rand.Rand
	now       int64
	conn      uint64
	sessions  []genSession
	tokens    []uint64
	ceilTok   uint64
	ceilHz    int64
	enc       Encoder
	count     int
	stopAt    int  // the entry that is a STOP (0: none)
	detachAll bool // also emit DETACH_ALL now and then (a new leader)
	config    bool // also emit CONFIG now and then (a new leader with other limits)
}

type genSession struct {
	id      [wire.SessionIDSize]byte
	conn    uint64 // 0: detached
	last    uint64 // the connection last attached (kept while detached)
	prev    uint64 // the one before it (0: none)
	nextID  uint64
	history []wire.Request // recent requests, for faithful retries
}

func newCmdGen(seed uint64) *cmdGen {
	g := &cmdGen{rng: rand.New(rand.NewPCG(seed, 0xd1ce)), ceilTok: 5}
	for i := 0; i < 12; i++ {
		var s genSession
		binary.BigEndian.PutUint64(s.id[:], uint64(i+1))
		g.sessions = append(g.sessions, s)
	}
	return g
}

var genKeys = []string{"a", "b", "c", "d", "e", "f", "g", "h"}

func (g *cmdGen) key() []byte { return []byte(genKeys[g.rng.IntN(len(genKeys))]) }

func (g *cmdGen) token() uint64 {
	if len(g.tokens) == 0 || g.rng.IntN(8) == 0 {
		return uint64(g.rng.IntN(200) + 1)
	}
	return g.tokens[len(g.tokens)-1-g.rng.IntN(min(len(g.tokens), 6))]
}

func (g *cmdGen) request(s *genSession) wire.Request {
	r := g.newRequest(s)
	if r.Key != nil {
		r.Key = append([]byte(nil), r.Key...)
	}
	s.history = append(s.history, r)
	if len(s.history) > 40 {
		s.history = s.history[1:]
	}
	return r
}

func (g *cmdGen) newRequest(s *genSession) wire.Request {
	var id uint64
	switch r := g.rng.IntN(20); {
	case r < 2 && len(s.history) > 0: // a faithful retry of a recent request
		return s.history[g.rng.IntN(len(s.history))]
	case r == 2 && s.nextID > 1: // an old id with other fields: a bad retry, or reused on this connection
		id = 1 + g.rng.Uint64N(s.nextID-1)
	default:
		s.nextID++
		id = s.nextID
	}
	lease := uint32(1 + g.rng.IntN(300))
	switch g.rng.IntN(10) {
	case 0, 1, 2:
		wait := uint32(g.rng.IntN(400))
		switch g.rng.IntN(4) {
		case 0:
			wait = 0
		case 1:
			wait = wire.WaitForever
		}
		return wire.Request{Op: wire.OpAcquire, ID: id, Key: g.key(), Lease: lease, WaitMs: wait}
	case 3, 4:
		return wire.Request{Op: wire.OpRelease, ID: id, Key: g.key(), Token: g.token()}
	case 5:
		return wire.Request{Op: wire.OpExtend, ID: id, Key: g.key(), Token: g.token(), Lease: lease}
	case 6:
		return wire.Request{Op: wire.OpCancel, ID: id, Token: max(1, id-uint64(g.rng.IntN(4)))}
	case 7:
		return wire.Request{Op: wire.OpInspect, ID: id, Key: g.key(), Token: g.token() * uint64(g.rng.IntN(2))}
	case 8:
		return wire.Request{Op: wire.OpAck, ID: id, Token: id - uint64(g.rng.IntN(int(min(id, 20))))}
	}
	return wire.Request{Op: wire.OpPing, ID: id}
}

// next returns the next entry (valid until the following call).
func (g *cmdGen) next() []byte {
	g.count++
	if g.count == g.stopAt {
		g.enc.Reset(g.now)
		g.enc.Stop()
		return g.enc.Bytes()
	}
	g.now += int64(g.rng.IntN(40)) * nsPerMs
	stamp := g.now
	if g.rng.IntN(30) == 0 {
		stamp -= int64(g.rng.IntN(50)) * nsPerMs // a late stamp: apply keeps time monotonic
	}
	g.enc.Reset(stamp)
	for n := 1 + g.rng.IntN(3); n > 0; n-- {
		s := &g.sessions[g.rng.IntN(len(g.sessions))]
		switch r := g.rng.IntN(20); {
		case r < 2:
			g.conn++
			if s.last != 0 {
				s.prev = s.last
			}
			s.conn, s.last = g.conn, g.conn
			g.enc.Attach(&s.id, s.conn, uint32(g.rng.IntN(3)*150))
		case r < 4 && s.conn != 0:
			g.enc.Detach(&s.id, s.conn)
			s.conn = 0
		case r == 4:
			g.enc.Tick()
		case r == 5:
			g.ceilTok += uint64(g.rng.IntN(12))
			g.ceilHz = max(g.ceilHz, g.now+int64(g.rng.IntN(600))*nsPerMs)
			g.enc.Ceiling(g.ceilTok, g.ceilHz)
		case r == 6 && g.rng.IntN(4) == 0:
			g.enc.Storage(g.rng.IntN(2) == 0)
		case r == 8 && g.detachAll && g.rng.IntN(10) == 0:
			g.enc.DetachAll()
			for k := range g.sessions {
				g.sessions[k].conn = 0
			}
		case r == 9 && g.config && g.rng.IntN(15) == 0:
			g.enc.Config(g.limits())
		case r == 7 && s.conn != 0 && len(s.history) > 0:
			g.enc.Undelivered(&s.id, s.conn, s.history[g.rng.IntN(len(s.history))].ID)
			s.conn = 0
		case r == 7 && s.prev != 0 && len(s.history) > 0:
			// A grant for an older connection found dropped late (in a cluster the command is
			// applied after the session moved on): it must change nothing.
			g.enc.Undelivered(&s.id, s.prev, s.history[g.rng.IntN(len(s.history))].ID)
		default:
			conn := s.conn
			if g.rng.IntN(25) == 0 {
				conn = g.conn + 1 // a stale or unknown connection: ignored
			}
			g.enc.Requests(&s.id, conn)
			for k := 1 + g.rng.IntN(4); k > 0; k-- {
				r := g.request(s)
				g.enc.Request(&r)
			}
		}
	}
	return g.enc.Bytes()
}

// limits returns random limits small enough to be reached (0: unlimited or the default).
func (g *cmdGen) limits() Limits {
	pick := func(lo, hi int) int {
		if g.rng.IntN(4) == 0 {
			return 0
		}
		return lo + g.rng.IntN(hi-lo+1)
	}
	return Limits{MaxWaitersPerKey: pick(1, 6), MaxWaitersTotal: pick(4, 30), MaxLocks: pick(3, 8),
		LockDelay: int64(pick(1, 40)) * nsPerMs, MaxSessions: pick(3, 12), MaxOutcomes: pick(4, 40), MaxQueued: pick(1, 5)}
}

// learn records the tokens granted in outputs, as clients would.
func (g *cmdGen) learn(outs []Out) {
	for _, o := range outs {
		if o.Resp.Op == wire.OpAcquire && o.Resp.Status == wire.StatusOK && o.Resp.Token != 0 {
			g.tokens = append(g.tokens, o.Resp.Token)
		}
	}
}

// outDigest folds outputs into a running hash.
func outDigest(h []byte, outs []Out) []byte {
	d := sha256.New()
	d.Write(h)
	for _, o := range outs {
		fmt.Fprintf(d, "%d|%d|%d|%d|%d|%d|%d|%d|%x|%v|%d|%v|%d|%v;", o.Conn, o.Resp.Op, o.Resp.Status, o.Resp.ID, o.Resp.Token,
			o.Resp.Lease, o.Resp.Detail, len(o.Resp.Data), o.Resp.Data, o.Attached, o.Owner, o.Resumed, o.Prev, o.Busy)
	}
	return d.Sum(nil)
}

func applyOrFail(t *testing.T, tb *Table, e []byte, reqs []wire.Request) []wire.Request {
	t.Helper()
	reqs, err := tb.Apply(e, reqs)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// TestDeterminismWithSnapshot: random commands give identical outputs and an identical state
// hash whether applied straight through, or snapshotted at a random index, restored into a
// fresh table and continued; and the restored table equals the original at the snapshot.
func TestDeterminismWithSnapshot(t *testing.T) {
	const n = 100_000
	cfg := Config{Durable: true, LockDelay: 20 * nsPerMs, MaxWaitersPerKey: 6, MaxSessions: 10, MaxOutcomes: 40, MaxQueued: 5}
	seeds := uint64(2)
	if raceOn {
		seeds = 1
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		cut := 1 + rng.IntN(n-1)
		ga, gb := newCmdGen(seed), newCmdGen(seed)
		ga.stopAt, gb.stopAt = n-2000, n-2000
		ga.config, gb.config = true, true
		// Restored tables get other limits from their Config: the snapshot's (the replicated
		// ones, last set by CONFIG or by New) must win.
		rcfg := Config{Durable: true, MaxWaitersPerKey: 1, MaxSessions: 2}
		a, b := New(cfg), New(cfg)
		var ha, hb []byte
		var ra, rb []wire.Request
		var restored *Table
		restoredWaiters := 0
		for i := 0; i < n; i++ {
			ea := ga.next()
			ra = applyOrFail(t, a, ea, ra)
			ha = outDigest(ha, a.Outs())
			ga.learn(a.Outs())
			a.ClearOuts()
			if i%997 == 0 {
				if err := a.check(); err != nil {
					t.Fatalf("seed %d entry %d: invariant: %v", seed, i, err)
				}
				// Snapshot round trip on whatever state this is.
				snap := a.Snapshot()
				x, err := Restore(rcfg, snap)
				if err != nil {
					t.Fatalf("seed %d entry %d: restore: %v", seed, i, err)
				}
				if err := x.check(); err != nil {
					t.Fatalf("seed %d entry %d: restored invariant: %v", seed, i, err)
				}
				if string(x.Snapshot()) != string(snap) {
					t.Fatalf("seed %d entry %d: snapshot of the restored table differs", seed, i)
				}
				_, _, w := a.Stats()
				restoredWaiters += w
			}

			eb := gb.next()
			if i == cut {
				snap := b.Snapshot()
				var err error
				restored, err = Restore(rcfg, snap)
				if err != nil {
					t.Fatalf("seed %d: restore at %d: %v", seed, cut, err)
				}
				if restored.StateHash() != b.StateHash() {
					t.Fatalf("seed %d: restored table differs from the original at %d", seed, cut)
				}
				if err := restored.check(); err != nil {
					t.Fatalf("seed %d: restored table invariant: %v", seed, err)
				}
				b = restored
			}
			rb = applyOrFail(t, b, eb, rb)
			hb = outDigest(hb, b.Outs())
			gb.learn(b.Outs())
			b.ClearOuts()
			if string(ha) != string(hb) {
				t.Fatalf("seed %d: outputs diverge at entry %d (snapshot at %d)", seed, i, cut)
			}
		}
		if a.StateHash() != b.StateHash() {
			t.Fatalf("seed %d: final state hashes differ (snapshot at %d)", seed, cut)
		}
		keys, held, waiters := a.Stats()
		t.Logf("seed %d: %d entries, snapshot at %d; final %d keys, %d held, %d waiting, %d sessions, token %d; %d waiters restored",
			seed, n, cut, keys, held, waiters, a.Sessions(), a.LastToken(), restoredWaiters)
		if restoredWaiters == 0 {
			t.Fatalf("seed %d: no snapshot had a waiter: the workload is too thin", seed)
		}
	}
}
