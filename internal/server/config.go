package server

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// Config is the server's configuration. The zero value is not valid; start from Default().
// internal/settings maps each field to a TICKETING_* environment variable and a flag of the same
// name (docs/operations.md lists them all).
type Config struct {
	Addr    string // listen address; default 127.0.0.1:7070 (loopback only)
	DataDir string // durable state (token high-water mark, restart horizon); default DefaultDataDir()
	// Tokens: the shared auth tokens; empty = no auth. The first is the current one; a second one
	// is also accepted (a rotation window: roll clients to the first, then drop the second).
	Tokens []string
	TLS    *tls.Config // nil = plain TCP

	MaxKeyLen        int           // default 256 bytes (<= 65535)
	MinLease         time.Duration // default 1ms
	MaxLease         time.Duration // default 1h (<= 2^32-2 ms)
	MaxConnections   int           // connections past their handshake; default 10,000
	MaxHandshakes    int           // connections still in their handshake; the oldest is closed beyond it; default 1,024
	MaxSessions      int           // sessions attached or in their grace; default 20,000
	MaxWaitersPerKey int           // default 10,000
	MaxWaiters       int           // default 1,000,000 in total
	MaxLocks         int           // distinct keys; default 1,000,000
	MaxInflight      int           // queued acquires per session; default 4,096
	MaxOutcomes      int           // stored outcomes per session; default 4,096
	HandshakeTimeout time.Duration // default 5s
	WriteTimeout     time.Duration // a write that blocks longer closes the connection; default 10s
	MaxOutput        int           // bytes queued for a client that is not reading; default 4 MiB
	SessionGrace     time.Duration // a session outlives its connection this long; 0 = no resume; default 5s
	DeadPeerTimeout  time.Duration // a peer that stops answering TCP is dropped within about this; default 5s
	LockDelay        time.Duration // key unavailable after a lease expiry; default 0 (off)
	// StartupAuto: at start, grant nothing until every lease an earlier run of this data
	// directory could have granted has ended (computed from the recorded horizon). Default on.
	StartupAuto bool
	// StartupGrace: a floor on the start-up wait (with StartupAuto) or a fixed wait (without).
	StartupGrace    time.Duration
	ShutdownTimeout time.Duration // graceful shutdown bound; default 10s
	TokenBlock      uint64        // tokens reserved per durable write; default 1<<20
	MinToken        uint64        // tokens start above this (recovery floor for a lost store); default 0
	// RaftMaxPending (cluster): bytes of client requests the leader holds before handing them
	// to Raft; beyond it connection readers stop reading until Raft takes them. Default 4 MiB.
	RaftMaxPending int

	// Cluster makes this node a member of a Raft cluster; nil = a single node.
	Cluster *ClusterConfig

	// Admin listener (admin.go): health, readiness, cluster membership, metrics, inspection.
	// AdminAddr "" = the client address's host with the next port (port 0 stays 0); "off" = none.
	AdminAddr  string
	AdminToken string      // bearer credential, required off loopback
	AdminTLS   *tls.Config // required off loopback
	// AdminMaxConnections bounds the admin listener's open connections (one beyond it gets 503
	// and is closed); default 64.
	AdminMaxConnections int

	// LogFlush, if set, is called with a bound before the server ends the process itself (exit
	// 70: a stalled log store while leading, an entry it cannot apply), so that the line saying
	// why is written: the server's log writer never blocks, it queues.
	LogFlush func(time.Duration) bool

	// Faults are fault-injection hooks for the crash and cluster tests; zero in production.
	Faults Faults
}

// Faults are the failpoints the crash and cluster tests drive a server process with (its
// command sets them from TICKETING_FAILPOINT_FILE, TICKETING_FAILPOINT_STALL_FILE,
// TICKETING_TEST_CLOCK_RATE and TICKETING_TEST_STATE_HASH_EVERY, which operators never set; they
// are not in the settings table). A test in this package sets them in its Config.
type Faults struct {
	// CrashBeforeGrantReply: the first node about to write a grant's answer (committed and
	// applied) while this file exists removes it and kills itself with SIGKILL: one crash per
	// file, across a cluster.
	CrashBeforeGrantReply string
	// StallLog: while this file exists, writes to the Raft log block (a stalled disk).
	StallLog string
	// ClockRate makes a cluster node's clock run fast (> 1) or slow (< 1); 0 is 1. PROTOCOL.md
	// bounds each clock's rate error by CLOCK_RATE_BOUND_PPM; within that bound a lease never
	// ends before its holder's local deadline.
	ClockRate float64
	// StateHashEvery: after applying an entry whose index is a multiple of it, a cluster node
	// logs the state hash, so that a test can compare the replicas at the same index while they
	// run (a replica that diverged and converged again before the end is otherwise invisible).
	StateHashEvery uint64
}

// clockRate is ClockRate with its default.
func (f *Faults) clockRate() float64 {
	if f.ClockRate > 0 {
		return f.ClockRate
	}
	return 1
}

// AdminListenAddr resolves AdminAddr ("" derives it from Addr); "" when off.
func (c *Config) AdminListenAddr() string {
	switch c.AdminAddr {
	case "off":
		return ""
	case "":
		host, port, err := net.SplitHostPort(c.Addr)
		if err != nil {
			return ""
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return ""
		}
		if p != 0 {
			p++
		}
		return net.JoinHostPort(host, strconv.Itoa(p))
	}
	return c.AdminAddr
}

// Default returns the defaults: a working single node on loopback with no configuration.
func Default() Config {
	return Config{
		Addr:             "127.0.0.1:7070",
		DataDir:          DefaultDataDir(),
		MaxKeyLen:        256,
		MinLease:         time.Millisecond,
		MaxLease:         time.Hour,
		MaxConnections:   10_000,
		MaxHandshakes:    1024,
		MaxSessions:      20_000,
		MaxWaitersPerKey: 10_000,
		MaxWaiters:       1_000_000,
		MaxLocks:         1_000_000,
		MaxInflight:      4096,
		MaxOutcomes:      4096,
		HandshakeTimeout: 5 * time.Second,
		WriteTimeout:     10 * time.Second,
		MaxOutput:        4 << 20,
		SessionGrace:     5 * time.Second,
		DeadPeerTimeout:  5 * time.Second,
		StartupAuto:      true,
		ShutdownTimeout:  10 * time.Second,
		TokenBlock:       1 << 20,
		RaftMaxPending:   4 << 20,

		AdminMaxConnections: 64,
	}
}

// DefaultDataDir is the absolute default data directory: $XDG_STATE_HOME/ticketing when that
// is set, else /var/lib/ticketing for root and ~/.local/state/ticketing for other users. Never
// relative: starting from another working directory must not start from an empty store.
func DefaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "ticketing")
	}
	if os.Geteuid() == 0 {
		return "/var/lib/ticketing"
	}
	if h, err := os.UserHomeDir(); err == nil && filepath.IsAbs(h) {
		return filepath.Join(h, ".local", "state", "ticketing")
	}
	return "/var/lib/ticketing"
}

// maxLeaseLimit is the longest lease the protocol can carry.
const maxLeaseLimit = time.Duration(wire.WaitForever-1) * time.Millisecond

// Validate reports the first setting that is out of range, naming it.
func (c *Config) Validate() error {
	positive := []struct {
		name string
		v    int
	}{
		{"TICKETING_MAX_CONNECTIONS", c.MaxConnections}, {"TICKETING_MAX_HANDSHAKES", c.MaxHandshakes},
		{"TICKETING_MAX_SESSIONS", c.MaxSessions}, {"TICKETING_MAX_WAITERS_PER_KEY", c.MaxWaitersPerKey},
		{"TICKETING_MAX_WAITERS", c.MaxWaiters}, {"TICKETING_MAX_LOCKS", c.MaxLocks},
		{"TICKETING_MAX_INFLIGHT", c.MaxInflight}, {"TICKETING_MAX_OUTCOMES", c.MaxOutcomes},
		{"TICKETING_ADMIN_MAX_CONNECTIONS", c.AdminMaxConnections},
	}
	for _, p := range positive {
		if p.v < 1 {
			return fmt.Errorf("%s %d: must be at least 1", p.name, p.v)
		}
	}
	timeouts := []struct {
		name string
		v    time.Duration
	}{
		{"TICKETING_HANDSHAKE_TIMEOUT", c.HandshakeTimeout}, {"TICKETING_WRITE_TIMEOUT", c.WriteTimeout},
		{"TICKETING_SHUTDOWN_TIMEOUT", c.ShutdownTimeout}, {"TICKETING_DEAD_PEER_TIMEOUT", c.DeadPeerTimeout},
	}
	for _, p := range timeouts {
		if p.v <= 0 {
			return fmt.Errorf("%s %v: must be positive", p.name, p.v)
		}
	}
	if err := checkListenAddr(c.Addr); err != nil {
		return fmt.Errorf("TICKETING_ADDR %q: %v", c.Addr, err)
	}
	if c.AdminAddr != "" && c.AdminAddr != "off" {
		if err := checkListenAddr(c.AdminAddr); err != nil {
			return fmt.Errorf("TICKETING_ADMIN_ADDR %q: %v (or \"off\")", c.AdminAddr, err)
		}
	}
	switch {
	case c.DataDir == "":
		return fmt.Errorf("TICKETING_DATA_DIR is empty")
	case c.MaxKeyLen < 1 || c.MaxKeyLen > wire.MaxKeyLen:
		return fmt.Errorf("TICKETING_MAX_KEY_LEN %d outside 1..%d", c.MaxKeyLen, wire.MaxKeyLen)
	case c.MinLease < time.Millisecond:
		return fmt.Errorf("TICKETING_MIN_LEASE %v below 1ms", c.MinLease)
	case c.MaxLease < c.MinLease || c.MaxLease > maxLeaseLimit:
		return fmt.Errorf("TICKETING_MAX_LEASE %v outside TICKETING_MIN_LEASE (%v)..%v", c.MaxLease, c.MinLease, maxLeaseLimit)
	case c.MaxOutput < 64<<10:
		return fmt.Errorf("TICKETING_MAX_OUTPUT %d below 64 KiB", c.MaxOutput)
	case c.LockDelay < 0:
		return fmt.Errorf("TICKETING_LOCK_DELAY %v is negative", c.LockDelay)
	case c.SessionGrace < 0 || c.SessionGrace > 10*time.Minute:
		return fmt.Errorf("TICKETING_SESSION_GRACE %v outside 0..10m", c.SessionGrace)
	case c.StartupGrace < 0 || c.StartupGrace > c.MaxLease:
		return fmt.Errorf("TICKETING_STARTUP_GRACE %v outside 0..TICKETING_MAX_LEASE (%v)", c.StartupGrace, c.MaxLease)
	case c.RaftMaxPending < 64<<10:
		return fmt.Errorf("TICKETING_RAFT_MAX_PENDING %d below 64 KiB", c.RaftMaxPending)
	case c.TokenBlock < 2:
		return fmt.Errorf("TICKETING_TOKEN_BLOCK %d below 2", c.TokenBlock)
	case len(c.Tokens) > 2:
		return fmt.Errorf("TICKETING_TOKEN_FILE holds %d tokens: at most two (the current one, then the previous one during a rotation)", len(c.Tokens))
	}
	if cc := c.Cluster; cc != nil {
		switch {
		case cc.NodeID == "":
			return fmt.Errorf("TICKETING_NODE_ID is empty")
		case len(cc.Peers) == 0 || cc.Peers[cc.NodeID] == "":
			return fmt.Errorf("TICKETING_PEERS must list every member as id=raft-address, this node (%s) included", cc.NodeID)
		case len(cc.Secret) == 0:
			return fmt.Errorf("TICKETING_CLUSTER_SECRET (or _FILE) is required in a cluster: node-to-node traffic is authenticated with it")
		case c.MinLease < cc.FailoverBound():
			return fmt.Errorf("TICKETING_MIN_LEASE %v is shorter than what a failover can cost (%v at TICKETING_RAFT_TIMING %v): raise it", c.MinLease, cc.FailoverBound(), cc.timing())
		}
	}
	for _, t := range c.Tokens {
		if t == "" {
			return fmt.Errorf("TICKETING_TOKEN: empty token")
		}
	}
	return nil
}

// checkListenAddr reports what is wrong with a listen address (host:port, port 0..65535; the
// host may be empty for every interface): a bad setting exits 2 at start, not 1 at listen.
func checkListenAddr(a string) error {
	if a == "" {
		return fmt.Errorf("empty")
	}
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("not host:port")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}
