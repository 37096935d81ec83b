package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ticketing/ticketing/internal/server"
)

// setting is one server option: flag --name, environment variable TICKETING_NAME (uppercase,
// dashes as underscores). A flag wins over the variable, the variable over the default.
type setting struct {
	name string
	help string
	set  func(string) error
	def  string
}

func durationSetting(name, help string, p *time.Duration) setting {
	return setting{name, help, func(v string) (err error) {
		d, err := time.ParseDuration(v)
		if err != nil && v == "0" {
			d, err = 0, nil
		}
		*p = d
		return err
	}, p.String()}
}

func intSetting(name, help string, p *int) setting {
	return setting{name, help, func(v string) (err error) { *p, err = strconv.Atoi(v); return }, strconv.Itoa(*p)}
}

func uintSetting(name, help string, p *uint64) setting {
	return setting{name, help, func(v string) (err error) { *p, err = strconv.ParseUint(v, 10, 64); return }, strconv.FormatUint(*p, 10)}
}

func boolSetting(name, help string, p *bool) setting {
	return setting{name, help, func(v string) (err error) { *p, err = strconv.ParseBool(v); return }, strconv.FormatBool(*p)}
}

func floatSetting(name, help string, p *float64) setting {
	return setting{name, help, func(v string) (err error) { *p, err = strconv.ParseFloat(v, 64); return }, strconv.FormatFloat(*p, 'g', -1, 64)}
}

func stringSetting(name, help string, p *string) setting {
	return setting{name, help, func(v string) error { *p = v; return nil }, *p}
}

func envName(flagName string) string {
	return "TICKETING_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

type serverSettings struct {
	cfg                    server.Config
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
	logLevel, logFormat    string
	metricsOff             bool // TICKETING_METRICS=off (deploy_settings.go)
}

func (o *serverSettings) list() []setting {
	c := &o.cfg
	return []setting{
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
		stringSetting("log-level", "debug, info, warn or error", &o.logLevel),
		stringSetting("log-format", "text or json", &o.logFormat),
		metricsSetting(&o.metricsOff),
	}
}

// newServerSettings is the settings before anything is parsed: every default, as the settings
// table (docs/operations.md, the deploy generator) shows them.
func newServerSettings() *serverSettings {
	o := &serverSettings{cfg: server.Default(), logLevel: "info", logFormat: "text", startupGrace: "auto"}
	o.cluster.Timing, o.cluster.LogStore = 1, "wal"
	o.cluster.SnapshotThreshold, o.cluster.SnapshotInterval, o.cluster.TrailingLogs = server.DefaultSnapshotThreshold, server.DefaultSnapshotInterval, server.DefaultTrailingLogs
	return o
}

// parseServerSettings reads defaults, then TICKETING_* variables, then flags. The auth token is
// read from TICKETING_TOKEN or TICKETING_TOKEN_FILE only: a flag would show it in ps.
func parseServerSettings(args []string, getenv func(string) string) (*serverSettings, error) {
	o := newServerSettings()
	fs := flag.NewFlagSet("ticketing server", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ticketing server [--flag value ...]\n\nEvery flag is also an environment variable (--max-lease = TICKETING_MAX_LEASE).\nThe auth token comes from TICKETING_TOKEN or TICKETING_TOKEN_FILE, never from a flag.")
		fs.PrintDefaults()
	}
	for _, st := range o.list() {
		if st.name == "min-lease" {
			inner := st.set
			st.set = func(v string) error { o.minLeaseSet = true; return inner(v) }
		}
		if v := getenv(envName(st.name)); v != "" {
			if err := st.set(v); err != nil {
				return nil, fmt.Errorf("%s=%q: %w", envName(st.name), v, err)
			}
		}
		fs.Func(st.name, st.help+" (env "+envName(st.name)+", default "+strconv.Quote(st.def)+")", st.set)
	}
	fs.Func("token", "not accepted: pass the token in TICKETING_TOKEN or TICKETING_TOKEN_FILE", func(string) error {
		return errors.New("the token is not accepted on the command line (it would show in ps): set TICKETING_TOKEN or TICKETING_TOKEN_FILE")
	})
	// Errors are one line (the caller prints them); --help prints the usage to stdout.
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fs.Usage()
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o.token = getenv("TICKETING_TOKEN")
	if err := o.loadTokens(); err != nil {
		return nil, err
	}
	switch g := strings.TrimSpace(o.startupGrace); g {
	case "auto", "":
		o.cfg.StartupAuto, o.cfg.StartupGrace = true, 0
	case "0", "0s", "off":
		o.cfg.StartupAuto, o.cfg.StartupGrace = false, 0
	default:
		d, err := time.ParseDuration(g)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("TICKETING_STARTUP_GRACE=%q: want auto, 0, or a duration (a floor on auto)", g)
		}
		o.cfg.StartupAuto, o.cfg.StartupGrace = true, d
	}
	if err := o.clusterSettings(getenv); err != nil {
		return nil, err
	}
	o.cfg.Faults = faultSettings(getenv)
	o.cfg.AdminToken = getenv("TICKETING_ADMIN_TOKEN")
	if o.adminTokenFile != "" {
		b, err := os.ReadFile(o.adminTokenFile)
		if err != nil {
			return nil, fmt.Errorf("TICKETING_ADMIN_TOKEN_FILE: %w", err)
		}
		o.cfg.AdminToken = strings.TrimRight(string(b), "\r\n")
	}
	if (o.adminCert == "") != (o.adminKey == "") {
		return nil, errors.New("TICKETING_ADMIN_TLS_CERT and TICKETING_ADMIN_TLS_KEY go together")
	}
	if o.adminCert != "" {
		cert, err := tls.LoadX509KeyPair(o.adminCert, o.adminKey)
		if err != nil {
			return nil, fmt.Errorf("TICKETING_ADMIN_TLS_CERT/KEY: %w", err)
		}
		o.cfg.AdminTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return nil, errors.New("TICKETING_TLS_CERT and TICKETING_TLS_KEY go together")
	}
	if o.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("TICKETING_TLS_CERT/TICKETING_TLS_KEY: %w", err)
		}
		o.cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if o.tlsCA != "" {
			pem, err := os.ReadFile(o.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("TICKETING_TLS_CLIENT_CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, errors.New("TICKETING_TLS_CLIENT_CA: no certificate found")
			}
			o.cfg.TLS.ClientCAs = pool
			o.cfg.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		}
	} else if o.tlsCA != "" {
		return nil, errors.New("TICKETING_TLS_CLIENT_CA needs TICKETING_TLS_CERT and TICKETING_TLS_KEY")
	}
	return o, o.cfg.Validate()
}

// faultSettings reads the failpoints the crash and cluster tests start server processes with
// (server.Faults). They are not settings: not in the settings table, the docs or deploy; a
// value that does not parse leaves the failpoint off.
func faultSettings(getenv func(string) string) server.Faults {
	f := server.Faults{
		CrashBeforeGrantReply: getenv("TICKETING_FAILPOINT_FILE"),
		StallLog:              getenv("TICKETING_FAILPOINT_STALL_FILE"),
	}
	f.ClockRate, _ = strconv.ParseFloat(getenv("TICKETING_TEST_CLOCK_RATE"), 64)
	f.StateHashEvery, _ = strconv.ParseUint(getenv("TICKETING_TEST_STATE_HASH_EVERY"), 10, 64)
	return f
}

// clusterSettings fills cfg.Cluster when TICKETING_NODE_ID is set.
func (o *serverSettings) clusterSettings(getenv func(string) string) error {
	cc := &o.cluster
	if cc.NodeID == "" {
		if o.peers != "" {
			return errors.New("TICKETING_PEERS needs TICKETING_NODE_ID")
		}
		return nil
	}
	cc.Peers = map[string]string{}
	for _, p := range strings.Split(o.peers, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		id, addr, ok := strings.Cut(p, "=")
		if !ok || id == "" || addr == "" {
			return fmt.Errorf("TICKETING_PEERS entry %q: want id=host:port", p)
		}
		if _, dup := cc.Peers[id]; dup {
			return fmt.Errorf("TICKETING_PEERS names %s twice", id)
		}
		cc.Peers[id] = addr
	}
	if cc.RaftAddr == "" {
		cc.RaftAddr = cc.Peers[cc.NodeID]
	}
	secret := getenv("TICKETING_CLUSTER_SECRET")
	if o.secretFile != "" {
		b, err := os.ReadFile(o.secretFile)
		if err != nil {
			return fmt.Errorf("TICKETING_CLUSTER_SECRET_FILE: %w", err)
		}
		secret = strings.TrimRight(string(b), "\r\n")
	}
	cc.Secret = []byte(secret)
	if o.raftCert != "" || o.raftKey != "" || o.raftCA != "" {
		if o.raftCert == "" || o.raftKey == "" || o.raftCA == "" {
			return errors.New("TICKETING_RAFT_TLS_CERT, _KEY and _CA go together")
		}
		cert, err := tls.LoadX509KeyPair(o.raftCert, o.raftKey)
		if err != nil {
			return fmt.Errorf("TICKETING_RAFT_TLS_CERT/KEY: %w", err)
		}
		pem, err := os.ReadFile(o.raftCA)
		if err != nil {
			return fmt.Errorf("TICKETING_RAFT_TLS_CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return errors.New("TICKETING_RAFT_TLS_CA: no certificate found")
		}
		cc.RaftServerTLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
		cc.RaftClientTLS = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if !o.minLeaseSet {
		o.cfg.MinLease = max(o.cfg.MinLease, cc.FailoverBound())
	}
	o.cfg.Cluster = cc
	return nil
}

// loadTokens sets cfg.Tokens from TICKETING_TOKEN, or from the token file: its first non-empty
// line is the current token, a second the previous one (accepted during a rotation).
func (o *serverSettings) loadTokens() error {
	if o.tokenFile == "" {
		o.cfg.Tokens = nil
		if o.token != "" {
			o.cfg.Tokens = []string{o.token}
		}
		return nil
	}
	if o.token != "" {
		return errors.New("TICKETING_TOKEN and TICKETING_TOKEN_FILE are both set: use one")
	}
	b, err := os.ReadFile(o.tokenFile)
	if err != nil {
		return fmt.Errorf("TICKETING_TOKEN_FILE: %w", err)
	}
	var toks []string
	for _, line := range strings.Split(string(b), "\n") {
		if t := strings.TrimRight(line, "\r"); t != "" {
			toks = append(toks, t)
		}
	}
	if len(toks) == 0 {
		return fmt.Errorf("TICKETING_TOKEN_FILE %s holds no token", o.tokenFile)
	}
	if len(toks) > 2 {
		return fmt.Errorf("TICKETING_TOKEN_FILE %s holds %d tokens: at most two (current, then previous)", o.tokenFile, len(toks))
	}
	o.cfg.Tokens = toks
	return nil
}

// reload re-reads what SIGHUP reloads: the token file and the TLS key pair.
func (o *serverSettings) reload(srv *server.Server, log *slog.Logger) {
	if o.tokenFile != "" {
		if err := o.loadTokens(); err != nil {
			log.Error("SIGHUP: token file not reloaded", "err", err)
		} else {
			srv.SetTokens(o.cfg.Tokens)
			log.Info("SIGHUP: tokens reloaded", "accepted", len(o.cfg.Tokens))
		}
	}
	if o.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			log.Error("SIGHUP: TLS key pair not reloaded", "err", err)
		} else {
			srv.SetCertificate(&cert)
			log.Info("SIGHUP: TLS certificate reloaded")
		}
	}
}

// newLogger returns the server's logger, writing to out through a logWriter (never blocking
// its callers), and that writer.
func newLogger(level, format string, out io.Writer) (*slog.Logger, *logWriter, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, fmt.Errorf("TICKETING_LOG_LEVEL: %w", err)
	}
	if format != "text" && format != "json" {
		return nil, nil, fmt.Errorf("TICKETING_LOG_FORMAT %q: want text or json", format)
	}
	opts := &slog.HandlerOptions{Level: lv}
	lw := newLogWriter(out)
	var h slog.Handler = slog.NewTextHandler(lw, opts)
	if format == "json" {
		h = slog.NewJSONHandler(lw, opts)
	}
	return slog.New(h), lw, nil
}

func runServer(args []string) int {
	o, err := parseServerSettings(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ticketing server:", err)
		return 2
	}
	log, lw, err := newLogger(o.logLevel, o.logFormat, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ticketing server:", err)
		return 2
	}
	defer lw.flush(time.Second) // the last lines, before main exits (bounded: stderr may be stalled)
	o.cfg.LogFlush = lw.flush
	srv, err := server.New(o.cfg, log)
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	startOps(srv, o) // deploy_settings.go: metrics, the generator on the admin listener
	ln, err := srv.Listen()
	if err != nil {
		log.Error("cannot listen", "addr", o.cfg.Addr, "err", err)
		return 1
	}
	if a := o.cfg.AdminListenAddr(); a != "" {
		if aln, err := net.Listen("tcp", a); err != nil {
			log.Error("admin listener not started", "addr", a, "err", err)
		} else {
			log.Info("admin listening", "addr", aln.Addr().String())
			go func() {
				if err := srv.ServeAdmin(aln); err != nil {
					log.Error("admin listener stopped", "err", err)
				}
			}()
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	for {
		select {
		case err := <-served:
			log.Error("serve failed", "err", err)
			return 1
		case s := <-sig:
			if s == syscall.SIGHUP {
				o.reload(srv, log)
				continue
			}
			log.Info("shutting down", "signal", s.String())
		}
		break
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Error("shutdown incomplete", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}
