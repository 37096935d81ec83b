package server

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/ticketing/ticketing/internal/adminhttp"
	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/wire"
)

// Metrics: Prometheus exposition on the admin listener's GET /metrics (docs/operations.md,
// "Metrics", lists every series; expo.go writes the text format).
//
// Two kinds of series:
//   - counted as things happen (lock events by key prefix, answers by op and status, handshake
//     outcomes): the lock table's Observer (the methods Granted, Ended, Queued, TimedOut below)
//     and one-line hooks in the request path (answered, answerLocal, authFailure, ...). They
//     run only after EnableMetrics (TICKETING_METRICS=on, the default);
//   - read when scraped (connections, sessions, keys, waiters, the token store, Raft, the Go
//     runtime and the process): writeState takes Server.mu once per scrape. They are always
//     there.
//
// The hot path is plain arithmetic: the lock events and the answers routed by the route step are counted
// in plain integers and fixed bucket arrays under Server.mu (which the observer hooks and the route step
// already hold); a key's prefix series is found once per event (a one-entry cache in front of a
// small fixed hash index, prefixIndex). A scrape copies the counts under Server.mu (events) and
// writes them. The counts kept outside Server.mu (answerLocal: PING and INVALID from the
// validate step; the handshake counters) are atomic.
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
	s  *Server
	on bool // EnableMetrics ran (before Serve): the event counters below are live

	scrapeMu sync.Mutex
	expo     expo // the last scrape's buffers, reused (scrapeMu)

	// Answers by op and status: routed by the route step (Server.mu), and written by the validate step
	// outside it (atomic). A series exists once its count is non-zero.
	answers [numOpSlots][numStatusSlots]uint64
	local   [numOpSlots][numStatusSlots]atomic.Uint64

	authFailures  atomic.Uint64
	refusals      [numStatusSlots]atomic.Uint64 // a series once non-zero
	attaches      [2]atomic.Uint64              // new, resumed
	slowConsumers atomic.Uint64
	leaderChanges atomic.Uint64 // cluster: leader changes seen (metrics_raft.go)

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

// initMetrics creates the metrics: the series read at scrape time are there from the start;
// the event counters start with EnableMetrics.
func (s *Server) initMetrics() *metrics {
	m := &metrics{s: s}
	m.top.init(topKeysSize)
	installRaftSink()
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
	s.mu.Lock()
	m.other = m.newPrefix(otherPrefix)
	s.mu.Unlock()
	m.on = true
	s.SetObserver(m)
	if s.cluster != nil && s.cluster.raft != nil {
		m.watchLeaderChanges(s.cluster)
	}
}

// newPrefix creates the series of a prefix. Server.mu must be held. Not inlined: its
// temporaries would sit in prefix's frame, on every request's stack (see locktable's Table.out).
//
//go:noinline
func (m *metrics) newPrefix(name string) *prefixMetrics {
	p := &prefixMetrics{name: name,
		wait: newHisto(waitBoundsNs), hold: newHisto(holdBoundsNs), depth: newHisto(depthBoundsIn)}
	m.order = append(m.order, p)
	return p
}

// keyPrefix is the part of key that names its prefix series (see the package comment above),
// cut at maxPrefixLen+1 bytes (a longer prefix counts as "other" whatever follows), and its hash
// for prefixIndex. One pass, eight bytes at a time: the words before the one holding the first
// separator are hashed as they are scanned, and that word (or the last, short one) ends the
// hash with the prefix's bytes in it. The hash depends on the prefix alone.
func keyPrefix(key []byte) ([]byte, uint64) {
	const k2 = 0xbf58476d1ce4e5b9
	n := min(len(key), maxPrefixLen+1)
	h := uint64(0)
	i := 0
	for ; i+8 <= n; i += 8 {
		w := binary.LittleEndian.Uint64(key[i:])
		if m := separators(w); m != 0 {
			j := bits.TrailingZeros64(m) / 8
			return key[:i+j], prefixHashEnd(h, w&(1<<(8*j)-1), i+j)
		}
		h = (h ^ w) * k2
		h ^= h >> 31
	}
	if i == n {
		return key[:n], prefixHashEnd(h, 0, n)
	}
	// The last 1-7 bytes, in the low bytes of w (the bytes above them are zero, no separator).
	var w uint64
	if n >= 8 {
		w = binary.LittleEndian.Uint64(key[n-8:]) >> (8 * (8 - (n - i)))
	} else {
		for k := n - 1; k >= 0; k-- {
			w = w<<8 | uint64(key[k])
		}
	}
	if m := separators(w); m != 0 {
		j := bits.TrailingZeros64(m) / 8
		return key[:i+j], prefixHashEnd(h, w&(1<<(8*j)-1), i+j)
	}
	return key[:n], prefixHashEnd(h, w, n)
}

// prefixHashEnd ends a prefix's hash: h over its whole words, last its remaining bytes (low
// bytes first), n its length.
func prefixHashEnd(h, last uint64, n int) uint64 {
	const k1, k2 = 0x9e3779b97f4a7c15, 0xbf58476d1ce4e5b9
	h = (h ^ last ^ uint64(n)*k1) * k2
	h ^= h >> 32
	h *= 0xd6e8feb86659fd93
	return h ^ h>>32
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
	p, h := keyPrefix(key)
	if l := m.last; l != nil && string(p) == l.name {
		return l
	}
	pm, slot := m.prefixes.find(p, h)
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

// prefixIndex finds a prefix's series: open addressing over eight times as many slots as there
// can be prefixes, with a fixed word-at-a-time hash whose top bits pick the slot. It holds at most
// maxPrefixes entries, so a lookup ends within that many probes whatever the keys; no seed is
// needed. Most lookups miss once the index is full (keys without a separator are each their own
// prefix, and go to "other"): at an eighth full a miss mostly ends at its first slot, where at
// half full it probed 2.5 slots on average.
type prefixIndex [8 * maxPrefixes]struct {
	h uint64
	p *prefixMetrics
}

// find returns p's series (h: its hash, from keyPrefix), or nil and the empty slot where it
// would go.
func (x *prefixIndex) find(p []byte, h uint64) (*prefixMetrics, int) {
	i := int(h >> 56) // 256 slots
	for x[i].p != nil {
		if x[i].h == h && x[i].p.name == string(p) {
			return x[i].p, i
		}
		i = (i + 1) % len(x)
	}
	return nil, i
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
		m.authFailures.Add(1)
	}
}

// handshakeRefused counts a CHALLENGE that refused the connection.
func (m *metrics) handshakeRefused(st wire.Status) {
	if m.on {
		m.refusals[statusSlot(st)].Add(1)
	}
}

// sessionAttached counts a completed handshake.
func (m *metrics) sessionAttached(resumed bool) {
	if !m.on {
		return
	}
	if resumed {
		m.attaches[1].Add(1)
	} else {
		m.attaches[0].Add(1)
	}
}

// slowConsumer counts a connection closed for not reading.
func (m *metrics) slowConsumer() {
	if m.on {
		m.slowConsumers.Add(1)
	}
}

// serveMetrics is GET /metrics.
func (m *metrics) serveMetrics(w *adminhttp.Response, r *adminhttp.Request) {
	w.Set("Content-Type", expoContentType)
	m.scrapeMu.Lock()
	defer m.scrapeMu.Unlock()
	w.Write(m.scrapeLocked())
}

// scrape is the whole exposition: the state, the events (with EnableMetrics), the runtime.
func (m *metrics) scrape() []byte {
	m.scrapeMu.Lock()
	defer m.scrapeMu.Unlock()
	return bytes.Clone(m.scrapeLocked())
}

// scrapeLocked writes the exposition into the buffers kept for the next scrape and returns it,
// valid until scrapeMu is released. scrapeMu must be held.
func (m *metrics) scrapeLocked() []byte {
	e := &m.expo
	if e.b == nil {
		e.b = make([]byte, 0, 16<<10)
	}
	e.b = e.b[:0]
	m.writeState(e)
	if m.on {
		m.writeEvents(e, m.events())
	}
	e.writeRuntime()
	return e.b
}
