package server

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"

	"github.com/ticketing/ticketing/internal/clock"
	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/internal/raftnet"
	"github.com/ticketing/ticketing/internal/store"
	"github.com/ticketing/ticketing/wire"
)

// ClusterConfig turns a node into a member of a Raft cluster (docs/cluster.md). The lock table
// is the replicated state machine: the leader proposes exactly the command entries a single
// node applies directly (locktable command encoding), batched from all connections while an
// earlier proposal is in flight (group commit), and every node applies them in log order.
type ClusterConfig struct {
	NodeID    string // unique, stable name of this node
	RaftAddr  string // where this node listens for its peers
	Advertise string // the client address other nodes hand out as leader hint (default: Addr)
	// Peers: every member as id=raft-address, this node included. On a fresh data directory
	// the nodes bootstrap the cluster with exactly this membership (all with the same list).
	Peers  map[string]string
	Secret []byte // node-to-node authentication secret (HMAC); required
	// RaftTLS encrypts node-to-node traffic (both sides present certificates; nil = plain TCP
	// with HMAC authentication only).
	RaftServerTLS, RaftClientTLS *tls.Config
	Timing                       float64 // multiplier over the base timing (heartbeat = election = 500 ms); default 1
	LogStore                     string  // "wal" (default) or "bolt"
	// Snapshots (hashicorp/raft's settings; 0: the default): a snapshot is taken when this many
	// entries were applied since the last one, checked every SnapshotInterval to twice that, and
	// TrailingLogs entries are kept after it for followers that lag.
	SnapshotThreshold uint64        // default 16384
	SnapshotInterval  time.Duration // default 30s
	TrailingLogs      uint64        // default 10240
	// Join: this node joins an existing cluster (an operator adds it with `ticketing cluster
	// add`); it never bootstraps, even on a fresh data directory.
	Join bool
	// Recover: a forced recovery after the permanent loss of a majority: this node's Raft
	// configuration is replaced by Peers (hashicorp/raft RecoverCluster) before it starts. The
	// recovered cluster gets a new state id, tokens above everything the old state could have
	// issued, and grants nothing for TICKETING_MAX_LEASE (docs/cluster.md).
	Recover bool
}

// Snapshot defaults (ClusterConfig).
const (
	DefaultSnapshotThreshold = 16384
	DefaultSnapshotInterval  = 30 * time.Second
	DefaultTrailingLogs      = 10240
)

func orDefault[T uint64 | time.Duration](v, d T) T {
	if v == 0 {
		return d
	}
	return v
}

// Base timing: heartbeat = election timeout = 500 ms (a median ~1.2 s from a dead leader to
// the next commit, measured); leader lease 250 ms. Scaled by ClusterConfig.Timing.
const (
	baseHeartbeat   = 500 * time.Millisecond
	baseLeaderLease = 250 * time.Millisecond
	tickEvery       = 500 * time.Millisecond // a TICK at least this often while deadlines are pending
	maxEntry        = 1 << 20                // an entry is closed (and a new one begun) once it holds this many bytes
	maxInflight     = 2                      // proposals in flight at once
)

// RecoveryTokenMargin is how far a forced recovery (ClusterConfig.Recover) raises the token
// counter above the last token in the recovering node's own log: its first entry as leader
// seeds the counter at max(that last token + RecoveryTokenMargin, TICKETING_MIN_TOKEN, the data
// directory's single-node high-water mark), and tokens continue above it.
//
// The bound: the survivor's log may lack entries that the lost majority committed, and every
// grant in them took the next token, one above the last. So no token is ever issued twice as
// long as the entries the survivor lacks granted fewer than 2^40 (about 1.1 * 10^12) tokens,
// and raised the counter by no SEED of their own beyond that margin (a leader whose
// TICKETING_MIN_TOKEN or data directory was higher than every token before it); 2^40 grants are
// 12.7 days at a sustained million grants per second. A lag beyond that, or a token record
// higher than the margin covers, needs TICKETING_MIN_TOKEN on the recovering node, which is
// always honoured as a floor. Each recovery spends 2^40 of the 2^64 tokens.
const RecoveryTokenMargin uint64 = 1 << 40

// FailoverBound is the shortest lease a cluster accepts by default: a failover may cost up to
// about this (election plus a commit), and a lease shorter than that expires during one.
func (cc *ClusterConfig) FailoverBound() time.Duration {
	return time.Duration(float64(2*baseHeartbeat) * cc.timing())
}

func (cc *ClusterConfig) timing() float64 {
	if cc.Timing <= 0 {
		return 1
	}
	return cc.Timing
}

// cluster is the Raft side of a Server.
type cluster struct {
	s      *Server
	cfg    *ClusterConfig
	raft   *raft.Raft
	layer  *raftnet.Layer
	trans  *raft.NetworkTransport
	closer []io.Closer

	leader atomic.Bool  // this node is the leader and has committed its first entry
	stamp0 atomic.Int64 // leader: its log time base (becomeLeader)
	mono0  time.Time    // leader: local monotonic time at the base
	monoMu sync.Mutex
	// The table time this node last applied (the highest stamp so far) and when, on its own
	// monotonic clock: a new leader's log time continues from there (becomeLeader). Guarded by
	// Server.mu.
	appliedNow int64
	appliedAt  time.Time
	connBase   uint64 // connection ids: a random base per process

	prop proposer
	logs *timedLogStore

	recovered    bool // this node ran a forced recovery at start; its first lead makes a new state
	recoveryDone bool

	halted atomic.Bool // a committed entry could not be applied: see applyFailed
}

// proposer accumulates commands from all connections into one entry while proposals are in
// flight, then proposes it (group commit).
//
// Bounds: an entry is closed once it holds maxEntry bytes (it may exceed that by the one batch
// that crossed it) and queued behind the open one; the propose goroutine submits them in order,
// at most maxInflight at once. What is queued (closed entries and the open one: accepted, not
// yet handed to Raft) is bounded by Config.RaftMaxPending through backpressure: a connection
// reader (beginConn) waits while that much is queued, so it stops reading and TCP flow control
// reaches the client. Commands the server makes itself (DETACH, UNDELIVERED, TICK, ATTACH;
// small, some proposed under Server.mu) never wait, so the bound can be exceeded by those and by
// one batch per reader. Memory for client requests on the leader is therefore about
// RaftMaxPending + maxInflight*maxEntry, plus what Raft itself keeps.
type proposer struct {
	mu     sync.Mutex
	enc    locktable.Encoder // the open entry
	n      int               // commands in enc; 0: enc holds nothing to propose
	closed [][]byte          // full entries waiting for a slot, oldest first
	cbytes int               // bytes in closed
	limit  int               // readers wait while queued() >= limit (Config.RaftMaxPending)
	room   sync.Cond         // on mu: queued() fell below limit, or waiting must end
	stop   bool              // the propose goroutine has exited: nobody waits any more
	leader *atomic.Bool      // the cluster's leader flag: a node that does not lead makes nobody wait
	kick   chan struct{}
	slots  chan struct{} // in-flight proposals
}

// queued is the number of bytes accepted and not yet handed to Raft. p.mu must be held.
func (p *proposer) queued() int {
	if p.n == 0 {
		return p.cbytes
	}
	return p.cbytes + p.enc.Len()
}

func (p *proposer) begin() {
	p.mu.Lock()
	if p.n == 0 {
		p.enc.Reset(0) // stamped at submission
	}
	p.n++
}

// beginConn is begin for a connection reader's batch: it first waits while RaftMaxPending bytes
// or more are queued (see proposer). Server.mu must not be held.
func (p *proposer) beginConn() {
	p.mu.Lock()
	for p.queued() >= p.limit && !p.stop && p.leader.Load() {
		p.room.Wait()
	}
	if p.n == 0 {
		p.enc.Reset(0)
	}
	p.n++
}

func (p *proposer) end() {
	if p.enc.Len() >= maxEntry {
		// Close the entry: the next command begins a new one.
		e := bytes.Clone(p.enc.Bytes())
		p.closed = append(p.closed, e)
		p.cbytes += len(e)
		p.n = 0
	}
	p.mu.Unlock()
	p.poke()
}

// poke wakes the propose goroutine.
func (p *proposer) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// wake ends the readers' wait when it must end regardless of room: leadership lost, or the
// proposer stopped.
func (p *proposer) wake() {
	p.mu.Lock()
	p.room.Broadcast()
	p.mu.Unlock()
}

// next takes the next entry to propose: the oldest closed one, else the open one (nil: none).
// p.mu must be held.
func (p *proposer) next() []byte {
	var e []byte
	switch {
	case len(p.closed) > 0:
		e = p.closed[0]
		p.closed[0] = nil
		p.closed = p.closed[1:]
		p.cbytes -= len(e)
		if len(p.closed) == 0 {
			p.closed = nil // let the queue's memory go
		}
	case p.n > 0:
		e = bytes.Clone(p.enc.Bytes())
		p.n = 0
	}
	if p.queued() < p.limit {
		p.room.Broadcast()
	}
	return e
}

// drop discards everything queued (commands of a node that no longer leads: their clients
// resume elsewhere). p.mu must be held.
func (p *proposer) drop() {
	clear(p.closed)
	p.closed, p.cbytes, p.n = nil, 0, 0
	p.room.Broadcast()
}

// startCluster opens the Raft node. Called by New when cfg.Cluster is set.
func (s *Server) startCluster() error {
	cc := s.cfg.Cluster
	c := &cluster{s: s, cfg: cc}
	c.prop.kick = make(chan struct{}, 1)
	c.prop.slots = make(chan struct{}, maxInflight)
	c.prop.limit = s.cfg.RaftMaxPending
	c.prop.room.L = &c.prop.mu
	c.prop.leader = &c.leader
	var b [8]byte
	rand.Read(b[:])
	c.connBase = uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32
	s.cluster = c

	dir := filepath.Join(s.cfg.DataDir, "raft")
	local := s.store.State()
	if local.Cluster && !cc.Join && s.cfg.MinToken == 0 && !hasFiles(dir) {
		// The directory served a cluster node whose Raft state is gone: a new cluster seeded
		// from it would hand out tokens the old cluster already issued, at once.
		return fmt.Errorf("data directory %s served a cluster node, but its Raft state (%s) is gone: a new cluster started from it would issue tokens the old cluster already issued and grant keys its holders may still hold; "+
			"to start a new cluster, start every node with TICKETING_MIN_TOKEN above the old cluster's last token (at least %d, the last this node recorded; the old leader's ticketing_last_token metric shows it): the first leader then waits the maximum lease before its first grant; "+
			"to bring this node back into its cluster, join it (TICKETING_JOIN) and add it from the leader", s.cfg.DataDir, dir, local.TokenLimit)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var logs raft.LogStore
	var stable raft.StableStore
	switch cc.LogStore {
	case "", "wal":
		if err := os.MkdirAll(filepath.Join(dir, "wal"), 0o700); err != nil {
			return err
		}
		w, err := raftwal.Open(filepath.Join(dir, "wal"))
		if err != nil {
			return fmt.Errorf("raft log (wal): %w", err)
		}
		logs, stable = w, w
		c.closer = append(c.closer, w)
	case "bolt":
		bs, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
		if err != nil {
			return fmt.Errorf("raft log (bolt): %w", err)
		}
		logs, stable = bs, bs
		c.closer = append(c.closer, bs)
	default:
		return fmt.Errorf("TICKETING_RAFT_STORE %q: want wal or bolt", cc.LogStore)
	}
	timed := &timedLogStore{LogStore: logs, stall: os.Getenv("TICKETING_FAILPOINT_STALL_FILE")}
	logs = timed
	c.logs = timed
	hl := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: slogWriter{s.log}})
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hl)
	if err != nil {
		return fmt.Errorf("raft snapshots: %w", err)
	}
	adv, err := net.ResolveTCPAddr("tcp", cc.Peers[cc.NodeID])
	if err != nil || cc.Peers[cc.NodeID] == "" {
		return fmt.Errorf("TICKETING_PEERS must name this node (%s) with its raft address", cc.NodeID)
	}
	layer, err := raftnet.Listen(cc.RaftAddr, raftnet.Options{Secret: cc.Secret, ServerTLS: cc.RaftServerTLS,
		ClientTLS: cc.RaftClientTLS, Advertise: adv, Logger: s.log,
		AcceptTimeout: max(2*time.Second, time.Duration(float64(4*baseHeartbeat)*cc.timing()))})
	if err != nil {
		return fmt.Errorf("raft listen %s: %w", cc.RaftAddr, err)
	}
	c.layer = layer
	c.trans = raft.NewNetworkTransportWithLogger(layer, 3, 10*time.Second, hl)

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cc.NodeID)
	m := cc.timing()
	rc.HeartbeatTimeout = time.Duration(float64(baseHeartbeat) * m)
	rc.ElectionTimeout = time.Duration(float64(baseHeartbeat) * m)
	rc.LeaderLeaseTimeout = time.Duration(float64(baseLeaderLease) * m)
	rc.CommitTimeout = 5 * time.Millisecond
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 256
	rc.SnapshotThreshold = orDefault(cc.SnapshotThreshold, DefaultSnapshotThreshold)
	rc.SnapshotInterval = orDefault(cc.SnapshotInterval, DefaultSnapshotInterval)
	rc.TrailingLogs = orDefault(cc.TrailingLogs, DefaultTrailingLogs)
	rc.Logger = hl
	if err := raft.ValidateConfig(rc); err != nil {
		return err
	}
	has, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return err
	}
	if !has && !local.Cluster && local.TokenLimit > s.cfg.MinToken {
		// The directory served a single node: clients may hold its fencing tokens, and a cluster
		// that starts its own tokens lower would hand out smaller ones after them. The first
		// leader seeds the cluster's tokens from its own TICKETING_MIN_TOKEN (and its own
		// directory), whichever node that is, so the floor has to be given to every node; a
		// warning in one node's log was too easy to miss.
		if cc.Join {
			return fmt.Errorf("data directory %s served a single node (tokens up to %d): a joining node cannot carry its tokens into the cluster; join with an empty data directory, after making sure the cluster's tokens are above %d", s.cfg.DataDir, local.TokenLimit, local.TokenLimit)
		}
		return fmt.Errorf("data directory %s served a single node (tokens up to %d): to make it part of a new cluster, start every node of that cluster with TICKETING_MIN_TOKEN=%d (or higher) so that no token goes backwards", s.cfg.DataDir, local.TokenLimit, local.TokenLimit)
	}
	if !local.Cluster {
		// From now on the directory is a cluster node's: a single node refuses it (New).
		if err := s.store.MarkCluster(true); err != nil {
			return fmt.Errorf("data directory %s: %w", s.cfg.DataDir, err)
		}
	}
	if cc.Recover {
		if !has {
			return errors.New("TICKETING_RAFT_RECOVER on a data directory without Raft state: nothing to recover")
		}
		var servers []raft.Server
		for id, addr := range cc.Peers {
			servers = append(servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(addr)})
		}
		if err := raft.RecoverCluster(rc, (*fsm)(c), logs, stable, snaps, c.trans, raft.Configuration{Servers: servers}); err != nil {
			return fmt.Errorf("raft recovery: %w", err)
		}
		c.recovered = true
		s.log.Warn("cluster: forced recovery: the Raft configuration was replaced; the recovered state gets a new state id", "peers", len(servers))
	}
	r, err := raft.NewRaft(rc, (*fsm)(c), logs, stable, snaps, c.trans)
	if err != nil {
		return fmt.Errorf("raft: %w", err)
	}
	c.raft = r
	if !has && !cc.Join {
		var servers []raft.Server
		for id, addr := range cc.Peers {
			servers = append(servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(addr)})
		}
		f := r.BootstrapCluster(raft.Configuration{Servers: servers})
		if err := f.Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			return fmt.Errorf("raft bootstrap: %w", err)
		}
	}
	return nil
}

// slogWriter routes hashicorp/raft's log lines to the server's logger.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn(string(bytes.TrimSpace(p)))
	return len(p), nil
}

// runCluster runs the leadership watcher, the proposer and the leader's clock until Shutdown.
func (c *cluster) run() {
	s := c.s
	s.wg.Add(3)
	go c.watchLeadership()
	go c.propose()
	go c.watchDisk(c.logs)
}

// nextConnID returns a connection id unique across the cluster's nodes and restarts.
func (c *cluster) nextConnID(n uint64) uint64 { return c.connBase | n }

// stamp is the leader's log time now: its base (becomeLeader: the last stamp applied, plus the
// time since this node applied it) plus its own monotonic time since (never a raw clock
// reading: each node's clock has its own origin).
func (c *cluster) stamp() int64 {
	c.monoMu.Lock()
	defer c.monoMu.Unlock()
	el := time.Since(c.mono0)
	if testClockRate != 1 {
		el = time.Duration(float64(el) * testClockRate)
	}
	return c.stamp0.Load() + int64(el)
}

// testClockRate (TICKETING_TEST_CLOCK_RATE, tests only) makes this node's clock run fast (> 1)
// or slow (< 1). PROTOCOL.md bounds each clock's rate error by CLOCK_RATE_BOUND_PPM; within that
// bound a lease never ends before its holder's local deadline.
var testClockRate = func() float64 {
	if v, err := strconv.ParseFloat(os.Getenv("TICKETING_TEST_CLOCK_RATE"), 64); err == nil && v > 0 {
		return v
	}
	return 1
}()

// watchLeadership reacts to this node gaining or losing leadership.
func (c *cluster) watchLeadership() {
	defer c.s.wg.Done()
	obs := make(chan raft.Observation, 16)
	o := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	c.raft.RegisterObserver(o)
	defer c.raft.DeregisterObserver(o)
	check := time.NewTicker(100 * time.Millisecond)
	defer check.Stop()
	isLeader := false
	for {
		select {
		case <-c.s.done:
			return
		case <-obs:
		case <-check.C:
		}
		now := c.raft.State() == raft.Leader && !c.halted.Load()
		switch {
		case now && !isLeader:
			isLeader = true
			if err := c.becomeLeader(); err != nil {
				c.s.log.Warn("cluster: leadership not established", "err", err)
				isLeader = false
			}
		case !now && isLeader:
			isLeader = false
			reason := wire.GoawayLeadership
			if c.s.isStopping() {
				reason = wire.GoawayStopping
			}
			c.loseLeadership(reason)
		}
	}
}

// becomeLeader: a Barrier (every earlier entry applied), then the time base, then the first
// entry: this node's client address, its table limits (CONFIG: every replica applies the
// leader's limits from here on, so they never differ between replicas), the state id if the
// cluster has none, the token floor of this node's data directory, and DETACH_ALL — no session
// has a connection to this node yet. Only after that entry commits does the node accept clients.
func (c *cluster) becomeLeader() error {
	s := c.s
	if c.halted.Load() {
		return errors.New("this node stopped applying the log")
	}
	if err := c.raft.Barrier(10 * time.Second).Error(); err != nil {
		return err
	}
	s.mu.Lock()
	base := s.table.Now()
	if base == c.appliedNow && !c.appliedAt.IsZero() {
		// The log's time goes on from the last stamp applied here, plus the time since this
		// node applied it: at least that much real time has passed since the old leader stamped
		// it (stamped before applied), so the log's time stays behind real time, as it must,
		// without losing the idle time before a leader change (a waiter's detail, and so its
		// holder's local deadline, counts it).
		base += int64(float64(time.Since(c.appliedAt)) * testClockRate)
	}
	state := s.table.StateID()
	s.mu.Unlock()
	c.monoMu.Lock()
	c.stamp0.Store(base)
	c.mono0 = time.Now()
	c.monoMu.Unlock()
	var e locktable.Encoder
	now := c.stamp()
	e.Reset(now)
	e.Node(c.cfg.NodeID, c.advertise())
	e.Config(s.tableConfig().Limits())
	local := s.store.State()
	seed := max(local.TokenLimit, s.cfg.MinToken)
	switch {
	case c.recovered && !c.recoveryDone:
		// A forced recovery: the log this node kept may lack entries the lost majority
		// committed. New state id; tokens RecoveryTokenMargin above what this log saw (and
		// above the operator's floor: see RecoveryTokenMargin for the bound); no grant until
		// every lease the old state could hold has ended.
		s.mu.Lock()
		last := s.table.LastToken()
		s.mu.Unlock()
		jump := last + RecoveryTokenMargin
		if jump < last {
			jump = math.MaxUint64 // saturated: no token is left to issue
		}
		seed = max(seed, jump)
		s.log.Warn("cluster: forced recovery: tokens continue above the last one in this log plus the recovery margin",
			"last_token", last, "next_token_above", seed)
		rand.Read(state[:])
		e.Init(&state, true, now+int64(s.cfg.MaxLease))
	case state == ([wire.StateIDSize]byte{}):
		// A new cluster. Converted from a single node (its data directory has history),
		// restored (an operator's token floor) or started again from a directory that served a
		// cluster node: no grant until the old state's leases have ended (the single node's
		// recorded horizon; unknown: the maximum lease).
		var wait time.Duration
		switch {
		case local.HorizonBoot != 0:
			wait = store.StartupWait(local, store.BootID(), clock.Boottime(), clock.Wall())
		case local.TokenLimit > 0 || s.cfg.MinToken > 0:
			wait = s.cfg.MaxLease
		}
		rand.Read(state[:])
		e.Init(&state, false, now+int64(wait))
	}
	e.Seed(seed)
	e.DetachAll()
	if err := c.raft.Apply(bytes.Clone(e.Bytes()), 10*time.Second).Error(); err != nil {
		return err
	}
	c.recoveryDone = true
	c.leader.Store(true)
	s.log.Info("cluster: leader", "node", c.cfg.NodeID, "term_time", time.Duration(base))
	s.kickClock()
	return nil
}

func (c *cluster) advertise() string {
	if c.cfg.Advertise != "" {
		return c.cfg.Advertise
	}
	if a := c.s.listenAddr.Load(); a != nil {
		return *a
	}
	return c.s.cfg.Addr
}

// loseLeadership: every client connection gets GOAWAY with the new leader's address (when
// known) and is closed; clients resume their sessions on the new leader.
func (c *cluster) loseLeadership(reason uint32) {
	s := c.s
	c.leader.Store(false)
	c.prop.wake() // readers waiting for room in the proposer: their commands are dropped now
	hint := c.leaderHint()
	if reason == wire.GoawayLeadership {
		// Deposed (a transfer, or a frozen leader that woke): the new leader is usually known
		// within a heartbeat or two. Waiting for it briefly gives clients the hint, so they go
		// straight there instead of trying every endpoint. Nothing is served meanwhile: the
		// node is not the leader.
		hint = c.awaitLeaderHint(time.Second)
	}
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, cn := range s.conns {
		if cn.hs != nil && !cn.hs.welcomed {
			if !cn.hs.ended {
				cn.hs.ended = true
				close(cn.hs.done) // its handshake answers WELCOME NOT_LEADER
			}
			continue
		}
		conns = append(conns, cn)
		cn.push(&wire.Response{Op: wire.OpGoaway, Detail: reason, Data: []byte(hint)}, false)
		cn.detached = true
		delete(s.conns, cn.id)
		s.attached.Add(-1)
	}
	s.mu.Unlock()
	for _, cn := range conns {
		cn.tryFlush()
		cn.stopReading(time.Now(), time.Now().Add(time.Second))
	}
	s.log.Info("cluster: not the leader any more", "leader", hint)
}

// awaitLeaderHint polls leaderHint for up to d (the node stopping ends it early).
func (c *cluster) awaitLeaderHint(d time.Duration) string {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	until := time.Now().Add(d)
	for {
		if h := c.leaderHint(); h != "" || !time.Now().Before(until) {
			return h
		}
		select {
		case <-t.C:
		case <-c.s.done:
			return ""
		}
	}
}

// leaderHint is the current leader's client address, or "" when unknown.
func (c *cluster) leaderHint() string {
	_, id := c.raft.LeaderWithID()
	if id == "" || string(id) == c.cfg.NodeID && !c.leader.Load() {
		return ""
	}
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.table.NodeAddr(string(id))
}

// ready reports whether this node serves clients (it is the leader and has committed its
// first entry).
func (c *cluster) ready() bool { return c.leader.Load() && c.raft.State() == raft.Leader }

// propose submits the queued entries in order, each when a slot is free.
func (c *cluster) propose() {
	defer c.s.wg.Done()
	p := &c.prop
	defer func() { // readers waiting for room wait no more
		p.mu.Lock()
		p.stop = true
		p.room.Broadcast()
		p.mu.Unlock()
	}()
	for {
		select {
		case <-p.kick:
		case <-c.s.done:
			return
		}
		select {
		case p.slots <- struct{}{}:
		case <-c.s.done:
			return
		}
		p.mu.Lock()
		if !c.leader.Load() {
			p.drop() // commands of connections the node no longer serves: dropped (their clients resume elsewhere)
			p.mu.Unlock()
			<-p.slots
			continue
		}
		entry := p.next()
		more := len(p.closed) > 0 || p.n > 0
		p.mu.Unlock()
		if entry == nil {
			<-p.slots
			continue
		}
		if more {
			p.poke() // the next one goes as soon as a slot is free
		}
		locktable.SetTime(entry, c.stamp())
		f := c.raft.Apply(entry, 10*time.Second)
		go func() {
			if err := f.Error(); err != nil {
				c.s.log.Debug("cluster: proposal failed", "err", err)
			}
			<-p.slots
			select { // more may have accumulated meanwhile
			case p.kick <- struct{}{}:
			default:
			}
		}()
	}
}

// proposeAttach proposes ATTACH for connection cid of session sid; the route step writes WELCOME
// when it is applied.
func (c *cluster) proposeAttach(sid *[wire.SessionIDSize]byte, cid uint64) {
	c.prop.begin()
	c.prop.enc.Attach(sid, cid, uint32(c.s.cfg.SessionGrace/time.Millisecond))
	c.prop.end()
}

func (c *cluster) close() {
	if c.raft != nil {
		c.raft.Shutdown().Error()
	}
	if c.trans != nil {
		c.trans.Close()
	}
	if c.layer != nil {
		c.layer.Close()
	}
	for _, x := range c.closer {
		x.Close()
	}
}

// fsm is the lock table as hashicorp/raft's (batching) state machine.
type fsm cluster

var _ raft.BatchingFSM = (*fsm)(nil)

// ApplyBatch applies committed entries in order under Server.mu and routes their outputs to this
// node's connections (only the leader has any). An entry that cannot be applied stops the
// replica (applyFailed).
func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	s := f.s
	var touched []*conn
	s.mu.Lock()
	for _, l := range logs {
		if l.Type != raft.LogCommand || f.halted.Load() {
			continue
		}
		var err error
		s.reqs, err = s.table.Apply(l.Data, s.reqs)
		if err != nil {
			s.table.ClearOuts() // a partly applied entry answers nobody
			(*cluster)(f).applyFailed(l.Index, err)
			continue
		}
		s.settle(nil)
		if now := s.table.Now(); now != f.appliedNow {
			f.appliedNow, f.appliedAt = now, time.Now()
		}
		if testHashEvery > 0 && l.Index%testHashEvery == 0 {
			h := s.table.StateHash()
			s.log.Info("state hash", "index", l.Index, "hash", hex.EncodeToString(h[:8]))
		}
	}
	touched = s.takeTouched(touched)
	s.mu.Unlock()
	deliver(touched)
	return make([]interface{}, len(logs))
}

// testHashEvery (TICKETING_TEST_STATE_HASH_EVERY, tests only): after applying an entry whose
// index is a multiple of it, a node logs the state hash, so that a test can compare the
// replicas at the same index while they run (a replica that diverged and converged again before
// the end is otherwise invisible).
var testHashEvery = func() uint64 {
	v, _ := strconv.ParseUint(os.Getenv("TICKETING_TEST_STATE_HASH_EVERY"), 10, 64)
	return v
}()

// exitProcess ends the process (applyFailed); tests replace it.
var exitProcess = os.Exit

// applyFailed stops this replica for good: the committed entry at index could not be applied (a
// command type this version does not know — a newer leader during a rolling upgrade — or a
// malformed entry). Table.Apply has applied the commands before the failing one and not the
// rest, so this node's table is no longer the one the other replicas have, and nothing it
// would do from here on (serve clients, lead, apply more entries on top) can be trusted. Raft's
// state machine cannot refuse an entry, and carrying on diverges silently, so the node stops:
// one error line saying why, then the process exits with code 70 (as for a stalled disk). A
// supervisor restarts it, and it stops again at the same entry until it runs a binary that can
// apply it; the other nodes keep the cluster going. exitProcess returns only in tests: the node
// then stays halted (it applies nothing more, never leads, and serves no client).
// Server.mu is held.
func (c *cluster) applyFailed(index uint64, err error) {
	c.halted.Store(true)
	c.leader.Store(false) // stop serving at once; watchLeadership sends the clients away
	c.s.log.Error("cluster: a committed log entry cannot be applied; stopping this node (exit 70) so that it does not diverge from the other replicas: run a version that can apply it (upgrade this node) and restart it",
		"index", index, "err", err)
	c.s.flushLog()
	exitProcess(70)
}

// flushLog gives the log writer up to a second to write what is queued (Config.LogFlush), before
// the process exits.
func (s *Server) flushLog() {
	if f := s.cfg.LogFlush; f != nil {
		f(time.Second)
	}
}

// Apply is ApplyBatch for one entry.
func (f *fsm) Apply(l *raft.Log) interface{} { return f.ApplyBatch([]*raft.Log{l})[0] }

// Snapshot captures the table (the bytes are produced here; Persist only writes them).
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	return &fsmSnapshot{b: f.s.table.Snapshot(), last: f.s.table.LastToken(), s: f.s}, nil
}

// Restore replaces the table with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	t, err := locktable.Restore(f.s.tableConfig(), b)
	if err != nil {
		return err
	}
	f.s.mu.Lock()
	t.SetObserver(f.s.obs)
	f.s.table = t
	f.appliedNow, f.appliedAt = t.Now(), time.Now()
	f.s.mu.Unlock()
	return nil
}

// fsmSnapshot is a snapshot's bytes and the last token applied when it was taken, which Persist
// also records in the data directory's store: a lower bound of the cluster's tokens, for the
// message that refuses to reuse the directory as something else (New, startCluster).
type fsmSnapshot struct {
	b    []byte
	last uint64
	s    *Server
}

func (f *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(f.b); err != nil {
		sink.Cancel()
		return err
	}
	if err := sink.Close(); err != nil {
		return err
	}
	if _, err := f.s.store.Persist(f.last, 0, false); err != nil {
		f.s.log.Warn("cluster: could not record the last token in the data directory's state file", "err", err)
	}
	return nil
}

func (*fsmSnapshot) Release() {}
