package server

import (
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
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
	// Stores: the Raft storage and transport to run on; nil (a real node) opens its own in the
	// data directory and listens on RaftAddr (see ClusterStores).
	Stores *ClusterStores
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
	trans  raft.Transport
	conns  interface{ CloseConns() } // the transport's connections (raftnet); nil when injected
	dialer interface {               // raftnet: dials a peer and proves the secret; nil when injected
		Dial(raft.ServerAddress, time.Duration) (net.Conn, error)
	}
	closer []io.Closer

	leader atomic.Bool  // this node is the leader and has committed its first entry
	stamp0 atomic.Int64 // leader: its log time base (becomeLeader)
	mono0  time.Time    // leader: local monotonic time at the base
	monoMu sync.Mutex   // guards mono0 against stamp (stamp0 is atomic)
	// The table time this node last applied (the highest stamp so far) and when, on its own
	// monotonic clock: a new leader's log time continues from there (becomeLeader). Guarded by
	// Server.mu.
	appliedNow int64
	appliedAt  time.Time

	prop proposer
	logs *timedLogStore

	recovered    bool // this node ran a forced recovery at start; its first lead makes a new state
	recoveryDone bool

	halted atomic.Bool // a committed entry could not be applied: see applyFailed
}

// startCluster opens the Raft node. Called by New when cfg.Cluster is set.
func (s *Server) startCluster() error {
	cc := s.cfg.Cluster
	c := &cluster{s: s, cfg: cc}
	c.prop.notify = make(chan struct{}, 1)
	c.prop.slots = make(chan struct{}, maxInflight)
	c.prop.limit = s.cfg.RaftMaxPending
	c.prop.room.L = &c.prop.mu
	c.prop.leader = &c.leader
	var b [8]byte
	rand.Read(b[:])
	// Connection ids unique across the cluster's nodes and restarts: a random base per process.
	s.connBase = uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32
	s.cluster = c
	s.sm = c

	dir := filepath.Join(s.cfg.DataDir, "raft")
	local := s.store.State()
	if local.Cluster && !cc.Join && s.cfg.MinToken == 0 && cc.Stores == nil && !hasFiles(dir) {
		// The directory served a cluster node whose Raft state is gone: a new cluster seeded
		// from it would hand out tokens the old cluster already issued, at once.
		return fmt.Errorf("data directory %s served a cluster node, but its Raft state (%s) is gone: a new cluster started from it would issue tokens the old cluster already issued and grant keys its holders may still hold; "+
			"to start a new cluster, start every node with TICKETING_MIN_TOKEN above the old cluster's last token (at least %d, the last this node recorded; the old leader's ticketing_last_token metric shows it): the first leader then waits the maximum lease before its first grant; "+
			"to bring this node back into its cluster, join it (TICKETING_JOIN) and add it from the leader", s.cfg.DataDir, dir, local.TokenLimit)
	}
	hl := raftLogger(s.log)
	st := cc.Stores
	if st == nil {
		var err error
		if st, err = c.openStores(dir, hl); err != nil {
			return err
		}
	}
	timed := &timedLogStore{LogStore: st.Logs, stall: s.cfg.Faults.StallLog}
	logs, stable, snaps := raft.LogStore(timed), st.Stable, st.Snapshots
	c.logs = timed
	c.trans = st.Transport

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

// stamp is the leader's log time now: its base (becomeLeader: the last stamp applied, plus the
// time since this node applied it) plus its own monotonic time since (never a raw clock
// reading: each node's clock has its own origin).
func (c *cluster) stamp() int64 {
	c.monoMu.Lock()
	defer c.monoMu.Unlock()
	el := time.Since(c.mono0)
	if r := c.s.cfg.Faults.clockRate(); r != 1 {
		el = time.Duration(float64(el) * r)
	}
	return c.stamp0.Load() + int64(el)
}
