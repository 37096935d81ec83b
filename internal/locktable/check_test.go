package locktable

import (
	"bytes"
	"fmt"
)

// check verifies every internal invariant of the table by brute force. It
// returns the first violation found, or nil.
func (t *Table) check() error {
	// Heap order, lane order; every live item is found by its seq (stale ones are counted).
	bySeq := map[uint64]*timer{}
	stale := 0
	count := func(it *timer) error {
		if !t.live(it) {
			stale++
			return nil
		}
		if bySeq[it.seq] != nil {
			return fmt.Errorf("two live timer items with seq %d", it.seq)
		}
		if it.at < t.tm.floor {
			return fmt.Errorf("live timer at %d before the deadline floor %d", it.at, t.tm.floor)
		}
		bySeq[it.seq] = it
		return nil
	}
	h := t.tm.heap
	for i := range h {
		if i > 0 && timerLess(&h[i], &h[(i-1)/2]) {
			return fmt.Errorf("heap order broken at %d", i)
		}
		if err := count(&h[i]); err != nil {
			return err
		}
	}
	for k := range t.tm.lanes {
		l := &t.tm.lanes[k]
		for i := range l.len() {
			if i > 0 && timerLess(l.at(i), l.at(i-1)) {
				return fmt.Errorf("lane %d order broken at %d", k, i)
			}
			if err := count(l.at(i)); err != nil {
				return err
			}
		}
	}
	if stale != t.tm.stale {
		return fmt.Errorf("%d stale timer items, table counts %d", stale, t.tm.stale)
	}
	// Entries.
	live, held, timers := 0, 0, 0
	for i := int32(0); i < t.entries.n; i++ {
		e := t.entries.at(i)
		if !e.live() {
			continue
		}
		live++
		if j, _ := t.lookup(t.key(e)); j != int32(i) {
			return fmt.Errorf("entry %d (%q) not found by lookup (got %d)", i, t.key(e), j)
		}
		if !e.held() && !e.inDelay() && e.nwait == 0 {
			return fmt.Errorf("idle entry %q present", t.key(e))
		}
		if e.nwait > 0 && !e.held() && !e.inDelay() && !e.stalled() {
			return fmt.Errorf("free entry %q has waiters", t.key(e))
		}
		if (e.held() && e.inDelay()) || (e.stalled() && (e.held() || e.inDelay())) {
			return fmt.Errorf("entry %q: held %v, in delay %v, stalled %v", t.key(e), e.held(), e.inDelay(), e.stalled())
		}
		if e.revocable() && !e.held() {
			return fmt.Errorf("entry %q revocable but not held", t.key(e))
		}
		if !e.held() && e.orec != nilIdx {
			return fmt.Errorf("entry %q not held but on an owner's list", t.key(e))
		}
		for w := e.qhead; w != nilIdx; w = t.waiters.at(w).qnext {
			if t.waiters.at(w).try && !e.stalled() {
				return fmt.Errorf("try-once waiter on %q, which is not stalled", t.key(e))
			}
		}
		if e.held() && e.inDelay() {
			return fmt.Errorf("entry %q held and in lock-delay (they share the deadline field)", t.key(e))
		}
		if e.held() || e.inDelay() {
			it := bySeq[e.tseq]
			if e.tseq == 0 || it == nil {
				return fmt.Errorf("entry %q has no timer", t.key(e))
			}
			want := tLease
			if e.inDelay() {
				want = tDelay
			}
			at := e.deadline
			if it.kind != want || it.at != at || it.idx != int32(i) {
				return fmt.Errorf("entry %q timer mismatch %+v", t.key(e), it)
			}
			timers++
		} else if e.tseq != 0 {
			return fmt.Errorf("entry %q has a stray timer", t.key(e))
		}
		if e.held() {
			held++
		}
		// Queue links.
		n, prev := 0, nilIdx
		for w := e.qhead; w != nilIdx; w = t.waiters.at(w).qnext {
			if t.waiters.at(w).qprev != prev || t.waiters.at(w).entry != int32(i) {
				return fmt.Errorf("queue links broken on %q", t.key(e))
			}
			prev = w
			n++
		}
		if prev != e.qtail || n != int(e.nwait) {
			return fmt.Errorf("queue of %q: tail/count mismatch (%d vs %d)", t.key(e), n, e.nwait)
		}
	}
	// Stalled list.
	ns, lprev := 0, nilIdx
	for i := t.shead; i != nilIdx; i = t.entries.at(i).lnext {
		e := t.entries.at(i)
		if !e.live() || !e.stalled() || e.lprev != lprev {
			return fmt.Errorf("stalled list broken at %q", t.key(e))
		}
		lprev = i
		ns++
	}
	if lprev != t.stail || ns != t.nstalled {
		return fmt.Errorf("stalled list: tail/count mismatch (%d vs %d)", ns, t.nstalled)
	}
	stalledEntries := 0
	for i := int32(0); i < t.entries.n; i++ {
		if e := t.entries.at(i); e.live() && e.stalled() {
			stalledEntries++
		}
	}
	if stalledEntries != ns {
		return fmt.Errorf("%d stalled entries, %d on the list", stalledEntries, ns)
	}
	if live != t.nkeys || held != t.nheld {
		return fmt.Errorf("counts: keys %d/%d held %d/%d", live, t.nkeys, held, t.nheld)
	}
	// Free entries are exactly the non-live ones.
	free := 0
	for i := t.freeE; i != nilIdx; i = t.entries.at(i).hnext {
		if t.entries.at(i).live() {
			return fmt.Errorf("live entry on free list")
		}
		free++
	}
	if free+live != int(t.entries.n) {
		return fmt.Errorf("entry slab: %d free + %d live != %d", free, live, int(t.entries.n))
	}
	// Global waiter list, req index, owner records.
	n, prev := 0, nilIdx
	perOwner := map[Owner]int{}
	for w := t.ghead; w != nilIdx; w = t.waiters.at(w).gnext {
		wt := t.waiters.at(w)
		if wt.gprev != prev {
			return fmt.Errorf("global links broken")
		}
		if t.findReq(wt.owner, wt.reqID) != w {
			return fmt.Errorf("waiter (%d,%d) not in req index", wt.owner, wt.reqID)
		}
		if wt.tseq != 0 {
			it := bySeq[wt.tseq]
			if it == nil || it.kind != tWait || it.idx != w || it.at != wt.waitAt {
				return fmt.Errorf("waiter timer mismatch")
			}
			timers++
		}
		if t.owners[wt.ownerRec].owner != wt.owner {
			return fmt.Errorf("waiter owner record mismatch")
		}
		perOwner[wt.owner]++
		prev = w
		n++
	}
	if prev != t.gtail || n != t.nwait {
		return fmt.Errorf("global list: tail/count mismatch (%d vs %d)", n, t.nwait)
	}
	// Session grace timers, and the session index.
	liveSessions := 0
	for i := range t.sess.slots {
		ss := &t.sess.slots[i]
		if !ss.inUse {
			if ss.tseq != 0 {
				return fmt.Errorf("free session slot %d has a timer", i)
			}
			continue
		}
		liveSessions++
		if j, ok := t.sess.byID[ss.id]; !ok || j != int32(i) {
			return fmt.Errorf("session slot %d not indexed", i)
		}
		if (ss.tseq != 0) != (ss.conn == 0) {
			return fmt.Errorf("session %d: attached %v but grace timer %d", ss.owner, ss.conn != 0, ss.tseq)
		}
		if ss.tseq != 0 {
			it := bySeq[ss.tseq]
			if it == nil || it.kind != tSession || it.idx != int32(i) || it.at != ss.expireAt {
				return fmt.Errorf("session %d timer mismatch", ss.owner)
			}
			timers++
		}
		for k := 1; k < len(ss.records); k++ {
			if ss.records[k-1].id >= ss.records[k].id {
				return fmt.Errorf("session %d records out of order", ss.owner)
			}
		}
	}
	if liveSessions != t.sess.live || len(t.sess.byID) != liveSessions {
		return fmt.Errorf("sessions: %d live slots, count %d, index %d", liveSessions, t.sess.live, len(t.sess.byID))
	}
	if timers != len(bySeq) {
		return fmt.Errorf("%d timers owned, %d live timer items", timers, len(bySeq))
	}
	// Held lists: every held entry whose owner has a record is on its list.
	heldBy := map[Owner]int{}
	for i := int32(0); i < t.entries.n; i++ {
		e := t.entries.at(i)
		if !e.live() || !e.held() || e.orec == nilIdx {
			continue
		}
		r := &t.owners[e.orec]
		if !r.live || r.owner != e.holder {
			return fmt.Errorf("held entry %q on the list of owner %d, holder %d", t.key(e), r.owner, e.holder)
		}
		heldBy[e.holder]++
	}
	records := 0
	for i := range t.owners {
		r := &t.owners[i]
		if !r.live {
			continue
		}
		records++
		if r.n == 0 && r.nheld == 0 {
			return fmt.Errorf("owner %d has an empty record", r.owner)
		}
		if t.findOwner(r.owner) != int32(i) {
			return fmt.Errorf("owner %d record not indexed", r.owner)
		}
		k, prev := 0, nilIdx
		for ei := r.hhead; ei != nilIdx; ei = t.entries.at(ei).lnext {
			e := t.entries.at(ei)
			if e.orec != int32(i) || e.lprev != prev || !e.held() || e.holder != r.owner {
				return fmt.Errorf("held list of owner %d broken", r.owner)
			}
			prev = ei
			k++
		}
		if k != r.nheld || k != heldBy[r.owner] {
			return fmt.Errorf("held list of owner %d: %d entries, count %d, %d found", r.owner, k, r.nheld, heldBy[r.owner])
		}
		if r.n != perOwner[r.owner] {
			return fmt.Errorf("owner %d: %d waiters counted, %d found", r.owner, r.n, perOwner[r.owner])
		}
	}
	if records != t.nowners {
		return fmt.Errorf("owners: %d live records, table counts %d", records, t.nowners)
	}
	for o, c := range perOwner {
		oi := t.findOwner(o)
		if oi == nilIdx || t.owners[oi].n != c {
			return fmt.Errorf("owner %d record count mismatch", o)
		}
		k := 0
		for w := t.owners[oi].head; w != nilIdx; w = t.waiters.at(w).onext {
			if t.waiters.at(w).owner != o {
				return fmt.Errorf("owner list of %d has a foreign waiter", o)
			}
			k++
		}
		if k != c {
			return fmt.Errorf("owner list of %d: %d, want %d", o, k, c)
		}
	}
	// Stray bucket entries.
	for _, head := range t.kbuckets {
		for i := head; i != nilIdx; i = t.entries.at(i).hnext {
			if !t.entries.at(i).live() {
				return fmt.Errorf("dead entry in bucket")
			}
		}
	}
	return nil
}

// keyOf returns a copy of an event's key (tests keep events past later calls).
func keyOf(e Event) string { return string(bytes.Clone(e.Key)) }
