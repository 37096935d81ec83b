package cluster

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// TestCheckerCatchesViolations runs the chaos checker (history_test.go) on small hand-made
// histories: the legal ones pass, and each kind of violation it exists to catch is caught. Times
// are in ms since the origin.
func TestCheckerCatchesViolations(t *testing.T) {
	const inf = -1
	grant := func(w int, key string, tok uint64, call, ret, until int) histOp {
		return histOp{worker: w, key: key, kind: opAcquire, token: tok, call: ms(call), ret: ms(ret), out: outGrant, deadline: ms(until), sends: 1, leaseNs: ms(100)}
	}
	acq := func(w int, key string, call, ret int, out outKind) histOp {
		o := histOp{worker: w, key: key, kind: opAcquire, call: ms(call), ret: ms(ret), out: out, sends: 1, leaseNs: ms(100)}
		if ret == inf {
			o.ret = math.MaxInt64
		}
		return o
	}
	rel := func(w int, key string, tok uint64, call, ret int, out outKind) histOp {
		o := histOp{worker: w, key: key, kind: opRelease, token: tok, call: ms(call), ret: ms(ret), out: out, sends: 1}
		if ret == inf {
			o.ret = math.MaxInt64
		}
		return o
	}
	cases := []struct {
		name             string
		ops              []histOp
		tokStart, tokEnd uint64
		ghosts           int    // acquires of dead sessions (history.ghost)
		want             string // a substring of a violation; "" for none
	}{
		{name: "hand-off, timeout, unknowns", tokStart: 0, tokEnd: 4, ops: []histOp{
			grant(1, "k", 1, 0, 1, 100),
			acq(2, "k", 2, 15, outTimedOut),
			rel(1, "k", 1, 10, 11, outReleased),
			grant(3, "k", 2, 5, 12, 112),
			rel(3, "k", 2, 20, 21, outReleased),
			acq(4, "k", 30, inf, outUnknown), // perhaps granted token 3, to nobody's knowledge
			rel(5, "k", 99, 40, inf, outUnknown),
		}},
		{name: "expiry after the local deadline", tokStart: 0, tokEnd: 3, ops: []histOp{
			grant(1, "k", 1, 0, 1, 100), // never released
			grant(2, "k", 2, 50, 120, 220),
			rel(1, "k", 1, 130, 131, outNotHeld),
		}},
		{name: "a ghost may block", ops: []histOp{
			acq(1, "k", 0, inf, outUnknown),
			grant(2, "k", 1, 10, 20, 120),
			acq(3, "k", 0, 300, outMaybe),
		}},
		{name: "granted before the holder's lease could end", want: "not linearizable", ops: []histOp{
			grant(1, "k", 1, 0, 1, 100),
			grant(2, "k", 2, 50, 90, 190),
		}},
		{name: "holders overlap", want: "holders overlap", ops: []histOp{
			grant(1, "k", 1, 0, 1, 100),
			grant(2, "k", 2, 50, 90, 190),
		}},
		{name: "token backwards", want: "not linearizable", ops: []histOp{
			grant(1, "k", 5, 0, 1, 100),
			rel(1, "k", 5, 2, 3, outReleased),
			grant(2, "k", 4, 4, 5, 105),
		}},
		{name: "lease cut short", want: "cut short", ops: []histOp{
			grant(1, "k", 1, 0, 1, 100),
			rel(1, "k", 1, 10, 11, outNotHeld),
		}},
		{name: "timed out on a free key", want: "not linearizable", ops: []histOp{
			acq(1, "k", 0, 1, outTimedOut),
		}},
		{name: "released twice", want: "not linearizable", ops: []histOp{
			grant(1, "k", 1, 0, 1, 100),
			rel(1, "k", 1, 2, 3, outReleased),
			rel(2, "k", 1, 4, 5, outReleased),
		}},
		{name: "token granted twice", want: "granted twice", ops: []histOp{
			grant(1, "a", 7, 0, 1, 100),
			grant(2, "b", 7, 0, 1, 100),
		}},
		{name: "a grant nobody knows of", tokStart: 0, tokEnd: 3, want: "handed out 2 tokens", ops: []histOp{
			grant(1, "k", 1, 0, 1, 100),
			rel(1, "k", 1, 2, 3, outReleased),
		}},
		{name: "tokens taken by dead sessions' acquires", tokStart: 0, tokEnd: 4, ghosts: 2, ops: []histOp{
			grant(1, "k", 1, 0, 1, 100),
			rel(1, "k", 1, 2, 3, outReleased),
		}},
		{name: "more tokens than dead sessions' acquires", tokStart: 0, tokEnd: 5, ghosts: 2, want: "handed out 4 tokens", ops: []histOp{
			grant(1, "k", 1, 0, 1, 100),
			rel(1, "k", 1, 2, 3, outReleased),
		}},
		// A dropped connection's holder believes it holds until its local deadline; a revoked
		// grant handed on before it overlaps.
		{name: "a grant handed on before its holder's deadline", want: "holders overlap", ops: []histOp{
			grant(1, "k", 1, 0, 1, 6000),
			grant(2, "k", 2, 0, 5001, 11000),
		}},
	}
	for _, tc := range cases {
		h := newHistory()
		h.ops = tc.ops
		h.ghost(tc.ghosts)
		// Holds: from the grant's answer to its release's first transmission or its deadline.
		for _, g := range tc.ops {
			if g.kind != opAcquire || g.out != outGrant {
				continue
			}
			end := g.deadline
			for _, r := range tc.ops {
				if r.kind == opRelease && r.worker == g.worker && r.token == g.token {
					end = min(end, r.call)
				}
			}
			h.holds = append(h.holds, hold{worker: g.worker, key: g.key, token: g.token,
				start: h.origin.Add(time.Duration(g.ret)), end: h.origin.Add(time.Duration(end))})
		}
		_, violations, _ := h.verify(tc.tokStart, tc.tokEnd)
		got := strings.Join(violations, "\n")
		switch {
		case tc.want == "" && got != "":
			t.Errorf("%s: a legal history was flagged:\n%s", tc.name, got)
		case tc.want != "" && !strings.Contains(got, tc.want):
			t.Errorf("%s: want a violation %q, got %q", tc.name, tc.want, got)
		}
	}
}

func ms(v int) int64 { return int64(v) * int64(time.Millisecond) }

// TestStateHashesCompared: the replicas' logged state hashes are compared at every index two
// nodes logged, and a mismatch is reported.
func TestStateHashesCompared(t *testing.T) {
	line := func(idx int, hash string) string {
		return fmt.Sprintf(`time=2026-01-01T00:00:00Z level=INFO msg="state hash" index=%d hash=%s`+"\n", idx, hash)
	}
	logs := map[string]string{
		"n1": line(20, "aa") + line(40, "bb") + line(60, "cc"),
		"n2": "other line\n" + line(40, "bb") + line(60, "dd"),
		"n3": line(20, "aa"),
	}
	compared, indexes, diverged := compareStateHashes(logs)
	if compared != 3 || indexes != 3 || len(diverged) != 1 || !strings.Contains(diverged[0], "index 60 is cc on n1 and dd on n2") {
		t.Fatalf("compared %d at %d indexes, diverged %q", compared, indexes, diverged)
	}
}
