// Package settings is the server's settings table: every option of `ticketing server` as a
// flag (--max-lease) and an environment variable (TICKETING_MAX_LEASE), with its default, and
// the parse of flags, environment and defaults into a validated server.Config (with its
// ClusterConfig and Faults).
//
// cmd/ticketing parses the server's settings with it (and reloads the token file and TLS key
// pair on SIGHUP); internal/deploy writes only settings named in Table and checks what it
// generates with Parse; the docs test keeps docs/operations.md equal to Table.
package settings

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ticketing/ticketing/internal/server"
)

// Setting is one server option: flag --Name, environment variable EnvName(Name). A flag wins
// over the variable, the variable over the default.
type Setting struct {
	Name    string // the flag's name, without dashes: "max-lease"
	Help    string
	Default string // the default as the setting writes it ("30s", "auto", "on")
	set     func(string) error
	isBool  bool // the flag may stand alone (--join), as Go's boolean flags do
}

func durationSetting(name, help string, p *time.Duration) Setting {
	return Setting{name, help, p.String(), func(v string) (err error) {
		d, err := time.ParseDuration(v)
		if err != nil && v == "0" {
			d, err = 0, nil
		}
		*p = d
		return err
	}, false}
}

func intSetting(name, help string, p *int) Setting {
	return Setting{name, help, strconv.Itoa(*p), func(v string) (err error) { *p, err = strconv.Atoi(v); return }, false}
}

func uintSetting(name, help string, p *uint64) Setting {
	return Setting{name, help, strconv.FormatUint(*p, 10), func(v string) (err error) { *p, err = strconv.ParseUint(v, 10, 64); return }, false}
}

func boolSetting(name, help string, p *bool) Setting {
	return Setting{Name: name, Help: help, Default: strconv.FormatBool(*p), isBool: true,
		set: func(v string) (err error) { *p, err = strconv.ParseBool(v); return }}
}

func floatSetting(name, help string, p *float64) Setting {
	return Setting{name, help, strconv.FormatFloat(*p, 'g', -1, 64), func(v string) (err error) { *p, err = strconv.ParseFloat(v, 64); return }, false}
}

func stringSetting(name, help string, p *string) Setting {
	return Setting{name, help, *p, func(v string) error { *p = v; return nil }, false}
}

// metricsSetting is TICKETING_METRICS: on (default) or off. Off turns off the lock-event
// metrics and the contention sketch (their cost on the request path is measured by
// BenchmarkRequestPathMetrics); /metrics keeps the series read when scraped.
func metricsSetting(off *bool) Setting {
	def := "on"
	if *off {
		def = "off"
	}
	return Setting{"metrics", "lock-event metrics and the contention sketch on the admin listener: on or off", def, func(v string) error {
		switch v {
		case "on", "true", "1":
			*off = false
		case "off", "false", "0":
			*off = true
		default:
			return fmt.Errorf("want on or off")
		}
		return nil
	}, false}
}

// EnvName is the environment variable of the setting with flag name flagName:
// TICKETING_ and the name in uppercase, dashes as underscores (max-lease: TICKETING_MAX_LEASE).
func EnvName(flagName string) string {
	return "TICKETING_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Server is the server's settings: the server.Config that Parse fills, and what the binary
// itself uses (the logger's settings, whether metrics are on).
type Server struct {
	Config     server.Config
	LogLevel   string // TICKETING_LOG_LEVEL: debug, info, warn or error
	LogFormat  string // TICKETING_LOG_FORMAT: text or json
	MetricsOff bool   // TICKETING_METRICS=off

	cluster                server.ClusterConfig
	peers, secretFile      string
	raftCert, raftKey      string
	raftCA                 string
	minLeaseSet            bool
	adminCert, adminKey    string
	adminTokenFile         string
	token, tokenFile       string
	tlsCert, tlsKey, tlsCA string
	startupGrace           string
}

func (o *Server) list() []Setting {
	c := &o.Config
	return []Setting{
		stringSetting("addr", "listen address (host:port); port 0 picks a free one", &c.Addr),
		stringSetting("data-dir", "directory for the durable state: fencing-token high-water mark and restart horizon", &c.DataDir),
		stringSetting("token-file", "file holding the shared auth token (a second line: the previous token, still accepted during a rotation; reloaded on SIGHUP)", &o.tokenFile),
		stringSetting("tls-cert", "PEM certificate chain: enables TLS (with --tls-key; reloaded on SIGHUP)", &o.tlsCert),
		stringSetting("tls-key", "PEM private key for --tls-cert", &o.tlsKey),
		stringSetting("tls-client-ca", "PEM CA bundle: require client certificates signed by it", &o.tlsCA),
		intSetting("max-key-len", "longest key in bytes (<= 65535)", &c.MaxKeyLen),
		durationSetting("min-lease", "shortest lease accepted", &c.MinLease),
		durationSetting("max-lease", "longest lease accepted", &c.MaxLease),
		intSetting("max-connections", "connections past their handshake", &c.MaxConnections),
		intSetting("max-handshakes", "connections still in their handshake (the oldest is closed beyond it)", &c.MaxHandshakes),
		intSetting("max-sessions", "client sessions, attached or in their grace", &c.MaxSessions),
		intSetting("max-waiters-per-key", "queued acquires on one key", &c.MaxWaitersPerKey),
		intSetting("max-waiters", "queued acquires in total", &c.MaxWaiters),
		intSetting("max-locks", "distinct keys held, waited on or in lock-delay", &c.MaxLocks),
		intSetting("max-inflight", "queued acquires per session", &c.MaxInflight),
		intSetting("max-outcomes", "stored outcomes per session (for retries; pruned by ACK)", &c.MaxOutcomes),
		durationSetting("handshake-timeout", "time allowed for the handshake", &c.HandshakeTimeout),
		durationSetting("write-timeout", "a write blocked longer closes the connection", &c.WriteTimeout),
		intSetting("max-output", "bytes queued for a client that does not read before it is closed", &c.MaxOutput),
		durationSetting("session-grace", "how long a session outlives its connection (resume window; 0: no resume)", &c.SessionGrace),
		durationSetting("dead-peer-timeout", "drop a peer that stops answering TCP within about this", &c.DeadPeerTimeout),
		durationSetting("lock-delay", "keep a key unavailable this long after a lease expiry (0: off)", &c.LockDelay),
		stringSetting("startup-grace", "after a restart grant nothing an earlier holder could still hold: auto (from the recorded horizon), a duration (auto with a floor), or 0 (off)", &o.startupGrace),
		durationSetting("shutdown-timeout", "bound on graceful shutdown", &c.ShutdownTimeout),
		uintSetting("token-block", "fencing tokens reserved per durable write", &c.TokenBlock),
		uintSetting("min-token", "tokens start above this (recovery floor for a lost data directory)", &c.MinToken),
		stringSetting("node-id", "cluster: this node's name (empty: a single node)", &o.cluster.NodeID),
		stringSetting("peers", "cluster: every member as id=raft-host:port, comma-separated, this node included", &o.peers),
		stringSetting("raft-addr", "cluster: where this node listens for its peers (default: its entry in --peers)", &o.cluster.RaftAddr),
		stringSetting("advertise", "cluster: the client address other nodes give as leader hint (default: the listen address)", &o.cluster.Advertise),
		stringSetting("cluster-secret-file", "cluster: file holding the node-to-node secret (or TICKETING_CLUSTER_SECRET)", &o.secretFile),
		floatSetting("raft-timing", "cluster: multiplier over the base timing (heartbeat = election timeout = 500ms)", &o.cluster.Timing),
		stringSetting("raft-store", "cluster: raft log store, wal or bolt", &o.cluster.LogStore),
		uintSetting("raft-snapshot-threshold", "cluster: take a snapshot of the lock table once this many log entries were applied since the last", &o.cluster.SnapshotThreshold),
		durationSetting("raft-snapshot-interval", "cluster: how often (this to twice this) a node checks whether a snapshot is due", &o.cluster.SnapshotInterval),
		uintSetting("raft-trailing-logs", "cluster: log entries kept after a snapshot, for followers that lag (beyond: they get the snapshot)", &o.cluster.TrailingLogs),
		intSetting("raft-max-pending", "cluster: bytes of client requests the leader holds before Raft takes them; beyond it it stops reading from clients (backpressure)", &c.RaftMaxPending),
		boolSetting("raft-recover", "cluster: forced recovery after losing a majority for good: replace this node's Raft configuration with --peers (new state id; no grants for the max lease)", &o.cluster.Recover),
		boolSetting("join", "cluster: join an existing cluster (an operator adds the node with: ticketing cluster add) instead of bootstrapping one", &o.cluster.Join),
		stringSetting("raft-tls-cert", "cluster: PEM certificate for node-to-node TLS (with --raft-tls-key and --raft-tls-ca)", &o.raftCert),
		stringSetting("raft-tls-key", "cluster: PEM key for --raft-tls-cert", &o.raftKey),
		stringSetting("raft-tls-ca", "cluster: PEM CA that signs every node's certificate", &o.raftCA),
		stringSetting("admin-addr", "admin listener (health, readiness, cluster membership, metrics): host:port, empty for the client port + 1, or off", &c.AdminAddr),
		intSetting("admin-max-connections", "open connections to the admin listener (one beyond it gets 503 and is closed)", &c.AdminMaxConnections),
		stringSetting("admin-token-file", "file holding the admin bearer credential (or TICKETING_ADMIN_TOKEN); required off loopback", &o.adminTokenFile),
		stringSetting("admin-tls-cert", "PEM certificate for the admin listener (required off loopback)", &o.adminCert),
		stringSetting("admin-tls-key", "PEM key for --admin-tls-cert", &o.adminKey),
		stringSetting("log-level", "debug, info, warn or error", &o.LogLevel),
		stringSetting("log-format", "text or json", &o.LogFormat),
		metricsSetting(&o.MetricsOff),
	}
}

// Defaults is the settings before anything is parsed: every default, as the settings table
// (docs/operations.md, the deploy generator) shows them.
func Defaults() *Server {
	o := &Server{Config: server.Default(), LogLevel: "info", LogFormat: "text", startupGrace: "auto"}
	o.cluster.Timing, o.cluster.LogStore = 1, "wal"
	o.cluster.SnapshotThreshold, o.cluster.SnapshotInterval, o.cluster.TrailingLogs = server.DefaultSnapshotThreshold, server.DefaultSnapshotInterval, server.DefaultTrailingLogs
	return o
}

// Table is the settings table in its order (the order of `ticketing server --help`, of
// docs/operations.md and of the generated launch commands), with the defaults.
func Table() []Setting {
	return Defaults().list()
}
