package settings

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ticketing/ticketing/internal/server"
)

// Parse reads defaults, then TICKETING_* variables (through getenv), then flags (args, the
// arguments after `ticketing server`), and validates the result. The auth token is read from
// TICKETING_TOKEN or TICKETING_TOKEN_FILE only: a flag would show it in ps. Errors are one line
// naming the setting; --help prints the usage on stdout and returns flag.ErrHelp.
func Parse(args []string, getenv func(string) string) (*Server, error) {
	o := Defaults()
	fs := flag.NewFlagSet("ticketing server", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ticketing server [--flag value ...]\n\nEvery flag is also an environment variable (--max-lease = TICKETING_MAX_LEASE).\nThe auth token comes from TICKETING_TOKEN or TICKETING_TOKEN_FILE, never from a flag.")
		fs.PrintDefaults()
	}
	for _, st := range o.list() {
		if st.Name == "min-lease" {
			inner := st.set
			st.set = func(v string) error { o.minLeaseSet = true; return inner(v) }
		}
		if v := getenv(EnvName(st.Name)); v != "" {
			if err := st.set(v); err != nil {
				return nil, fmt.Errorf("%s=%q: %w", EnvName(st.Name), v, err)
			}
		}
		help := st.Help + " (env " + EnvName(st.Name) + ", default " + strconv.Quote(st.Default) + ")"
		if st.isBool {
			fs.Var(boolFunc(st.set), st.Name, help) // --join alone means true, as for any Go boolean flag
		} else {
			fs.Func(st.Name, help, st.set)
		}
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
		o.Config.StartupAuto, o.Config.StartupGrace = true, 0
	case "0", "0s", "off":
		o.Config.StartupAuto, o.Config.StartupGrace = false, 0
	default:
		d, err := time.ParseDuration(g)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("TICKETING_STARTUP_GRACE=%q: want auto, 0, or a duration (a floor on auto)", g)
		}
		o.Config.StartupAuto, o.Config.StartupGrace = true, d
	}
	if err := o.clusterSettings(getenv); err != nil {
		return nil, err
	}
	o.Config.Faults = faultSettings(getenv)
	o.Config.AdminToken = getenv("TICKETING_ADMIN_TOKEN")
	if o.adminTokenFile != "" {
		b, err := os.ReadFile(o.adminTokenFile)
		if err != nil {
			return nil, fmt.Errorf("TICKETING_ADMIN_TOKEN_FILE: %w", err)
		}
		o.Config.AdminToken = strings.TrimRight(string(b), "\r\n")
	}
	if (o.adminCert == "") != (o.adminKey == "") {
		return nil, errors.New("TICKETING_ADMIN_TLS_CERT and TICKETING_ADMIN_TLS_KEY go together")
	}
	if o.adminCert != "" {
		cert, err := tls.LoadX509KeyPair(o.adminCert, o.adminKey)
		if err != nil {
			return nil, fmt.Errorf("TICKETING_ADMIN_TLS_CERT/KEY: %w", err)
		}
		o.Config.AdminTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return nil, errors.New("TICKETING_TLS_CERT and TICKETING_TLS_KEY go together")
	}
	if o.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("TICKETING_TLS_CERT/TICKETING_TLS_KEY: %w", err)
		}
		o.Config.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if o.tlsCA != "" {
			pem, err := os.ReadFile(o.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("TICKETING_TLS_CLIENT_CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, errors.New("TICKETING_TLS_CLIENT_CA: no certificate found")
			}
			o.Config.TLS.ClientCAs = pool
			o.Config.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		}
	} else if o.tlsCA != "" {
		return nil, errors.New("TICKETING_TLS_CLIENT_CA needs TICKETING_TLS_CERT and TICKETING_TLS_KEY")
	}
	return o, o.Config.Validate()
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

// clusterSettings fills Config.Cluster when TICKETING_NODE_ID is set.
func (o *Server) clusterSettings(getenv func(string) string) error {
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
		o.Config.MinLease = max(o.Config.MinLease, cc.FailoverBound())
	}
	o.Config.Cluster = cc
	return nil
}

// loadTokens sets Config.Tokens from TICKETING_TOKEN, or from the token file: its first
// non-empty line is the current token, a second the previous one (accepted during a rotation).
func (o *Server) loadTokens() error {
	if o.tokenFile == "" {
		o.Config.Tokens = nil
		if o.token != "" {
			o.Config.Tokens = []string{o.token}
		}
		return nil
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
	// Both set: a shell that exports TICKETING_TOKEN for the CLI starting a node configured with
	// the file. The same token is no conflict; different ones are refused, since either choice
	// could be the wrong one (a server started on a stale token locks its clients out).
	if o.token != "" && o.token != toks[0] {
		return errors.New("TICKETING_TOKEN and TICKETING_TOKEN_FILE are both set and differ: the server takes one token source; unset TICKETING_TOKEN for it (env -u TICKETING_TOKEN ticketing server ...) or make them the same")
	}
	if len(toks) > 2 {
		return fmt.Errorf("TICKETING_TOKEN_FILE %s holds %d tokens: at most two (current, then previous)", o.tokenFile, len(toks))
	}
	o.Config.Tokens = toks
	return nil
}

// Reload re-reads what SIGHUP reloads into srv: the token file and the TLS key pair. A file
// that does not load is logged and leaves srv as it was.
func (o *Server) Reload(srv *server.Server, log *slog.Logger) {
	if o.tokenFile != "" {
		if err := o.loadTokens(); err != nil {
			log.Error("SIGHUP: token file not reloaded", "err", err)
		} else {
			srv.SetTokens(o.Config.Tokens)
			log.Info("SIGHUP: tokens reloaded", "accepted", len(o.Config.Tokens))
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

// boolFunc is a boolean setting's flag: it may stand alone (--join) or take a value (--join=false).
type boolFunc func(string) error

func (f boolFunc) String() string     { return "" }
func (f boolFunc) Set(v string) error { return f(v) }
func (f boolFunc) IsBoolFlag() bool   { return true }
