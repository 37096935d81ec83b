package cluster

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/ticketing/ticketing/wire"
)

// The checker of a lock workload under faults. Workers record every ACQUIRE and RELEASE with
// its real-time interval (from the first transmission to the answer, both read from this
// process's monotonic clock), every hold (from the grant's answer to the release's first
// transmission or the holder's local deadline, whichever comes first), every write to a fenced
// register, and every EXPIRED notice. At the end:
//
//   - no two holds of one key overlap in real time (a holder believes it holds the lock until
//     its local deadline, t_send + (detail + lease)·(1 − 2ρ), PROTOCOL.md "The lost signal");
//   - the fenced register of a key never sees a token lower than one it accepted, from a writer
//     that still believed it held the lock;
//   - each key's history is linearizable (porcupine) against a lock with leases: operations
//     whose outcome is unknown end at infinity and may or may not have taken effect;
//   - every grant is accounted for: tokens are unique, the tokens the cluster handed out
//     between two probe grants are exactly the known grants plus some of the acquires with an
//     unknown outcome, and no lock was taken back before its holder's local deadline.

const rho = float64(wire.ClockRateBoundPPM) / 1e6

type opKind uint8

const (
	opAcquire opKind = iota
	opRelease
)

type outKind uint8

const (
	outGrant    outKind = iota // ACQUIRE OK
	outTimedOut                // ACQUIRE TIMED_OUT
	outReleased                // RELEASE OK
	outNotHeld                 // RELEASE NOT_HELD
	outRefused                 // BUSY or SHUTTING_DOWN: the request did not run
	outMaybe                   // a retried ACQUIRE answered NOT_HELD: granted and since ended, or never run
	outUnknown                 // no answer: may have run, or may still run
)

var outNames = map[outKind]string{outGrant: "granted", outTimedOut: "timed out", outReleased: "released",
	outNotHeld: "not held", outRefused: "refused", outMaybe: "maybe", outUnknown: "unknown"}

// histOp is one operation of the history; times are ns since the history's origin.
type histOp struct {
	worker   int
	key      string
	kind     opKind
	token    uint64 // RELEASE: the token released; ACQUIRE: the token granted
	leaseNs  int64  // ACQUIRE: the lease as the client may count it, lease·(1 − 2ρ)
	call     int64
	ret      int64 // math.MaxInt64 when the outcome is unknown
	out      outKind
	deadline int64 // ACQUIRE granted: the holder's local deadline
	sends    int
}

func (o histOp) String() string {
	ret := "∞"
	if o.ret != math.MaxInt64 {
		ret = fmt.Sprint(time.Duration(o.ret))
	}
	switch o.kind {
	case opAcquire:
		s := fmt.Sprintf("w%d acquire(%s) [%v, %s] -> %s", o.worker, o.key, time.Duration(o.call), ret, outNames[o.out])
		if o.out == outGrant {
			s += fmt.Sprintf(" token %d until %v", o.token, time.Duration(o.deadline))
		}
		return s
	default:
		return fmt.Sprintf("w%d release(%s, %d) [%v, %s] -> %s", o.worker, o.key, o.token, time.Duration(o.call), ret, outNames[o.out])
	}
}

// hold is the interval in which a worker believed it held key with token.
type hold struct {
	worker     int
	key        string
	token      uint64
	start, end time.Time
}

type pushRec struct {
	worker int
	token  uint64
	key    string
	reason uint32
	at     time.Time
}

type register struct {
	max              uint64
	accepted, stale  int // writes accepted; writes skipped because the writer's lease had passed
	rejectedInLease  int
	lastTokenWritten uint64
}

// history collects a workload's record; safe for concurrent workers.
type history struct {
	origin    time.Time
	visualize bool // write a porcupine visualization of a key whose history is not linearizable

	mu         sync.Mutex
	ops        []histOp
	holds      []hold
	pushes     []pushRec
	regs       map[string]*register
	violations []string
	lapsed     int // grants whose local deadline passed before their release was sent
	abandons   int // grants never released
	ghosts     int // acquires of dead sessions, outside the linearizability check: tokens only
	statuses   map[string]int
}

func newHistory() *history {
	return &history{origin: time.Now(), regs: map[string]*register{}, statuses: map[string]int{}}
}

func (h *history) ns(t time.Time) int64 { return int64(t.Sub(h.origin)) }

func (h *history) violate(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.violations) < 100 {
		h.violations = append(h.violations, fmt.Sprintf(format, args...))
	}
}

func (h *history) count(what string) {
	h.mu.Lock()
	h.statuses[what]++
	h.mu.Unlock()
}

// localDeadline is PROTOCOL.md's deadline for a granted ACQUIRE, whichever transmission the
// answer was for: the first transmission plus (detail + lease)·(1 − 2ρ) (the rule every client
// follows).
func localDeadline(c *call) time.Time {
	return c.first.Add(time.Duration(float64(time.Duration(c.resp.Detail+c.resp.Lease)*time.Millisecond) * (1 - 2*rho)))
}

// acquired records an ACQUIRE call and returns the op (with the holder's deadline when
// granted).
func (h *history) acquired(worker int, key string, leaseMs uint32, c *call) histOp {
	op := histOp{worker: worker, key: key, kind: opAcquire, call: h.ns(c.first), ret: math.MaxInt64, sends: c.sends,
		leaseNs: int64(float64(time.Duration(leaseMs)*time.Millisecond) * (1 - 2*rho))}
	if c.sends == 0 { // never sent: nothing to record
		op.out = outRefused
		op.call = h.ns(time.Now())
		op.ret = op.call
		return op
	}
	if c.outcome == unknownOutcome {
		op.out = outUnknown
		h.count("acquire unknown: " + c.why)
	} else {
		op.ret = h.ns(c.ret)
		st := c.resp.Status
		h.count("acquire " + st.String())
		switch {
		case st == wire.StatusOK:
			op.out, op.token, op.deadline = outGrant, c.resp.Token, h.ns(localDeadline(c))
		case st == wire.StatusTimedOut:
			op.out = outTimedOut
		case st == wire.StatusNotHeld && c.sends > 1:
			op.out = outMaybe
		case st == wire.StatusBusy || st == wire.StatusShuttingDown:
			op.out = outRefused
		default:
			op.out = outUnknown
			op.ret = math.MaxInt64
			h.violate("w%d acquire(%s) answered %v (detail %d, %q) after %d transmissions", worker, key, st, c.resp.Detail, c.resp.Data, c.sends)
		}
	}
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
	return op
}

// released records a RELEASE call of token and the hold it ends (from the grant's answer to
// this release's first transmission, or the grant's deadline if that came first).
func (h *history) released(worker int, grant histOp, c *call) histOp {
	op := histOp{worker: worker, key: grant.key, kind: opRelease, token: grant.token, call: h.ns(c.first), ret: math.MaxInt64, sends: c.sends}
	if c.sends == 0 {
		op.call = h.ns(time.Now())
	}
	if c.outcome == unknownOutcome {
		op.out = outUnknown
		h.count("release unknown: " + c.why)
	} else {
		op.ret = h.ns(c.ret)
		st := c.resp.Status
		h.count("release " + st.String())
		switch st {
		case wire.StatusOK:
			op.out = outReleased
		case wire.StatusNotHeld:
			op.out = outNotHeld
		case wire.StatusBusy, wire.StatusShuttingDown:
			op.out = outRefused
		default:
			op.out = outUnknown
			op.ret = math.MaxInt64
			h.violate("w%d release(%s, %d) answered %v (%q)", worker, grant.key, grant.token, st, c.resp.Data)
		}
	}
	end := grant.deadline
	if c.sends > 0 {
		end = min(end, op.call)
	}
	h.mu.Lock()
	if op.call > grant.deadline {
		h.lapsed++
	}
	h.ops = append(h.ops, op)
	h.holds = append(h.holds, hold{worker: worker, key: grant.key, token: grant.token,
		start: h.origin.Add(time.Duration(grant.ret)), end: h.origin.Add(time.Duration(end))})
	h.mu.Unlock()
	return op
}

// record adds an operation recorded by other means (the Go client).
func (h *history) record(op histOp) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// addHold adds the interval in which worker believed it held key with token.
func (h *history) addHold(hd hold) {
	h.mu.Lock()
	h.holds = append(h.holds, hd)
	h.mu.Unlock()
}

// ghost records n acquires whose outcome nobody will know (a session that died with them in
// flight): they may have taken tokens, and are not part of the linearizability check.
func (h *history) ghost(n int) {
	h.mu.Lock()
	h.ghosts += n
	h.mu.Unlock()
}

// abandoned records a grant its holder never releases: it holds until its local deadline.
func (h *history) abandoned(worker int, grant histOp) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.abandons++
	h.holds = append(h.holds, hold{worker: worker, key: grant.key, token: grant.token,
		start: h.origin.Add(time.Duration(grant.ret)), end: h.origin.Add(time.Duration(grant.deadline))})
}

// write is a write to key's fenced register by the holder of token, made only while the
// holder's local deadline has not passed; the register rejects a token lower than the highest
// it accepted. A rejection is a violation: two holders believed they held the lock.
func (h *history) write(key string, token uint64, deadline time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.regs[key]
	if r == nil {
		r = &register{}
		h.regs[key] = r
	}
	if !time.Now().Before(deadline) {
		r.stale++
		return
	}
	if token < r.max {
		r.rejectedInLease++
		if len(h.violations) < 100 {
			h.violations = append(h.violations, fmt.Sprintf("register %s: token %d written after token %d, by a holder within its lease", key, token, r.max))
		}
		return
	}
	r.max = token
	r.accepted++
}

func (h *history) pushed(worker int, r wire.Response, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.Op == wire.OpExpired {
		h.pushes = append(h.pushes, pushRec{worker: worker, token: r.Token, key: string(r.Data), reason: r.Detail, at: at})
	}
}

// checkResult sums up a check.
type checkResult struct {
	ops, grants, unknownAcquires, unknownOther, timedOut, lapsed, abandoned, expiredPushes int
	porcupine                                                                              time.Duration
}

// check runs every check (verify) and fails t on a violation; tokStart and tokEnd are the probe
// grants taken before the workload started and after it ended (0, 0 to skip the count).
func (h *history) check(t *testing.T, tokStart, tokEnd uint64) checkResult {
	t.Helper()
	res, violations, notes := h.verify(tokStart, tokEnd)
	for _, n := range notes {
		t.Log(n)
	}
	if len(violations) > 0 {
		shown := violations
		if len(shown) > 40 {
			shown = append(shown[:40:40], fmt.Sprintf("... and %d more", len(violations)-40))
		}
		t.Errorf("%d violations:\n  %s", len(violations), strings.Join(shown, "\n  "))
	}
	return res
}

// verify runs every check and returns the violations found and notes for the log.
func (h *history) verify(tokStart, tokEnd uint64) (checkResult, []string, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var res checkResult
	res.ops = len(h.ops)
	res.lapsed = h.lapsed
	res.abandoned = h.abandons
	res.expiredPushes = len(h.pushes)

	// Tokens: unique, inside the probes, and the count of grants.
	grants := map[uint64]histOp{}
	for _, op := range h.ops {
		if op.kind != opAcquire {
			if op.out == outUnknown {
				res.unknownOther++
			}
			continue
		}
		switch op.out {
		case outGrant:
			if prev, dup := grants[op.token]; dup {
				h.violations = append(h.violations, fmt.Sprintf("token %d granted twice: %v and %v", op.token, prev, op))
			}
			grants[op.token] = op
			if tokEnd != 0 && (op.token <= tokStart || op.token >= tokEnd) {
				h.violations = append(h.violations, fmt.Sprintf("token %d outside the probes (%d, %d)", op.token, tokStart, tokEnd))
			}
		case outUnknown, outMaybe:
			res.unknownAcquires++
		case outTimedOut:
			res.timedOut++
		}
	}
	res.grants = len(grants)
	res.unknownAcquires += h.ghosts
	if tokEnd != 0 {
		server := int(tokEnd - tokStart - 1)
		if server < res.grants || server > res.grants+res.unknownAcquires {
			h.violations = append(h.violations, fmt.Sprintf("the cluster handed out %d tokens; the clients know of %d grants and %d acquires with an unknown outcome",
				server, res.grants, res.unknownAcquires))
		}
	}

	// A release answered NOT_HELD before the holder's local deadline: the lease was cut short.
	for _, op := range h.ops {
		if g, ok := grants[op.token]; ok && op.kind == opRelease && op.out == outNotHeld && op.ret < g.deadline {
			h.violations = append(h.violations, fmt.Sprintf("%v answered NOT_HELD at %v, before the holder's local deadline %v: the lease was cut short",
				op, time.Duration(op.ret), time.Duration(g.deadline)))
		}
	}

	// EXPIRED notices: never before the holder's local deadline.
	for _, p := range h.pushes {
		g, ok := grants[p.token]
		if ok && p.reason == wire.ExpiredLease && h.ns(p.at) < g.deadline {
			h.violations = append(h.violations, fmt.Sprintf("EXPIRED for token %d (%s) at %v, before the holder's local deadline %v",
				p.token, p.key, time.Duration(h.ns(p.at)), time.Duration(g.deadline)))
		}
	}

	// No overlapping holds (real time, one clock).
	byKey := map[string][]hold{}
	for _, hd := range h.holds {
		byKey[hd.key] = append(byKey[hd.key], hd)
	}
	for key, hs := range byKey {
		sort.Slice(hs, func(i, j int) bool { return hs[i].start.Before(hs[j].start) })
		var maxEnd hold
		for i, hd := range hs {
			if i > 0 && hd.start.Before(maxEnd.end) {
				h.violations = append(h.violations, fmt.Sprintf("%s: holders overlap for %v: token %d (w%d, until %v) and token %d (w%d, from %v)",
					key, maxEnd.end.Sub(hd.start), maxEnd.token, maxEnd.worker, maxEnd.end.Sub(h.origin), hd.token, hd.worker, hd.start.Sub(h.origin)))
			}
			if hd.end.After(maxEnd.end) {
				maxEnd = hd
			}
		}
	}

	// Linearizability, one key at a time.
	keys := map[string][]porcupine.Operation{}
	for _, op := range h.ops {
		keys[op.key] = append(keys[op.key], porcupine.Operation{ClientId: op.worker, Input: op, Output: op, Call: op.call, Return: op.ret})
	}
	model := lockModel()
	start := time.Now()
	for key, ops := range keys {
		r, info := porcupine.CheckOperationsVerbose(model, ops, 2*time.Minute)
		switch r {
		case porcupine.Ok:
		case porcupine.Illegal:
			where := "(none)"
			if h.visualize {
				where = visualize(model, info, key)
			}
			h.violations = append(h.violations, fmt.Sprintf("%s: the history of %d operations is not linearizable (visualization: %s)", key, len(ops), where))
		default:
			h.violations = append(h.violations, fmt.Sprintf("%s: the linearizability check of %d operations did not finish", key, len(ops)))
		}
	}
	res.porcupine = time.Since(start)
	var notes []string
	for k, r := range h.regs {
		notes = append(notes, fmt.Sprintf("register %s: %d writes accepted, %d skipped (writer's lease over), highest token %d", k, r.accepted, r.stale, r.max))
	}
	var st []string
	for k, v := range h.statuses {
		st = append(st, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(st)
	sort.Strings(notes)
	if len(st) > 0 {
		notes = append(notes, "answers: "+strings.Join(st, " "))
	}
	return res, append([]string(nil), h.violations...), notes
}

// lockState is one key as the checker models it. until is a lower bound on the end of the
// holder's lease on the server, in the clients' clock (its local deadline): the lease may have
// ended at any time after it, so the model lets it expire lazily, when an operation needs it.
type lockState struct {
	holder uint64 // token of the holder; 0 when free (or held by a ghost)
	ghost  bool   // held by a grant nobody saw (an acquire with an unknown outcome)
	until  int64
	maxTok uint64 // the highest token granted on this key that the history shows
}

func (s lockState) held() bool { return s.holder != 0 || s.ghost }

// lockModel is a FIFO lock with leases, as a nondeterministic porcupine model (unknown outcomes
// and lazy expiry branch). FIFO order itself is not modelled: a TIMED_OUT only needs the key
// to have been held.
func lockModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{lockState{}} },
		Step: func(state, input, output interface{}) []interface{} {
			s := state.(lockState)
			op := input.(histOp)
			free := lockState{maxTok: s.maxTok}
			switch op.kind {
			case opAcquire:
				switch op.out {
				case outGrant:
					// A new token, and the key free at the grant: never held, or the holder's lease
					// could have ended before this answer came.
					if op.token <= s.maxTok || (s.held() && op.ret < s.until) {
						return nil
					}
					return []interface{}{lockState{holder: op.token, until: op.deadline, maxTok: op.token}}
				case outTimedOut:
					if !s.held() {
						return nil
					}
					return []interface{}{s}
				case outRefused:
					return []interface{}{s}
				case outMaybe:
					// Never run, or granted and ended (expired or revoked) before the answer.
					if !s.held() || op.ret >= s.until {
						return []interface{}{s, free}
					}
					return []interface{}{s}
				case outUnknown:
					// Not run (yet), or granted to nobody's knowledge at some time after the call:
					// a ghost holder whose lease runs at least lease·(1 − 2ρ) from the call.
					return []interface{}{s, lockState{ghost: true, until: op.call + op.leaseNs, maxTok: s.maxTok}}
				}
			case opRelease:
				switch op.out {
				case outReleased:
					if s.holder != op.token {
						return nil
					}
					return []interface{}{free}
				case outNotHeld:
					if s.holder == op.token {
						if op.ret < s.until {
							return nil // the lease was cut short
						}
						return []interface{}{free}
					}
					return []interface{}{s}
				case outRefused:
					return []interface{}{s}
				case outUnknown:
					if s.holder == op.token {
						return []interface{}{s, free}
					}
					return []interface{}{s}
				}
			}
			return nil
		},
		Hash: func(state interface{}) uint64 {
			s := state.(lockState)
			h := s.holder*0x9e3779b97f4a7c15 ^ uint64(s.until)*0xc2b2ae3d27d4eb4f ^ s.maxTok*0x165667b19e3779f9
			if s.ghost {
				h ^= 0x27d4eb2f165667c5
			}
			return h
		},
		DescribeOperation: func(input, output interface{}) string { return input.(histOp).String() },
		DescribeState: func(state interface{}) string {
			s := state.(lockState)
			switch {
			case s.ghost:
				return fmt.Sprintf("ghost until %v (max %d)", time.Duration(s.until), s.maxTok)
			case s.holder != 0:
				return fmt.Sprintf("%d until %v", s.holder, time.Duration(s.until))
			}
			return fmt.Sprintf("free (max %d)", s.maxTok)
		},
	}
	return nm.ToModel()
}

// visualize writes porcupine's page of a history that is not linearizable to a temporary
// directory that outlives the test, and returns its path.
func visualize(model porcupine.Model, info porcupine.LinearizationInfo, key string) string {
	dir, err := os.MkdirTemp("", "ticketing-linearizability-")
	if err != nil {
		return err.Error()
	}
	path := filepath.Join(dir, strings.ReplaceAll(key, "/", "_")+".html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		return err.Error()
	}
	return path
}
