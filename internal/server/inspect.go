package server

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ticketing/ticketing/internal/adminhttp"
	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/internal/server/adminpage"
	"github.com/ticketing/ticketing/wire"
)

// Inspection on the admin listener: JSON for operators and the admin page (adminpage/).
//
//	GET /                    the admin page
//	GET /metrics             Prometheus exposition (metrics.go)
//	GET /api/key?key=K       one key: holder (token, lease left, session, remote address) and
//	                         its waiters in queue order (&waiters=N, default 100, at most 10,000)
//	GET /api/locks           present keys, most waited on first (&limit=N, default 100, at most
//	                         1,000; the first 10,000 keys of the table are looked at)
//	GET /api/top             the most contended keys from the contention sketch (&n=N, default
//	                         20, at most 64)
//	GET /api/stats           totals for the page's live charts (counters, the wait histogram
//	                         of all prefixes together, the gauges)
//
// Tokens and sessions are shown: the admin listener serves an operator holding the admin
// credential (docs/operations.md, "Trust model"). A session is shown by the first 4 bytes of
// its id (hex) and its number, never whole: a full session id is a capability.

// Party is who holds or waits: the session and, while it is attached, its connection's address.
type Party struct {
	Session   string `json:"session"`    // the session id's first 4 bytes, hex
	SessionNo uint64 `json:"session_no"` // the session's number on this node (1, 2, ...)
	RequestID uint64 `json:"request_id"`
	// Attached: the session has a connection, to this node or (on a follower, which serves no
	// clients) to the leader. Remote is that connection's address when it is this node's ("" on
	// a follower: the session is connected through the leader, whose admin listener has it).
	Attached    bool   `json:"attached"`
	Remote      string `json:"remote"`
	GraceLeftMs int64  `json:"grace_left_ms,omitempty"` // detached: time left before the session ends
}

// Waiter is one queued acquire.
type Waiter struct {
	Party
	Position   int    `json:"position"` // 1 = next in line
	WaitedMs   int64  `json:"waited_ms"`
	LeaseMs    int64  `json:"lease_ms"`
	WaitLeftMs *int64 `json:"wait_left_ms"` // null: waits without limit
	Try        bool   `json:"try,omitempty"`
}

// KeyInfo is GET /api/key.
type KeyInfo struct {
	Key             string   `json:"key"`
	Present         bool     `json:"present"` // held, waited on, in lock-delay or stalled
	Held            bool     `json:"held"`
	Token           uint64   `json:"token,omitempty"`
	LeaseLeftMs     int64    `json:"lease_left_ms,omitempty"`
	HeldForMs       int64    `json:"held_for_ms,omitempty"`
	Holder          *Party   `json:"holder,omitempty"`
	Revocable       bool     `json:"revocable,omitempty"`
	LockDelayLeftMs int64    `json:"lock_delay_left_ms,omitempty"`
	Stalled         bool     `json:"stalled,omitempty"`
	WaiterCount     int      `json:"waiter_count"`
	Waiters         []Waiter `json:"waiters"`
}

// LockList is GET /api/locks.
type LockList struct {
	Keys    int       `json:"keys"` // present keys in all
	Held    int       `json:"held"`
	Waiters int       `json:"waiters"`
	Locks   []KeyInfo `json:"locks"` // without their waiter lists
}

// Stats is GET /api/stats.
//
// On a follower, the lock events (grants, hand-offs, releases, expiries, timeouts, queued, the
// wait histogram) and the table's gauges are the cluster's: a follower applies the same log as
// the leader. Operations and connections are this node's own: clients are served by the leader,
// so a follower answers none (its page says so and charts the grants it applies instead).
type Stats struct {
	TimeMs  int64  `json:"time_ms"`
	Metrics bool   `json:"metrics"` // event counters on (TICKETING_METRICS)
	Role    string `json:"role"`    // single, leader, follower, candidate
	// Cluster: this node, whether it serves clients, and the leader (id, client address, admin
	// listener when this node can tell: ClusterStatus.LeaderAdmin).
	Node        string  `json:"node,omitempty"`
	Serving     bool    `json:"serving"`
	Leader      string  `json:"leader,omitempty"`
	LeaderAddr  string  `json:"leader_addr,omitempty"`
	LeaderAdmin string  `json:"leader_admin,omitempty"`
	Operations  float64 `json:"operations"`
	Grants      float64 `json:"grants"`
	Handoffs    float64 `json:"handoffs"`
	Released    float64 `json:"released"`
	Expired     float64 `json:"expired"`
	Revoked     float64 `json:"revoked"`
	Timeouts    float64 `json:"timeouts"`
	Queued      float64 `json:"queued"`
	Wait        Hist    `json:"wait"` // ticketing_wait_seconds, every prefix together
	Connections int     `json:"connections"`
	Sessions    int     `json:"sessions"`
	Keys        int     `json:"keys"`
	HeldNow     int     `json:"held_now"`
	WaitersNow  int     `json:"waiters_now"`
	LastToken   uint64  `json:"last_token"`
}

// Hist is a cumulative histogram: Counts[i] observations at or below Bounds[i].
type Hist struct {
	Bounds []float64 `json:"bounds"`
	Counts []uint64  `json:"counts"`
	Count  uint64    `json:"count"`
	SumS   float64   `json:"sum_s"`
}

const (
	maxWaitersShown = 10_000
	maxLocksShown   = 1000
	locksScanned    = 10_000
)

// initOps creates the metrics and registers the inspection routes and the page on mux.
func (s *Server) initOps(mux *adminhttp.Mux) *metrics {
	m := s.initMetrics()
	mux.Handle("GET /metrics", m.serveMetrics)
	mux.Handle("GET /api/key", s.apiKey)
	mux.Handle("GET /api/locks", s.apiLocks)
	mux.Handle("GET /api/top", s.apiTop)
	mux.Handle("GET /api/stats", s.apiStats)
	page := adminpage.Handler("/ui/")
	mux.Handle("GET /", page)
	mux.Handle("GET /ui/*", page)
	return m
}

// inspectNow is the table time the listings measure against: the live clock, except on a
// follower, whose clock only the leader's log moves. Server.mu must be held.
func (s *Server) inspectNow() int64 {
	if !s.sm.serving() {
		return s.table.Now()
	}
	return max(s.now(), s.table.Now())
}

func writeJSON(w *adminhttp.Response, v any) {
	w.Set("Content-Type", "application/json")
	w.Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// intParam reads a positive integer query parameter, bounded by max.
func intParam(r *adminhttp.Request, name string, def, max int) int {
	v, err := strconv.Atoi(r.Query.Get(name))
	if err != nil || v < 1 {
		return def
	}
	return min(v, max)
}

func ms(ns int64) int64 { return ns / int64(time.Millisecond) }

// party describes owner's session. Server.mu must be held.
func (s *Server) party(o locktable.Owner, reqID uint64, now int64) Party {
	v := s.partyOf(o, reqID)
	return v.party(now)
}

// keyInfo fills what the table says about key, with up to nWaiters waiters. Server.mu must be
// held.
func (s *Server) keyInfo(key []byte, info locktable.Info, now int64, nWaiters int) KeyInfo {
	k := KeyInfo{Key: string(key), Present: true, Held: info.Held, WaiterCount: info.Waiters, Stalled: info.Stalled, Waiters: []Waiter{}}
	if info.Held {
		k.Token = info.Token
		k.LeaseLeftMs = max(ms(info.Deadline-now), 0)
		k.HeldForMs = max(ms(now-info.GrantedAt), 0)
		h := s.party(info.Holder, info.HolderReqID, now)
		k.Holder = &h
		k.Revocable = info.Revocable
	}
	if info.DelayUntil > now {
		k.LockDelayLeftMs = ms(info.DelayUntil - now)
	}
	if nWaiters > 0 && info.Waiters > 0 {
		ws, _ := s.table.Waiters(key, nil, nWaiters)
		for i, w := range ws {
			x := Waiter{Party: s.party(w.Owner, w.ReqID, now), Position: i + 1, WaitedMs: max(ms(now-w.Since), 0),
				LeaseMs: ms(w.Lease), Try: w.Try}
			if w.WaitUntil != 0 {
				left := max(ms(w.WaitUntil-now), 0)
				x.WaitLeftMs = &left
			}
			k.Waiters = append(k.Waiters, x)
		}
	}
	return k
}

func (s *Server) apiKey(w *adminhttp.Response, r *adminhttp.Request) {
	key := r.Query.Get("key")
	if key == "" {
		w.Error(400, "want ?key=KEY")
		return
	}
	n := intParam(r, "waiters", 100, maxWaitersShown)
	s.mu.Lock()
	now := s.inspectNow()
	info, ok := s.table.Inspect([]byte(key))
	k := KeyInfo{Key: key, Waiters: []Waiter{}}
	if ok {
		k = s.keyInfo([]byte(key), info, now, n)
	}
	s.mu.Unlock()
	writeJSON(w, k)
}

func (s *Server) apiLocks(w *adminhttp.Response, r *adminhttp.Request) {
	limit := intParam(r, "limit", 100, maxLocksShown)
	var l LockList
	// Under Server.mu only copies (keys into one buffer, the table's answers, the holder's
	// session and address); the strings, the sort and the JSON come after it is released.
	var views []lockView
	var keys []byte
	s.mu.Lock()
	now := s.inspectNow()
	l.Keys, l.Held, l.Waiters = s.table.Stats()
	s.table.EachKey(func(key []byte, info locktable.Info) bool {
		v := lockView{off: len(keys), n: len(key), info: info}
		if info.Held {
			v.holder = s.partyOf(info.Holder, info.HolderReqID)
		}
		keys = append(keys, key...)
		views = append(views, v)
		return len(views) < locksScanned
	})
	s.mu.Unlock()
	slices.SortFunc(views, func(a, b lockView) int {
		if a.info.Waiters != b.info.Waiters {
			return b.info.Waiters - a.info.Waiters
		}
		return bytes.Compare(keys[a.off:a.off+a.n], keys[b.off:b.off+b.n])
	})
	l.Locks = make([]KeyInfo, 0, min(len(views), limit))
	for _, v := range views[:min(len(views), limit)] {
		k := KeyInfo{Key: string(keys[v.off : v.off+v.n]), Present: true, Held: v.info.Held, WaiterCount: v.info.Waiters, Stalled: v.info.Stalled}
		if v.info.Held {
			k.Token = v.info.Token
			k.LeaseLeftMs = max(ms(v.info.Deadline-now), 0)
			k.HeldForMs = max(ms(now-v.info.GrantedAt), 0)
			h := v.holder.party(now)
			k.Holder = &h
			k.Revocable = v.info.Revocable
		}
		if v.info.DelayUntil > now {
			k.LockDelayLeftMs = ms(v.info.DelayUntil - now)
		}
		l.Locks = append(l.Locks, k)
	}
	writeJSON(w, l)
}

// lockView is one key of /api/locks as read under Server.mu: its bytes at off..off+n of the
// listing's key buffer, the table's answer and its holder.
type lockView struct {
	off, n int
	info   locktable.Info
	holder partyView
}

// partyView is a session as read under Server.mu (partyOf); party formats it without the lock.
type partyView struct {
	owner    locktable.Owner
	reqID    uint64
	sid      [wire.SessionIDSize]byte
	graceEnd int64
	known    bool     // the session exists
	attached bool     // it has a connection
	remote   net.Addr // the connection's peer, if this node has it
}

// partyOf reads owner's session. Server.mu must be held.
func (s *Server) partyOf(o locktable.Owner, reqID uint64) partyView {
	v := partyView{owner: o, reqID: reqID}
	sid, connID, graceEnd, ok := s.table.SessionOf(o)
	if !ok {
		return v
	}
	v.sid, v.graceEnd, v.known, v.attached = sid, graceEnd, true, connID != 0
	if c := s.conns[connID]; connID != 0 && c != nil && c.nc != nil {
		v.remote = c.nc.RemoteAddr()
	}
	return v
}

// party formats v as the admin API shows a session.
func (v *partyView) party(now int64) Party {
	p := Party{SessionNo: uint64(v.owner) >> 24, RequestID: v.reqID}
	if !v.known {
		return p
	}
	p.Session = hex.EncodeToString(v.sid[:4])
	if !v.attached {
		p.GraceLeftMs = max(ms(v.graceEnd-now), 0)
		return p
	}
	p.Attached = true
	if v.remote != nil {
		p.Remote = v.remote.String()
	}
	return p
}

// TopList is GET /api/top.
type TopList struct {
	Metrics bool     `json:"metrics"`
	Keys    []TopKey `json:"keys"`
	// Uncertain: tracked keys left out because their count is mostly the sketch's error bound
	// (see TopKey.Uncertain); &all=1 includes them.
	Uncertain int `json:"uncertain"`
}

func (s *Server) apiTop(w *adminhttp.Response, r *adminhttp.Request) {
	n := intParam(r, "n", 20, topKeysSize)
	all := r.Query.Get("all") == "1"
	m := s.metrics
	s.mu.Lock()
	top, uncertain := m.top.list(n, all)
	for i := range top {
		if info, ok := s.table.Inspect([]byte(top[i].Key)); ok {
			top[i].Held, top[i].Waiters = info.Held, info.Waiters
		}
	}
	s.mu.Unlock()
	writeJSON(w, TopList{Metrics: m.on, Keys: top, Uncertain: uncertain})
}

func (s *Server) apiStats(w *adminhttp.Response, r *adminhttp.Request) {
	m := s.metrics
	st := Stats{TimeMs: time.Now().UnixMilli(), Metrics: m.on, Role: "single", Serving: true}
	if c := s.cluster; c != nil {
		st.Role = strings.ToLower(c.raft.State().String())
		st.Node, st.Serving = c.cfg.NodeID, c.leads()
		_, lid := c.raft.LeaderWithID()
		st.Leader = string(lid)
		if st.Leader == c.cfg.NodeID {
			st.LeaderAddr = c.advertise()
		} else {
			st.LeaderAddr = c.leaderHint()
		}
		st.LeaderAdmin = s.leaderAdminAddr(st.LeaderAddr)
	}
	s.mu.Lock()
	st.Keys, st.HeldNow, st.WaitersNow = s.table.Stats()
	st.Sessions = s.table.Sessions()
	st.Connections = len(s.conns)
	st.LastToken = s.table.LastToken()
	s.mu.Unlock()
	st.Wait.Bounds, st.Wait.Counts = waitBuckets, make([]uint64, len(waitBuckets))
	if m.on {
		st.addEvents(m.events())
	}
	writeJSON(w, st)
}

// addEvents adds the event counts to the totals of st.
func (st *Stats) addEvents(c eventCounts) {
	for o := range c.answers {
		for _, n := range c.answers[o] {
			st.Operations += float64(n)
		}
	}
	for i := range c.prefixes {
		p := &c.prefixes[i]
		st.Grants += float64(p.grants[0] + p.grants[1])
		st.Handoffs += float64(p.grants[1])
		st.Released += float64(p.ends[locktable.EndReleased])
		st.Expired += float64(p.ends[locktable.EndExpired])
		st.Revoked += float64(p.ends[locktable.EndRevoked])
		st.Timeouts += float64(p.timeouts)
		st.Queued += float64(p.queued)
		var cum uint64
		for b := range st.Wait.Counts {
			cum += p.wait.counts[b]
			st.Wait.Counts[b] += cum
		}
		st.Wait.Count += p.wait.n
		st.Wait.SumS += p.wait.sum
	}
}
