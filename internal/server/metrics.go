package server

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/http"
	"slices"
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
// The hot path is plain arithmetic: the lock events and the answers routed by settle are counted
// in plain integers and fixed bucket arrays under Server.mu (which the observer hooks and settle
// already hold); a key's prefix series is found once per event (a one-entry cache in front of a
// small fixed hash index, prefixIndex). Nothing is a prometheus metric until a
// scrape: eventCollector copies the counts under Server.mu and hands them out as constant
// metrics of the same names, labels and buckets. The answers counted outside Server.mu
// (answerLocal: PING and INVALID from the validate step) use atomic counters.
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

	// Answers by op and status: routed by settle (Server.mu), and written by the validate step
	// outside it (atomic). A series exists once its count is non-zero.
	answers [numOpSlots][numStatusSlots]uint64
	local   [numOpSlots][numStatusSlots]atomic.Uint64
	enabled time.Time // when EnableMetrics ran: the answer series' created time

	authFailures  prometheus.Counter
	refusalsVec   *prometheus.CounterVec
	refusals      [numStatusSlots]atomic.Pointer[prometheus.Counter]
	attaches      [2]prometheus.Counter // new, resumed
	slowConsumers prometheus.Counter

	// Lock events by key prefix (Server.mu).
	prefixes prefixIndex      // every prefix with its own series (not other)
	nprefix  int              // how many
	order    []*prefixMetrics // in the order first seen; other first
	other    *prefixMetrics
	last     *prefixMetrics // the prefix of the last event (a one-entry cache in front of prefixes)

	top topKeys // the most contended keys (Server.mu)
}

// prefixMetrics are the counts of one key prefix (Server.mu).
type prefixMetrics struct {
	name              string
	created           time.Time
	grants            [2]uint64 // immediate, handoff
	ends              [4]uint64 // by locktable.EndReason (index 0 unused)
	timeouts, queued  uint64
	wait, hold, depth histo
}

// histo is a histogram counted under Server.mu: counts[i] observations fell in bucket i (not
// cumulative; the last one is +Inf). Observations are compared with bounds in the observed unit
// (ns, waiters); for every bound that unit's comparison equals the exposed unit's (see
// nsBounds), so the buckets are those a prometheus histogram of the same bounds would fill.
type histo struct {
	bounds []int64 // shared
	counts []uint64
	n      uint64
	sum    float64 // in the exposed unit (seconds, waiters), added in observation order
}

func newHisto(bounds []int64) histo {
	return histo{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histo) observe(v int64, exposed float64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i]++
	h.n++
	h.sum += exposed
}

// constHistogram is h as a prometheus metric with the exposed bounds (h: a copy taken under
// Server.mu).
func (h *histo) constHistogram(d *prometheus.Desc, bounds []float64, created time.Time, label string) prometheus.Metric {
	cum := make(map[float64]uint64, len(bounds))
	var c uint64
	for i, b := range bounds {
		c += h.counts[i]
		cum[b] = c
	}
	return prometheus.MustNewConstHistogramWithCreatedTimestamp(d, h.n, h.sum, cum, created, label)
}

// nsBounds converts bucket bounds in seconds to ns. For every such bound b (a decimal with at
// most 9 places, below 2^53 ns) and every ns count v below 2^53, float64(v)/1e9 <= b exactly
// when v <= the bound in ns: both sides are monotone, agree at the bound, and 1 ns is far above
// a float64's spacing there.
func nsBounds(sec []float64) []int64 {
	b := make([]int64, len(sec))
	for i, s := range sec {
		b[i] = int64(math.Round(s * 1e9))
	}
	return b
}

func intBounds(f []float64) []int64 {
	b := make([]int64, len(f))
	for i, v := range f {
		b[i] = int64(v) // whole numbers of waiters
	}
	return b
}

var (
	waitBoundsNs  = nsBounds(waitBuckets)
	holdBoundsNs  = nsBounds(holdBuckets)
	depthBoundsIn = intBounds(depthBuckets)
)

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
	m := &metrics{s: s, reg: prometheus.NewRegistry()}
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
	m.refusalsVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketing_handshake_refusals_total",
		Help: "Handshakes refused before authentication (CHALLENGE not OK), by status."}, []string{"status"})
	m.authFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketing_auth_failures_total",
		Help: "Handshakes whose proof did not verify (wrong token)."})
	attachVec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ticketing_session_attaches_total",
		Help: "Completed handshakes, by whether they resumed a session."}, []string{"resumed"})
	m.attaches = [2]prometheus.Counter{attachVec.WithLabelValues("false"), attachVec.WithLabelValues("true")}
	m.slowConsumers = prometheus.NewCounter(prometheus.CounterOpts{Name: "ticketing_slow_consumers_total",
		Help: "Connections closed because their unread output passed TICKETING_MAX_OUTPUT."})
	m.reg.MustRegister(m.refusalsVec, m.authFailures, attachVec, m.slowConsumers, (*eventCollector)(m))
	m.enabled = time.Now()
	s.mu.Lock()
	m.other = m.newPrefix(otherPrefix)
	s.mu.Unlock()
	m.on = true
	s.SetObserver(m)
}

// newPrefix creates the series of a prefix. Server.mu must be held.
func (m *metrics) newPrefix(name string) *prefixMetrics {
	p := &prefixMetrics{name: name, created: time.Now(),
		wait: newHisto(waitBoundsNs), hold: newHisto(holdBoundsNs), depth: newHisto(depthBoundsIn)}
	m.order = append(m.order, p)
	return p
}

// keyPrefix is the part of key that names its prefix series (see the package comment above),
// cut at maxPrefixLen+1 bytes: a longer prefix counts as "other" whatever follows. It looks at
// eight bytes at a time.
func keyPrefix(key []byte) []byte {
	n := min(len(key), maxPrefixLen+1)
	i := 0
	for ; i+8 <= n; i += 8 {
		if m := separators(binary.LittleEndian.Uint64(key[i:])); m != 0 {
			return key[:i+bits.TrailingZeros64(m)/8]
		}
	}
	for ; i < n; i++ {
		if key[i] == ':' || key[i] == '/' {
			return key[:i]
		}
	}
	return key[:n]
}

// separators marks the bytes of w that are ':' or '/' (bit 7 of each; exact for the lowest
// marked byte, which is all keyPrefix uses: a borrow only marks bytes above a true match).
func separators(w uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	a, b := w^(':'*ones), w^('/'*ones)
	return ((a-ones)&^a | (b-ones)&^b) & highs
}

// prefix returns key's series. Server.mu must be held.
func (m *metrics) prefix(key []byte) *prefixMetrics {
	p := keyPrefix(key)
	if l := m.last; l != nil && string(p) == l.name {
		return l
	}
	pm, slot, h := m.prefixes.find(p)
	if pm != nil {
		m.last = pm
		return pm
	}
	if m.nprefix >= maxPrefixes || len(p) == 0 || len(p) > maxPrefixLen || !utf8.Valid(p) || string(p) == otherPrefix {
		return m.other
	}
	pm = m.newPrefix(string(p))
	m.prefixes[slot].h, m.prefixes[slot].p = h, pm
	m.nprefix++
	m.last = pm
	return pm
}

// prefixIndex finds a prefix's series: open addressing over twice as many slots as there can be
// prefixes, with a fixed word-at-a-time hash whose top bits pick the slot. It holds at most
// maxPrefixes entries, so a lookup ends within that many probes whatever the keys; no seed is
// needed.
type prefixIndex [2 * maxPrefixes]struct {
	h uint64
	p *prefixMetrics
}

// find returns p's series, or nil and the empty slot where it would go (with p's hash).
func (x *prefixIndex) find(p []byte) (*prefixMetrics, int, uint64) {
	h := prefixHash(p)
	i := int(h >> 58) // 64 slots
	for x[i].p != nil {
		if x[i].h == h && x[i].p.name == string(p) {
			return x[i].p, i, h
		}
		i = (i + 1) % len(x)
	}
	return nil, i, h
}

// prefixHash hashes p a word at a time; its last 8 bytes (below 8: two overlapping half-words,
// or three bytes) overlap what came before instead of being assembled byte by byte.
func prefixHash(p []byte) uint64 {
	const k1, k2 = 0x9e3779b97f4a7c15, 0xbf58476d1ce4e5b9
	n := len(p)
	h := uint64(n) * k1
	var last uint64
	switch {
	case n >= 8:
		for i := 0; i+8 < n; i += 8 {
			h = (h ^ binary.LittleEndian.Uint64(p[i:])) * k2
			h ^= h >> 31
		}
		last = binary.LittleEndian.Uint64(p[n-8:])
	case n >= 4:
		last = uint64(binary.LittleEndian.Uint32(p)) | uint64(binary.LittleEndian.Uint32(p[n-4:]))<<32
	case n > 0:
		last = uint64(p[0]) | uint64(p[n/2])<<8 | uint64(p[n-1])<<16
	}
	h = (h ^ last) * k2
	h ^= h >> 32
	h *= 0xd6e8feb86659fd93
	return h ^ h>>32
}

func seconds(ns int64) float64 { return float64(ns) / 1e9 }

// Granted implements locktable.Observer. Server.mu is held.
func (m *metrics) Granted(key []byte, waited int64, handoff bool) {
	p := m.prefix(key)
	if !handoff {
		p.grants[0]++
		return
	}
	p.grants[1]++
	p.wait.observe(waited, seconds(waited))
	m.top.waited(key, waited)
}

// Ended implements locktable.Observer. Server.mu is held.
func (m *metrics) Ended(key []byte, held int64, how locktable.EndReason) {
	p := m.prefix(key)
	if how >= locktable.EndReleased && int(how) < len(p.ends) {
		p.ends[how]++
	}
	p.hold.observe(held, seconds(held))
}

// Queued implements locktable.Observer. Server.mu is held.
func (m *metrics) Queued(key []byte, depth int) {
	p := m.prefix(key)
	p.queued++
	p.depth.observe(int64(depth), float64(depth))
	m.top.queued(key)
}

// TimedOut implements locktable.Observer. Server.mu is held.
func (m *metrics) TimedOut(key []byte, waited int64) {
	m.prefix(key).timeouts++
	m.top.timedOut(key, waited)
}

// counterAt returns the counter in slot p, resolving it from vec (one label) on first use (safe
// from any goroutine: a vec returns the same child for the same label). The fast path is one load.
func counterAt(p *atomic.Pointer[prometheus.Counter], vec *prometheus.CounterVec, label string) prometheus.Counter {
	if c := p.Load(); c != nil {
		return *c
	}
	c := vec.WithLabelValues(label)
	p.Store(&c)
	return c
}

// Hooks called from the request path (one line each at the call site).

// answered counts an answer or push the route step gives to a connection. Server.mu is held.
func (m *metrics) answered(r *wire.Response) {
	if m.on {
		m.answers[opSlot(r.Op)][statusSlot(r.Status)]++
	}
}

// answerLocal counts an answer the validate step writes itself (PING, INVALID); Server.mu need
// not be held.
func (m *metrics) answerLocal(op wire.Op, st wire.Status) {
	if m.on {
		m.local[opSlot(op)][statusSlot(st)].Add(1)
	}
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
		counterAt(&m.refusals[s], m.refusalsVec, statusSlotNames[s]).Inc()
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
	prefixes := c.nprefix
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

// eventCollector hands out the event counts (answers, lock events by prefix) at scrape time: it
// copies them under Server.mu and sends constant metrics, with the names, labels, help and
// buckets the series have always had. Every series of a prefix exists from the prefix's first
// event on; an answer series from its first answer.
type eventCollector metrics

var (
	descOps = prometheus.NewDesc("ticketing_operations_total",
		"Answers sent to clients, by op (pushes: expired, goaway) and status.", []string{"op", "status"}, nil)
	descGrants = prometheus.NewDesc("ticketing_grants_total",
		"Locks granted, by key prefix and kind: immediate, or handoff (the acquire had queued).", []string{"prefix", "kind"}, nil)
	descEnds = prometheus.NewDesc("ticketing_lock_ends_total",
		"Holds ended, by key prefix and reason: released, expired (lease ran out), revoked (granted to a session that was gone).", []string{"prefix", "reason"}, nil)
	descTimeouts = prometheus.NewDesc("ticketing_wait_timeouts_total",
		"Queued acquires whose wait timeout passed, by key prefix.", []string{"prefix"}, nil)
	descQueued = prometheus.NewDesc("ticketing_queued_total",
		"Acquires that joined a queue (the key was taken), by key prefix.", []string{"prefix"}, nil)
	descWait = prometheus.NewDesc("ticketing_wait_seconds",
		"Time queued acquires waited before their grant, by key prefix.", []string{"prefix"}, nil)
	descHold = prometheus.NewDesc("ticketing_hold_seconds",
		"Time locks were held, by key prefix (observed when the hold ends).", []string{"prefix"}, nil)
	descDepth = prometheus.NewDesc("ticketing_queue_depth",
		"Queue length a queued acquire found itself at (itself included), by key prefix.", []string{"prefix"}, nil)
)

// endReasonNames are the reason label values of ticketing_lock_ends_total, by EndReason.
var endReasonNames = [4]string{"", "released", "expired", "revoked"}

func (c *eventCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOps, descGrants, descEnds, descTimeouts, descQueued, descWait, descHold, descDepth} {
		ch <- d
	}
}

func (c *eventCollector) Collect(ch chan<- prometheus.Metric) {
	m := (*metrics)(c)
	m.s.mu.Lock()
	answers := m.answers
	ps := make([]prefixMetrics, len(m.order))
	for i, p := range m.order {
		ps[i] = *p
		for _, h := range []*histo{&ps[i].wait, &ps[i].hold, &ps[i].depth} {
			h.counts = slices.Clone(h.counts)
		}
	}
	m.s.mu.Unlock()
	counter := func(d *prometheus.Desc, v uint64, created time.Time, labels ...string) {
		ch <- prometheus.MustNewConstMetricWithCreatedTimestamp(d, prometheus.CounterValue, float64(v), created, labels...)
	}
	for o := range answers {
		for s := range answers[o] {
			if n := answers[o][s] + m.local[o][s].Load(); n > 0 {
				counter(descOps, n, m.enabled, opSlotNames[o], statusSlotNames[s])
			}
		}
	}
	for i := range ps {
		p := &ps[i]
		counter(descGrants, p.grants[0], p.created, p.name, "immediate")
		counter(descGrants, p.grants[1], p.created, p.name, "handoff")
		for how := locktable.EndReleased; how <= locktable.EndRevoked; how++ {
			counter(descEnds, p.ends[how], p.created, p.name, endReasonNames[how])
		}
		counter(descTimeouts, p.timeouts, p.created, p.name)
		counter(descQueued, p.queued, p.created, p.name)
		ch <- p.wait.constHistogram(descWait, waitBuckets, p.created, p.name)
		ch <- p.hold.constHistogram(descHold, holdBuckets, p.created, p.name)
		ch <- p.depth.constHistogram(descDepth, depthBuckets, p.created, p.name)
	}
}
