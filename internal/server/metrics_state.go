package server

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/internal/version"
)

// writeState writes the series that describe the node's state when scraped.
func (m *metrics) writeState(e *expo) {
	s := m.s
	s.pending.mu.Lock()
	pending := s.pending.l.Len()
	s.pending.mu.Unlock()
	s.mu.Lock()
	keys, held, waiters := s.table.Stats()
	sessions := s.table.Sessions()
	last := s.table.LastToken()
	limit, horizon, failing := s.table.Bounds()
	now := s.table.Now()
	conns := len(s.conns)
	startLeft := s.startWait - s.now()
	prefixes := m.nprefix
	s.mu.Unlock()
	gauge := func(name, help string, v float64) {
		e.family(name, "gauge", help)
		e.float(name, v)
	}
	b := version.Get()
	e.family("ticketing_build_info", "gauge", "Always 1: the release, commit and Go version of this binary (labels).")
	e.float("ticketing_build_info", 1, "version", b.Version, "revision", b.Revision, "go_version", b.Go)
	gauge("ticketing_connections", "Client connections past their handshake.", float64(conns))
	gauge("ticketing_handshakes_pending", "Connections still in their handshake.", float64(pending))
	gauge("ticketing_sessions", "Client sessions, attached or within their grace.", float64(sessions))
	gauge("ticketing_keys", "Keys present: held, waited on, in lock-delay or waiting for storage.", float64(keys))
	gauge("ticketing_locks_held", "Locks held now.", float64(held))
	gauge("ticketing_waiters", "Acquires queued now, all keys together.", float64(waiters))
	e.family("ticketing_last_token", "gauge", "The last fencing token handed out.")
	e.uint("ticketing_last_token", last)
	gauge("ticketing_metric_prefixes", "Key prefixes with their own series (at most 32; the rest count as \"other\").", float64(prefixes))
	if s.cluster == nil {
		e.family("ticketing_token_limit", "gauge", "Single node: tokens up to this are durably reserved (the token store's high-water mark).")
		e.uint("ticketing_token_limit", limit)
		if horizon != locktable.NoHorizon {
			gauge("ticketing_restart_horizon_seconds", "Single node: how far the durable restart horizon lies ahead of now (leases may end up to this far ahead without a write).", seconds(horizon-now))
		}
		gauge("ticketing_storage_failing", "Single node: 1 while the data directory does not take writes (grants that need one wait).", b2f(failing))
		gauge("ticketing_startup_wait_seconds", "Single node: time left of the start-up wait (no grants before it ends).", math.Max(seconds(startLeft), 0))
		return
	}
	r := s.cluster.raft
	state := r.State()
	e.family("ticketing_raft_state", "gauge", "Cluster: 1 for this node's Raft state.")
	for _, st := range []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown} {
		e.float("ticketing_raft_state", b2f(st == state), "state", strings.ToLower(st.String()))
	}
	stats := r.Stats()
	num := func(k string) uint64 { v, _ := strconv.ParseUint(stats[k], 10, 64); return v }
	commit, lastIdx, applied := num("commit_index"), num("last_log_index"), r.AppliedIndex()
	index := func(name, help string, v uint64) {
		e.family(name, "gauge", help)
		e.uint(name, v)
	}
	index("ticketing_raft_term", "Cluster: the current Raft term.", num("term"))
	index("ticketing_raft_commit_index", "Cluster: the highest log index known committed.", commit)
	index("ticketing_raft_applied_index", "Cluster: the highest log index applied to the lock table.", applied)
	index("ticketing_raft_last_log_index", "Cluster: the highest index in this node's log.", lastIdx)
	index("ticketing_raft_commit_lag", "Cluster: log entries appended here but not known committed (last log index - commit index).", lastIdx-min(commit, lastIdx))
	index("ticketing_raft_apply_lag", "Cluster: entries committed but not yet applied (commit index - applied index).", commit-min(applied, commit))
	contact := 0.0
	if state != raft.Leader {
		if lc := r.LastContact(); !lc.IsZero() {
			contact = time.Since(lc).Seconds()
		}
	}
	gauge("ticketing_raft_last_contact_seconds", "Cluster: time since this node last heard from the leader (0 on the leader).", contact)
	gauge("ticketing_raft_serving", "Cluster: 1 while this node leads and serves clients.", b2f(s.cluster.leads()))
	if f := r.GetConfiguration(); f.Error() == nil {
		var voters, nonvoters uint64
		for _, m := range f.Configuration().Servers {
			if m.Suffrage == raft.Voter {
				voters++
			} else {
				nonvoters++
			}
		}
		e.family("ticketing_raft_members", "gauge", "Cluster: servers in the Raft configuration, by suffrage.")
		e.uint("ticketing_raft_members", nonvoters, "suffrage", "nonvoter")
		e.uint("ticketing_raft_members", voters, "suffrage", "voter")
	}
	m.writeRaftTimings(e)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// eventCounts is a copy of the event counts taken at one scrape.
type eventCounts struct {
	answers  [numOpSlots][numStatusSlots]uint64 // both kinds added up
	prefixes []prefixMetrics                    // in the order first seen; other first
}

// events copies the event counts (the lock events under Server.mu).
func (m *metrics) events() eventCounts {
	var c eventCounts
	m.s.mu.Lock()
	c.answers = m.answers
	c.prefixes = make([]prefixMetrics, len(m.order))
	for i, p := range m.order {
		c.prefixes[i] = *p
		for _, h := range []*histo{&c.prefixes[i].wait, &c.prefixes[i].hold, &c.prefixes[i].depth} {
			h.counts = slices.Clone(h.counts)
		}
	}
	m.s.mu.Unlock()
	for o := range c.answers {
		for s := range c.answers[o] {
			c.answers[o][s] += m.local[o][s].Load()
		}
	}
	return c
}

// endReasonNames are the reason label values of ticketing_lock_ends_total, by EndReason.
var endReasonNames = [4]string{"", "released", "expired", "revoked"}

// writeEvents writes the event counters: every series of a prefix from the prefix's first
// event on; an answer or refusal series from its first count.
func (m *metrics) writeEvents(e *expo, c eventCounts) {
	if c.answers != ([numOpSlots][numStatusSlots]uint64{}) {
		e.family("ticketing_operations_total", "counter", "Answers sent to clients, by op (pushes: expired, goaway) and status.")
	}
	for o := range c.answers {
		for s, n := range c.answers[o] {
			if n > 0 {
				e.uint("ticketing_operations_total", n, "op", opSlotNames[o], "status", statusSlotNames[s])
			}
		}
	}
	ps := c.prefixes
	e.family("ticketing_grants_total", "counter", "Locks granted, by key prefix and kind: immediate, or handoff (the acquire had queued).")
	for i := range ps {
		e.uint("ticketing_grants_total", ps[i].grants[0], "kind", "immediate", "prefix", ps[i].name)
		e.uint("ticketing_grants_total", ps[i].grants[1], "kind", "handoff", "prefix", ps[i].name)
	}
	e.family("ticketing_lock_ends_total", "counter", "Holds ended, by key prefix and reason: released, expired (lease ran out), revoked (granted to a session that was gone).")
	for i := range ps {
		for how := locktable.EndReleased; how <= locktable.EndRevoked; how++ {
			e.uint("ticketing_lock_ends_total", ps[i].ends[how], "prefix", ps[i].name, "reason", endReasonNames[how])
		}
	}
	e.family("ticketing_wait_timeouts_total", "counter", "Queued acquires whose wait timeout passed, by key prefix.")
	for i := range ps {
		e.uint("ticketing_wait_timeouts_total", ps[i].timeouts, "prefix", ps[i].name)
	}
	e.family("ticketing_queued_total", "counter", "Acquires that joined a queue (the key was taken), by key prefix.")
	for i := range ps {
		e.uint("ticketing_queued_total", ps[i].queued, "prefix", ps[i].name)
	}
	e.family("ticketing_wait_seconds", "histogram", "Time queued acquires waited before their grant, by key prefix.")
	for i := range ps {
		h := &ps[i].wait
		e.histogram("ticketing_wait_seconds", waitBuckets, h.counts, h.n, h.sum, "prefix", ps[i].name)
	}
	e.family("ticketing_hold_seconds", "histogram", "Time locks were held, by key prefix (observed when the hold ends).")
	for i := range ps {
		h := &ps[i].hold
		e.histogram("ticketing_hold_seconds", holdBuckets, h.counts, h.n, h.sum, "prefix", ps[i].name)
	}
	e.family("ticketing_queue_depth", "histogram", "Queue length a queued acquire found itself at (itself included), by key prefix.")
	for i := range ps {
		h := &ps[i].depth
		e.histogram("ticketing_queue_depth", depthBuckets, h.counts, h.n, h.sum, "prefix", ps[i].name)
	}
	e.family("ticketing_auth_failures_total", "counter", "Handshakes whose proof did not verify (wrong token).")
	e.uint("ticketing_auth_failures_total", m.authFailures.Load())
	first := true
	for s := range m.refusals {
		if n := m.refusals[s].Load(); n > 0 {
			if first {
				e.family("ticketing_handshake_refusals_total", "counter", "Handshakes refused before authentication (CHALLENGE not OK), by status.")
				first = false
			}
			e.uint("ticketing_handshake_refusals_total", n, "status", statusSlotNames[s])
		}
	}
	e.family("ticketing_session_attaches_total", "counter", "Completed handshakes, by whether they resumed a session.")
	e.uint("ticketing_session_attaches_total", m.attaches[0].Load(), "resumed", "false")
	e.uint("ticketing_session_attaches_total", m.attaches[1].Load(), "resumed", "true")
	e.family("ticketing_slow_consumers_total", "counter", "Connections closed because their unread output passed TICKETING_MAX_OUTPUT.")
	e.uint("ticketing_slow_consumers_total", m.slowConsumers.Load())
}
