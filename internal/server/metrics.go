package server

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/internal/wire"
)

// Metrics: Prometheus exposition on the admin listener's GET /metrics (docs/operations.md,
// "Metrics", lists every series).
//
// Two kinds of series:
//   - counted as things happen (lock events by key prefix, answers by op and status, handshake
//     outcomes): the lock table's Observer (the methods Granted, Ended, Queued, TimedOut below)
//     and one-line hooks in the request path (answered, answerLocal, authFailure, ...). They
//     run only after EnableMetrics (TICKETING_METRICS=on, the default);
//   - read when scraped (connections, sessions, keys, waiters, the token store, Raft): the
//     collector below takes Server.mu once per scrape. They are always there.
//
// The hot path does not allocate: every counter and histogram it touches is resolved once (a
// key prefix on its first sighting, an op/status pair on its first answer), lookups of known
// prefixes use map[string(b)] (no conversion allocation), and prometheus counters and
// histograms are atomic adds.
//
// Key prefixes bound the label cardinality: a key's prefix is the key up to its first ':' or
// '/' (the whole key when it has neither), at most maxPrefixLen bytes of valid UTF-8; the first
// maxPrefixes distinct prefixes get their own series, everything else is counted as "other".

const (
	maxPrefixes  = 32
	maxPrefixLen = 64
	otherPrefix  = "other"
)

// Histogram buckets, in seconds (waits and holds) and waiters (queue depth).
var (
	waitBuckets  = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}
	holdBuckets  = []float64{0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600}
	depthBuckets = []float64{1, 2, 4, 8, 16, 64, 256, 1024, 4096}
)

// metrics is a server's metrics and the contention sketch behind /api/top. The fields marked
// (Server.mu) are used only with Server.mu held: the lock table calls its Observer under it.
type metrics struct {
	s   *Server
	reg *prometheus.Registry
	on  bool // EnableMetrics ran (before Serve): the event counters below are live

	// Answers by op and status (answered, answerLocal), resolved on first use.
	opsVec  *prometheus.CounterVec
	answers [numOpSlots][numStatusSlots]atomic.Pointer[prometheus.Counter]

	authFailures  prometheus.Counter
	refusalsVec   *prometheus.CounterVec
	refusals      [numStatusSlots]atomic.Pointer[prometheus.Counter]
	attaches      [2]prometheus.Counter // new, resumed
	slowConsumers prometheus.Counter

	// Lock events by key prefix (Server.mu).
	grantsVec, endsVec, timeoutsVec, queuedVec *prometheus.CounterVec
	waitVec, holdVec, depthVec                 *prometheus.HistogramVec
	prefixes                                   map[string]*prefixMetrics
	order                                      []*prefixMetrics // in the order first seen; other first
	other                                      *prefixMetrics

	top topKeys // the most contended keys (Server.mu)
}

// prefixMetrics are the pre-resolved series of one key prefix.
type prefixMetrics struct {
	name               string
	immediate, handoff prometheus.Counter
	ends               [4]prometheus.Counter // by locktable.EndReason (index 0 unused)
	timeouts, queued   prometheus.Counter
	wait, hold, depth  prometheus.Observer
}

// Op and status slots of the answer counters: the client ops, the pushes, "none" (an answer
// to a frame whose header could not be read) and "other".
const (
	numOpSlots     = 12
	numStatusSlots = 11 // wire statuses 0..9, then "other"
)

var opSlotNames = [numOpSlots]string{"none", "acquire", "release", "extend", "cancel", "ping", "inspect", "ack", "expired", "goaway", "handshake", "other"}

func opSlot(op wire.Op) int {
	switch {
	case op == 0:
		return 0
	case op >= wire.OpAcquire && op <= wire.OpAck:
		return 1 + int(op-wire.OpAcquire)
	case op == wire.OpExpired:
		return 8
	case op == wire.OpGoaway:
		return 9
	case op >= wire.OpHello && op <= wire.OpWelcome:
		return 10
	}
	return 11
}

func statusSlot(st wire.Status) int { return min(int(st), numStatusSlots-1) }

// statusSlotNames are the status label values: the protocol's names in lower case.
var statusSlotNames = func() (names [numStatusSlots]string) {
	for i := range names {
		names[i] = strings.ToLower(wire.Status(i).String())
	}
	names[numStatusSlots-1] = "other"
	return
}()

// initMetrics creates the registry with the gauges read at scrape time; the event counters
// start with EnableMetrics.
func (s *Server) initMetrics() *metrics {
	m := &metrics{s: s, reg: prometheus.NewRegistry(), prefixes: make(map[string]*prefixMetrics)}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), (*stateCollector)(m))
	m.top.init(topKeysSize)
	return m
}

// EnableMetrics turns on the metrics counted as things happen (lock events, answers,
// handshakes) and the contention sketch. Call it before Serve. Without it, /metrics serves only
// the series read at scrape time.
func (s *Server) EnableMetrics() {
	m := s.metrics
	if m.on {
		return
	}
	m.opsVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketing_operations_total",
		Help: "Answers sent to clients, by op (pushes: expired, goaway) and status."}, []string{"op", "status"})
	m.refusalsVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketing_handshake_refusals_total",
		Help: "Handshakes refused before authentication (CHALLENGE not OK), by status."}, []string{"status"})
	m.authFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketing_auth_failures_total",
		Help: "Handshakes whose proof did not verify (wrong token)."})
	attachVec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketing_session_attaches_total",
		Help: "Completed handshakes, by whether they resumed a session."}, []string{"resumed"})
	m.attaches = [2]prometheus.Counter{attachVec.WithLabelValues("false"), attachVec.WithLabelValues("true")}
	m.slowConsumers = prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketing_slow_consumers_total",
		Help: "Connections closed because their unread output passed TICKETING_MAX_OUTPUT."})
	m.grantsVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketing_grants_total",
		Help: "Locks granted, by key prefix and kind: immediate, or handoff (the acquire had queued)."}, []string{"prefix", "kind"})
	m.endsVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketing_lock_ends_total",
		Help: "Holds ended, by key prefix and reason: released, expired (lease ran out), revoked (granted to a session that was gone)."}, []string{"prefix", "reason"})
	m.timeoutsVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketing_wait_timeouts_total",
		Help: "Queued acquires whose wait timeout passed, by key prefix."}, []string{"prefix"})
	m.queuedVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketing_queued_total",
		Help: "Acquires that joined a queue (the key was taken), by key prefix."}, []string{"prefix"})
	m.waitVec = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ticketing_wait_seconds",
		Help: "Time queued acquires waited before their grant, by key prefix.", Buckets: waitBuckets}, []string{"prefix"})
	m.holdVec = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ticketing_hold_seconds",
		Help: "Time locks were held, by key prefix (observed when the hold ends).", Buckets: holdBuckets}, []string{"prefix"})
	m.depthVec = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ticketing_queue_depth",
		Help: "Queue length a queued acquire found itself at (itself included), by key prefix.", Buckets: depthBuckets}, []string{"prefix"})
	m.reg.MustRegister(m.opsVec, m.refusalsVec, m.authFailures, attachVec, m.slowConsumers,
		m.grantsVec, m.endsVec, m.timeoutsVec, m.queuedVec, m.waitVec, m.holdVec, m.depthVec)
	m.other = m.newPrefix(otherPrefix)
	m.on = true
	s.SetObserver(m)
}

func (m *metrics) newPrefix(name string) *prefixMetrics {
	p := &prefixMetrics{name: name,
		immediate: m.grantsVec.WithLabelValues(name, "immediate"), handoff: m.grantsVec.WithLabelValues(name, "handoff"),
		timeouts: m.timeoutsVec.WithLabelValues(name), queued: m.queuedVec.WithLabelValues(name),
		wait: m.waitVec.WithLabelValues(name), hold: m.holdVec.WithLabelValues(name), depth: m.depthVec.WithLabelValues(name)}
	p.ends[locktable.EndReleased] = m.endsVec.WithLabelValues(name, "released")
	p.ends[locktable.EndExpired] = m.endsVec.WithLabelValues(name, "expired")
	p.ends[locktable.EndRevoked] = m.endsVec.WithLabelValues(name, "revoked")
	m.order = append(m.order, p)
	return p
}

// keyPrefix is the part of key that names its prefix series (see the package comment above).
func keyPrefix(key []byte) []byte {
	for i, b := range key {
		if b == ':' || b == '/' {
			return key[:i]
		}
	}
	return key
}

// prefix returns key's series. Server.mu must be held.
func (m *metrics) prefix(key []byte) *prefixMetrics {
	p := keyPrefix(key)
	if pm, ok := m.prefixes[string(p)]; ok {
		return pm
	}
	if len(m.prefixes) >= maxPrefixes || len(p) == 0 || len(p) > maxPrefixLen || !utf8.Valid(p) || string(p) == otherPrefix {
		return m.other
	}
	pm := m.newPrefix(string(p))
	m.prefixes[pm.name] = pm
	return pm
}

func seconds(ns int64) float64 { return float64(ns) / 1e9 }

// Granted implements locktable.Observer. Server.mu is held.
func (m *metrics) Granted(key []byte, waited int64, handoff bool) {
	p := m.prefix(key)
	if !handoff {
		p.immediate.Inc()
		return
	}
	p.handoff.Inc()
	p.wait.Observe(seconds(waited))
	m.top.waited(key, waited)
}

// Ended implements locktable.Observer. Server.mu is held.
func (m *metrics) Ended(key []byte, held int64, how locktable.EndReason) {
	p := m.prefix(key)
	if int(how) < len(p.ends) && p.ends[how] != nil {
		p.ends[how].Inc()
	}
	p.hold.Observe(seconds(held))
}

// Queued implements locktable.Observer. Server.mu is held.
func (m *metrics) Queued(key []byte, depth int) {
	p := m.prefix(key)
	p.queued.Inc()
	p.depth.Observe(float64(depth))
	m.top.queued(key)
}

// TimedOut implements locktable.Observer. Server.mu is held.
func (m *metrics) TimedOut(key []byte, waited int64) {
	m.prefix(key).timeouts.Inc()
	m.top.timedOut(key, waited)
}

// counterAt returns the counter in slot p, resolving it from vec on first use (safe from any
// goroutine: a vec returns the same child for the same labels). The fast path is one load.
func counterAt(p *atomic.Pointer[prometheus.Counter], vec *prometheus.CounterVec, label1, label2 string) prometheus.Counter {
	if c := p.Load(); c != nil {
		return *c
	}
	var c prometheus.Counter
	if label2 == "" {
		c = vec.WithLabelValues(label1)
	} else {
		c = vec.WithLabelValues(label1, label2)
	}
	p.Store(&c)
	return c
}

// Hooks called from the request path (one line each at the call site).

// answered counts an answer or push the route step gives to a connection. Server.mu is held.
func (m *metrics) answered(r *wire.Response) { m.answerLocal(r.Op, r.Status) }

// answerLocal counts an answer the validate step writes itself (PING, INVALID).
func (m *metrics) answerLocal(op wire.Op, st wire.Status) {
	if !m.on {
		return
	}
	o, s := opSlot(op), statusSlot(st)
	counterAt(&m.answers[o][s], m.opsVec, opSlotNames[o], statusSlotNames[s]).Inc()
}

// authFailure counts a handshake whose proof did not verify.
func (m *metrics) authFailure() {
	if m.on {
		m.authFailures.Inc()
	}
}

// handshakeRefused counts a CHALLENGE that refused the connection.
func (m *metrics) handshakeRefused(st wire.Status) {
	if m.on {
		s := statusSlot(st)
		counterAt(&m.refusals[s], m.refusalsVec, statusSlotNames[s], "").Inc()
	}
}

// sessionAttached counts a completed handshake.
func (m *metrics) sessionAttached(resumed bool) {
	if !m.on {
		return
	}
	if resumed {
		m.attaches[1].Inc()
	} else {
		m.attaches[0].Inc()
	}
}

// slowConsumer counts a connection closed for not reading.
func (m *metrics) slowConsumer() {
	if m.on {
		m.slowConsumers.Inc()
	}
}

// serveMetrics is GET /metrics.
func (m *metrics) serveMetrics() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// stateCollector reads the series that describe the node's state when scraped.
type stateCollector metrics

var (
	descConnections = prometheus.NewDesc("ticketing_connections", "Client connections past their handshake.", nil, nil)
	descHandshakes  = prometheus.NewDesc("ticketing_handshakes_pending", "Connections still in their handshake.", nil, nil)
	descSessions    = prometheus.NewDesc("ticketing_sessions", "Client sessions, attached or within their grace.", nil, nil)
	descKeys        = prometheus.NewDesc("ticketing_keys", "Keys present: held, waited on, in lock-delay or waiting for storage.", nil, nil)
	descHeld        = prometheus.NewDesc("ticketing_locks_held", "Locks held now.", nil, nil)
	descWaiters     = prometheus.NewDesc("ticketing_waiters", "Acquires queued now, all keys together.", nil, nil)
	descLastToken   = prometheus.NewDesc("ticketing_last_token", "The last fencing token handed out.", nil, nil)
	descTokenLimit  = prometheus.NewDesc("ticketing_token_limit", "Single node: tokens up to this are durably reserved (the token store's high-water mark).", nil, nil)
	descHorizon     = prometheus.NewDesc("ticketing_restart_horizon_seconds", "Single node: how far the durable restart horizon lies ahead of now (leases may end up to this far ahead without a write).", nil, nil)
	descFailing     = prometheus.NewDesc("ticketing_storage_failing", "Single node: 1 while the data directory does not take writes (grants that need one wait).", nil, nil)
	descStartWait   = prometheus.NewDesc("ticketing_startup_wait_seconds", "Single node: time left of the start-up wait (no grants before it ends).", nil, nil)
	descPrefixes    = prometheus.NewDesc("ticketing_metric_prefixes", "Key prefixes with their own series (at most 32; the rest count as \"other\").", nil, nil)
	descRaftState   = prometheus.NewDesc("ticketing_raft_state", "Cluster: 1 for this node's Raft state.", []string{"state"}, nil)
	descRaftTerm    = prometheus.NewDesc("ticketing_raft_term", "Cluster: the current Raft term.", nil, nil)
	descRaftCommit  = prometheus.NewDesc("ticketing_raft_commit_index", "Cluster: the highest log index known committed.", nil, nil)
	descRaftApplied = prometheus.NewDesc("ticketing_raft_applied_index", "Cluster: the highest log index applied to the lock table.", nil, nil)
	descRaftLast    = prometheus.NewDesc("ticketing_raft_last_log_index", "Cluster: the highest index in this node's log.", nil, nil)
	descRaftCLag    = prometheus.NewDesc("ticketing_raft_commit_lag", "Cluster: log entries appended here but not known committed (last log index - commit index).", nil, nil)
	descRaftALag    = prometheus.NewDesc("ticketing_raft_apply_lag", "Cluster: entries committed but not yet applied (commit index - applied index).", nil, nil)
	descRaftContact = prometheus.NewDesc("ticketing_raft_last_contact_seconds", "Cluster: time since this node last heard from the leader (0 on the leader).", nil, nil)
	descRaftServing = prometheus.NewDesc("ticketing_raft_serving", "Cluster: 1 while this node leads and serves clients.", nil, nil)
	descRaftMembers = prometheus.NewDesc("ticketing_raft_members", "Cluster: servers in the Raft configuration, by suffrage.", []string{"suffrage"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConnections, descHandshakes, descSessions, descKeys, descHeld, descWaiters,
		descLastToken, descTokenLimit, descHorizon, descFailing, descStartWait, descPrefixes, descRaftState, descRaftTerm,
		descRaftCommit, descRaftApplied, descRaftLast, descRaftCLag, descRaftALag, descRaftContact, descRaftServing, descRaftMembers} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
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
	prefixes := len(c.prefixes)
	s.mu.Unlock()
	gauge(descConnections, float64(conns))
	gauge(descHandshakes, float64(pending))
	gauge(descSessions, float64(sessions))
	gauge(descKeys, float64(keys))
	gauge(descHeld, float64(held))
	gauge(descWaiters, float64(waiters))
	gauge(descLastToken, float64(last))
	gauge(descPrefixes, float64(prefixes))
	if s.cluster == nil {
		gauge(descTokenLimit, float64(limit))
		if horizon != locktable.NoHorizon {
			gauge(descHorizon, seconds(horizon-now))
		}
		gauge(descFailing, b2f(failing))
		gauge(descStartWait, math.Max(seconds(startLeft), 0))
		return
	}
	r := s.cluster.raft
	state := r.State()
	for _, st := range []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown} {
		gauge(descRaftState, b2f(st == state), strings.ToLower(st.String()))
	}
	stats := r.Stats()
	num := func(k string) uint64 { v, _ := strconv.ParseUint(stats[k], 10, 64); return v }
	commit, lastIdx, applied := num("commit_index"), num("last_log_index"), r.AppliedIndex()
	gauge(descRaftTerm, float64(num("term")))
	gauge(descRaftCommit, float64(commit))
	gauge(descRaftApplied, float64(applied))
	gauge(descRaftLast, float64(lastIdx))
	gauge(descRaftCLag, float64(lastIdx-min(commit, lastIdx)))
	gauge(descRaftALag, float64(commit-min(applied, commit)))
	contact := 0.0
	if state != raft.Leader {
		if lc := r.LastContact(); !lc.IsZero() {
			contact = time.Since(lc).Seconds()
		}
	}
	gauge(descRaftContact, contact)
	gauge(descRaftServing, b2f(s.cluster.ready()))
	if f := r.GetConfiguration(); f.Error() == nil {
		var voters, nonvoters int
		for _, m := range f.Configuration().Servers {
			if m.Suffrage == raft.Voter {
				voters++
			} else {
				nonvoters++
			}
		}
		gauge(descRaftMembers, float64(voters), "voter")
		gauge(descRaftMembers, float64(nonvoters), "nonvoter")
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
