package cluster

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// Chaos: real nodes whose raft links run through proxies the test controls, a lock workload
// on a few keys, and a nemesis that injects one fault per window (SIGKILL and restart of the
// leader, SIGSTOP of a node for 2–5 s, a node cut off, a link cut in one or both directions,
// the leader's log store stalled, a leadership transfer; on 5 nodes two nodes at a time), each
// followed by a settle period. Every fault kind runs at least once, in a shuffled order, and
// the cycle repeats until the duration has passed. Afterwards the history is checked
// (history_test.go) and every node must reach the same state hash at the same applied index.
//
// `make test` runs a bounded window; `make chaos` (or -args -chaos.duration=10m) a soak.

var (
	chaosDuration = flag.Duration("chaos.duration", 0, "chaos tests: how long the nemesis runs (0: the bounded default of make test)")
	chaosSeed     = flag.Uint64("chaos.seed", 0, "chaos tests: seed of the nemesis and the workload (0: from the clock)")
)

type chaosConfig struct {
	nodes    int
	duration time.Duration // default nemesis time (overridden by -chaos.duration)
	faults   []string
	workers  int
	keys     int
}

func chaosSeedValue(t *testing.T) uint64 {
	s := *chaosSeed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -args -chaos.seed=%d)", s, s)
	return s
}

// runChaos runs one chaos scenario end to end.
func runChaos(t *testing.T, cfg chaosConfig) {
	seed := chaosSeedValue(t)
	dur := cfg.duration
	if *chaosDuration > 0 {
		dur = *chaosDuration
	}
	// Snapshots every couple of hundred entries, and few entries kept after one: followers that
	// lag and nodes that restart come back through snapshots (InstallSnapshot, Restore) all the
	// time, while sessions hold several grants.
	p := newClusterWith(t, clusterSpec{n: cfg.nodes, proxied: true, env: []string{
		"TICKETING_RAFT_SNAPSHOT_THRESHOLD=200", "TICKETING_RAFT_SNAPSHOT_INTERVAL=200ms", "TICKETING_RAFT_TRAILING_LOGS=50",
		"TICKETING_TEST_STATE_HASH_EVERY=20"}})
	stallDir := t.TempDir()
	for _, nd := range p.nodes {
		nd.env = append(nd.env, "TICKETING_FAILPOINT_STALL_FILE="+filepath.Join(stallDir, "stall-"+nd.id))
	}
	p.startAll()
	p.leader(20 * time.Second)

	h := newHistory()
	h.visualize = true
	var keys []string
	for i := 0; i < cfg.keys; i++ {
		keys = append(keys, fmt.Sprintf("chaos-%d", i))
	}
	w := &workload{h: h, eps: p.clientAddrs(), keys: keys, leaseMs: 2000, waits: []uint32{0, 400, 1500},
		holdMin: 5 * time.Millisecond, holdMax: 40 * time.Millisecond, opTimeout: 20 * time.Second,
		hb: 500 * time.Millisecond, seed: seed, abandonPct: 2, longPct: 10}
	tokStart := probeToken(t, w.eps, "probe-start")

	stop := make(chan struct{})
	done := w.start(cfg.workers, stop)
	// Official clients on the same keys: two Go client objects and two Python ones, three
	// workers each (one session, three acquires in flight).
	cc := &clientChaos{h: h, eps: w.eps, keys: keys, lease: 2 * time.Second, opTimeout: w.opTimeout, seed: seed,
		waits: []time.Duration{0, 400 * time.Millisecond, 1500 * time.Millisecond}}
	cc.nextID.Store(1000)
	goDone := cc.runGo(t, 2, 3, stop)
	pyDone := cc.runPy(t, startPyDriver(t), 2, 3, stop)
	// Sessions that die with several acquires in flight, on keys of their own (their grants
	// are ghosts to the checker: nobody knows of them, and they hold keys for up to the grace),
	// and droppers on keys of their own (lease 8 s, longer than the session grace).
	dieKeys := []string{"chaos-die-0", "chaos-die-1", "chaos-die-2", "chaos-die-3", "chaos-die-4", "chaos-die-5"}
	dropKeys := []string{"chaos-drop-0", "chaos-drop-1", "chaos-drop-2", "chaos-drop-3", "chaos-drop-4", "chaos-drop-5"}
	var side sync.WaitGroup
	for i := 0; i < 3; i++ {
		side.Add(1)
		go func() { defer side.Done(); w.dier(500+i, dieKeys, stop) }()
	}
	for i, k := range dropKeys {
		side.Add(2)
		go func() { defer side.Done(); w.dropper(600+2*i, k, 8000, stop) }()
		go func() { defer side.Done(); w.dropper(601+2*i, k, 8000, stop) }()
	}
	sideDone := make(chan struct{})
	go func() { side.Wait(); close(sideDone) }()
	n := &nemesis{t: t, p: p, h: h, rng: rand.New(rand.NewPCG(seed, 0x6e656d)), faults: map[string]int{}, stallDir: stallDir}
	n.run(cfg.faults, time.Now().Add(dur))
	n.healEverything()
	time.Sleep(time.Second) // the workload runs on a healed cluster for a moment
	close(stop)
	finished := time.After(3*w.opTimeout + 30*time.Second) // an acquire, a release and an ACK in flight; a dropper's wait
	for _, ch := range []<-chan struct{}{done, goDone, pyDone, sideDone} {
		select {
		case <-ch:
		case <-finished:
			t.Fatal("the workers did not finish")
		}
	}
	n.report()
	w.report(t)
	cc.report(t)

	tokEnd := probeToken(t, w.eps, "probe-end")
	waitKeysFree(t, w.eps, append(append(w.keys, dieKeys...), dropKeys...), 2*8*time.Second+15*time.Second)
	res := h.check(t, tokStart, tokEnd)
	t.Logf("checked: %d operations, %d grants (%d never released, %d lapsed before release, %d EXPIRED notices), %d timed out, %d acquires and %d releases with unknown outcomes; porcupine %v",
		res.ops, res.grants, res.abandoned, res.lapsed, res.expiredPushes, res.timedOut, res.unknownAcquires, res.unknownOther, res.porcupine.Round(time.Millisecond))
	if res.grants < 10*cfg.workers {
		t.Errorf("only %d grants: the workload made too little progress to check anything", res.grants)
	}
	st := p.waitConverged(30 * time.Second)
	t.Logf("all %d nodes at applied index %d with state hash %.16s…", cfg.nodes, st.AppliedIndex, st.StateHash)
	p.checkStateHashes()
}

// TestChaos3Nodes: 3 nodes, every fault kind in turn (shuffled), history checked. A leadership
// transfer is not a fault, but it changes leaders while locks are held, cheaply and often.
func TestChaos3Nodes(t *testing.T) {
	runChaos(t, chaosConfig{nodes: 3, duration: 25 * time.Second, workers: 6, keys: 3,
		faults: []string{"kill-leader", "kill-follower", "pause-node", "isolate-node", "cut-link", "cut-link-one-way", "stall-leader-disk", "transfer-leader", "dir-as-single-node"}})
}

// TestChaos5NodesTwoDown: 5 nodes; two of them at once are killed (the leader among them, or
// two followers), cut off together from the other three, or paused.
func TestChaos5NodesTwoDown(t *testing.T) {
	runChaos(t, chaosConfig{nodes: 5, duration: 20 * time.Second, workers: 6, keys: 3,
		faults: []string{"kill-two-with-leader", "kill-two-followers", "kill-follower", "isolate-two-with-leader", "pause-two"}})
}

// workload is a set of workers that acquire a random key, write to its fenced register,
// hold it briefly and release it, each on its own session.
type workload struct {
	h                *history
	eps              []string
	keys             []string
	leaseMs          uint32
	waits            []uint32
	holdMin, holdMax time.Duration
	opTimeout        time.Duration
	hb               time.Duration
	seed             uint64
	abandonPct       int // grants never released (their lease runs out), in percent
	longPct          int // grants held for lease/8 to 3·lease/8 instead of holdMin..holdMax, in percent

	mu       sync.Mutex
	stats    sessionStats
	sessions int
	drops    map[string]int // dropper (chaos_clients_test.go)
}

// start runs the workers until stop is closed; the channel it returns is closed when they have
// all returned.
func (w *workload) start(workers int, stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.worker(i, stop)
		}()
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

func (w *workload) newSession(id int) *session {
	s := newSession(w.eps, w.hb)
	s.onPush = func(r wire.Response, at time.Time) { w.h.pushed(id, r, at) }
	return s
}

func (w *workload) retire(s *session) {
	s.close()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sessions++
	w.stats.connects += s.stats.connects
	w.stats.goaways += s.stats.goaways
	w.stats.notLeader += s.stats.notLeader
	w.stats.resends += s.stats.resends
	w.stats.pings += s.stats.pings
	w.stats.deadConns += s.stats.deadConns
	w.stats.reconnecting += s.stats.reconnecting
	w.stats.longestReconnect = max(w.stats.longestReconnect, s.stats.longestReconnect)
}

func (w *workload) worker(id int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(w.seed, uint64(id)+1))
	s := w.newSession(id)
	defer func() { w.retire(s) }()
	fresh := func() {
		w.retire(s)
		s = w.newSession(id)
	}
	for {
		select {
		case <-stop:
			return
		default:
		}
		key := w.keys[rng.IntN(len(w.keys))]
		wait := w.waits[rng.IntN(len(w.waits))]
		c := s.do(acquire(0, key, w.leaseMs, wait), time.Now().Add(w.opTimeout))
		g := w.h.acquired(id, key, w.leaseMs, c)
		if c.outcome == unknownOutcome {
			fresh()
			continue
		}
		if g.out == outGrant {
			deadline := w.h.origin.Add(time.Duration(g.deadline))
			w.h.write(key, g.token, deadline)
			if rng.IntN(100) < w.abandonPct {
				// A holder that never releases (as if it hung): the lease ends it, on the
				// leader of the moment, never before the holder's local deadline.
				w.h.abandoned(id, g)
				continue
			}
			hold := w.holdMin + time.Duration(rng.Int64N(int64(w.holdMax-w.holdMin)+1))
			if rng.IntN(100) < w.longPct {
				// Long enough to be held across a fault more often.
				hold = time.Duration(w.leaseMs)*time.Millisecond/8 + time.Duration(rng.Int64N(int64(time.Duration(w.leaseMs)*time.Millisecond/4)))
			}
			time.Sleep(hold)
			w.h.write(key, g.token, deadline)
			rc := s.do(release(0, key, g.token), time.Now().Add(w.opTimeout))
			w.h.released(id, g, rc)
			if rc.outcome == unknownOutcome {
				fresh()
				continue
			}
		} else {
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
		if s.answers >= 256 && !s.ack(time.Now().Add(w.opTimeout)) {
			fresh()
		}
	}
}

func (w *workload) report(t *testing.T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("clients: %d sessions, %d connects, %d GOAWAY, %d NOT_LEADER, %d re-sent requests, %d heartbeat PINGs, %d connections given up as dead; reconnecting %v in all, longest %v; droppers %v",
		w.sessions, w.stats.connects, w.stats.goaways, w.stats.notLeader, w.stats.resends, w.stats.pings, w.stats.deadConns,
		w.stats.reconnecting.Round(time.Millisecond), w.stats.longestReconnect.Round(time.Millisecond), w.drops)
}

// probeToken takes and releases key on a fresh session and returns the token: the cluster's
// token counter at that moment.
func probeToken(t *testing.T, eps []string, key string) uint64 {
	t.Helper()
	s := newSession(eps, 500*time.Millisecond)
	defer s.close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		c := s.do(acquire(0, key, 1000, 0), deadline)
		if c.outcome != answered || c.resp.Status != wire.StatusOK {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		r := s.do(release(0, key, c.resp.Token), deadline)
		if r.outcome != answered || r.resp.Status != wire.StatusOK {
			t.Errorf("probe %s: the release of token %d, granted %v before, was answered %v %s",
				key, c.resp.Token, r.ret.Sub(c.ret).Round(time.Millisecond), r.resp.Status, r.why)
		}
		return c.resp.Token
	}
	t.Fatalf("probe %s: no grant within 30s", key)
	return 0
}

// waitKeysFree waits until none of keys is held or waited for (every lease and session has run
// out).
func waitKeysFree(t *testing.T, eps, keys []string, within time.Duration) {
	t.Helper()
	s := newSession(eps, 500*time.Millisecond)
	defer s.close()
	deadline := time.Now().Add(within)
	var busy []string
	for time.Now().Before(deadline) {
		busy = busy[:0]
		for _, k := range keys {
			c := s.do(wire.Request{Op: wire.OpInspect, Key: []byte(k)}, deadline)
			if c.outcome != answered || c.resp.Status != wire.StatusOK || len(c.resp.Data) < wire.InspectDataSize {
				busy = append(busy, k+": no answer")
				continue
			}
			flags := binary.BigEndian.Uint32(c.resp.Data[8:12])
			if flags&wire.InspectHeld != 0 || c.resp.Detail != 0 {
				busy = append(busy, fmt.Sprintf("%s: held=%v waiters=%d", k, flags&wire.InspectHeld != 0, c.resp.Detail))
			}
		}
		if len(busy) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("keys still held or waited for %v after the workload: %s", within, strings.Join(busy, ", "))
}

// nemesis injects one fault at a time and waits for the cluster to settle after each.
type nemesis struct {
	t        *testing.T
	p        *proc
	h        *history
	rng      *rand.Rand
	faults   map[string]int
	log      []string
	stallDir string
}

func (n *nemesis) logf(format string, args ...any) {
	n.log = append(n.log, fmt.Sprintf("%8v ", time.Since(n.h.origin).Round(time.Millisecond))+fmt.Sprintf(format, args...))
}

// run cycles through kinds, shuffled each round: one whole round, then more until until.
func (n *nemesis) run(kinds []string, until time.Time) {
	time.Sleep(time.Second) // the workload runs unfaulted first
	for round := 0; round == 0 || time.Now().Before(until); round++ {
		order := append([]string(nil), kinds...)
		n.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			if round > 0 && !time.Now().Before(until) {
				return
			}
			n.fault(k)
			n.faults[k]++
			n.settle()
		}
	}
}

func (n *nemesis) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(n.rng.Int64N(int64(hi-lo)+1))
}

func (n *nemesis) leaderIndex() int {
	l := n.p.leader(20 * time.Second)
	for i, nd := range n.p.nodes {
		if nd == l {
			return i
		}
	}
	return -1
}

// others returns k distinct node indexes other than not, in random order.
func (n *nemesis) others(not int, k int) []int {
	var c []int
	for i := range n.p.nodes {
		if i != not {
			c = append(c, i)
		}
	}
	n.rng.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
	return c[:k]
}

func (n *nemesis) mode() linkMode {
	if n.rng.IntN(2) == 0 {
		return linkBlackhole
	}
	return linkReset
}

var modeNames = map[linkMode]string{linkBlackhole: "blackhole", linkReset: "reset"}

func (n *nemesis) fault(kind string) {
	p := n.p
	nodes := p.nodes
	switch kind {
	case "kill-leader":
		l := n.leaderIndex()
		down := n.between(300*time.Millisecond, 1500*time.Millisecond)
		n.logf("SIGKILL leader %s, restart after %v", nodes[l].id, down)
		p.kill(nodes[l])
		time.Sleep(down)
		p.start(nodes[l])
	case "pause-node", "pause-two":
		l := n.leaderIndex()
		var victims []int
		if kind == "pause-two" {
			victims = append([]int{l}, n.others(l, 1)...)
			if n.rng.IntN(2) == 0 {
				victims = n.others(l, 2)
			}
		} else if n.rng.IntN(2) == 0 {
			victims = []int{l}
		} else {
			victims = n.others(l, 1)
		}
		d := n.between(2*time.Second, 5*time.Second)
		n.logf("SIGSTOP %s for %v (leader %s)", ids(nodes, victims), d, nodes[l].id)
		for _, i := range victims {
			p.pause(nodes[i])
		}
		time.Sleep(d)
		for _, i := range victims {
			p.resume(nodes[i])
		}
	case "isolate-node":
		l := n.leaderIndex()
		v := l
		if n.rng.IntN(2) == 0 {
			v = n.others(l, 1)[0]
		}
		m, d := n.mode(), n.between(2*time.Second, 4*time.Second)
		n.logf("cut off %s (%s) for %v (leader %s)", nodes[v].id, modeNames[m], d, nodes[l].id)
		p.links.isolate(v, m)
		time.Sleep(d)
		p.links.healAll()
	case "cut-link", "cut-link-one-way":
		l := n.leaderIndex()
		f := n.others(l, 1)[0]
		m, d := n.mode(), n.between(2*time.Second, 4*time.Second)
		if kind == "cut-link" {
			n.logf("cut %s<->%s (%s) for %v", nodes[l].id, nodes[f].id, modeNames[m], d)
			p.links.cut(l, f, m)
			p.links.cut(f, l, m)
		} else {
			n.logf("cut %s->%s only (%s) for %v", nodes[l].id, nodes[f].id, modeNames[m], d)
			p.links.cut(l, f, m)
		}
		time.Sleep(d)
		p.links.healAll()
	case "stall-leader-disk":
		// The leader's log writes block (a failpoint) while it keeps sending heartbeats; it must
		// hand over, or stop, within a bound (stall.go).
		l := n.leaderIndex()
		f := filepath.Join(n.stallDir, "stall-"+nodes[l].id)
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			n.t.Fatal(err)
		}
		start := time.Now()
		var nl *node
		for time.Since(start) < 15*time.Second && nl == nil {
			for i, nd := range nodes {
				if i != l && p.running(nd) && !nd.paused {
					if st, _ := probe(nd.addr); st == wire.StatusOK {
						nl = nd
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(start)
		os.Remove(f)
		if nl == nil {
			n.t.Errorf("the leader %s stalled on its log store and no other node took over within %v", nodes[l].id, took.Round(time.Millisecond))
		} else {
			n.logf("stalled the log store of leader %s: %s serving after %v", nodes[l].id, nl.id, took.Round(time.Millisecond))
		}
		time.Sleep(200 * time.Millisecond)
		if !p.running(nodes[l]) {
			n.logf("  %s stopped itself (exit status %d); restarting it", nodes[l].id, p.exitCode(nodes[l]))
			p.start(nodes[l])
		}
	case "kill-follower":
		// A follower comes back from its own latest snapshot and replays the log after it:
		// the entries it replays must do exactly what they did the first time.
		f := n.others(n.leaderIndex(), 1)[0]
		n.logf("SIGKILL follower %s, restart at once", nodes[f].id)
		p.kill(nodes[f])
		p.start(nodes[f])
	case "dir-as-single-node":
		// An operator starts a follower's data directory without its cluster settings: the
		// binary must refuse (a single node there would issue the cluster's tokens again and
		// grant keys its holders hold), and the node then rejoins as it was.
		l := n.leaderIndex()
		f := nodes[n.others(l, 1)[0]]
		if _, ok := p.terminate(f, 20*time.Second); !ok {
			n.t.Errorf("%s did not stop within 20s of SIGTERM", f.id)
		}
		code, out := p.runSingle(f, 15*time.Second)
		switch {
		case code < 0:
			n.t.Errorf("%s's data directory started a single node (it ran for 15s):\n%s", f.id, out)
		case code == 0 || !strings.Contains(out, "TICKETING_NODE_ID"):
			n.t.Errorf("%s's data directory as a single node: exit status %d, want a refusal naming TICKETING_NODE_ID:\n%s", f.id, code, out)
		}
		n.logf("started %s's data directory as a single node: refused (exit status %d); %s restarted as a cluster node", f.id, code, f.id)
		p.start(f)
	case "transfer-leader":
		// Leadership churn: three transfers in a row, each while locks are held and waited for.
		for i := 0; i < 3; i++ {
			l := n.leaderIndex()
			to := n.others(l, 1)[0]
			code, body := adminPost(nodes[l], "/cluster/transfer", fmt.Sprintf(`{"id": %q}`, nodes[to].id))
			n.logf("leadership transfer %s -> %s: %d", nodes[l].id, nodes[to].id, code)
			if code != 200 {
				n.logf("  %s", body)
			}
			time.Sleep(n.between(200*time.Millisecond, 500*time.Millisecond))
		}
	case "kill-two-with-leader", "kill-two-followers":
		l := n.leaderIndex()
		victims := append([]int{l}, n.others(l, 1)...)
		if kind == "kill-two-followers" {
			victims = n.others(l, 2)
		}
		down := n.between(2*time.Second, 4*time.Second)
		n.logf("SIGKILL %s (leader %s), restart after %v", ids(nodes, victims), nodes[l].id, down)
		for _, i := range victims {
			p.kill(nodes[i])
		}
		time.Sleep(down)
		for _, i := range victims {
			p.start(nodes[i])
		}
	case "isolate-two-with-leader":
		l := n.leaderIndex()
		minority := append([]int{l}, n.others(l, 1)...)
		in := map[int]bool{minority[0]: true, minority[1]: true}
		m, d := n.mode(), n.between(2*time.Second, 4*time.Second)
		n.logf("partition %s | rest (%s) for %v", ids(nodes, minority), modeNames[m], d)
		for i := range nodes {
			for j := range nodes {
				if i != j && in[i] != in[j] {
					p.links.cut(i, j, m)
				}
			}
		}
		time.Sleep(d)
		p.links.healAll()
	default:
		n.t.Fatalf("unknown fault %q", kind)
	}
}

// settle waits for a serving leader with every node up and links healed, then a short pause.
func (n *nemesis) settle() {
	start := time.Now()
	l := n.p.leader(20 * time.Second)
	n.logf("  leader %s serving after %v", l.id, time.Since(start).Round(time.Millisecond))
	time.Sleep(n.between(500*time.Millisecond, 1200*time.Millisecond))
}

// healEverything undoes every fault still in place.
func (n *nemesis) healEverything() {
	n.p.links.healAll()
	for _, nd := range n.p.nodes {
		n.p.resume(nd)
		if !n.p.running(nd) {
			n.p.start(nd)
		}
	}
}

func (n *nemesis) report() {
	var k []string
	for f, c := range n.faults {
		k = append(k, fmt.Sprintf("%s×%d", f, c))
	}
	sort.Strings(k)
	n.t.Logf("faults: %s\n%s", strings.Join(k, " "), strings.Join(n.log, "\n"))
}

func ids(nodes []*node, idx []int) string {
	var s []string
	for _, i := range idx {
		s = append(s, nodes[i].id)
	}
	return strings.Join(s, "+")
}
