package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
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
	return setting{name, help, func(v string) (err error) { *p, err = time.ParseDuration(v); return }, p.String()}
}

func intSetting(name, help string, p *int) setting {
	return setting{name, help, func(v string) (err error) { *p, err = strconv.Atoi(v); return }, strconv.Itoa(*p)}
}

func stringSetting(name, help string, p *string) setting {
	return setting{name, help, func(v string) error { *p = v; return nil }, *p}
}

func envName(flagName string) string {
	return "TICKETING_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

type serverSettings struct {
	cfg                    server.Config
	tokenFile              string
	tlsCert, tlsKey, tlsCA string
	logLevel, logFormat    string
}

func (o *serverSettings) list() []setting {
	c := &o.cfg
	return []setting{
		stringSetting("addr", "listen address (host:port); port 0 picks a free one", &c.Addr),
		stringSetting("data-dir", "directory for the durable fencing-token high-water mark", &c.DataDir),
		stringSetting("token", "shared auth token (empty: no auth); prefer TICKETING_TOKEN_FILE", &c.Token),
		stringSetting("token-file", "file holding the shared auth token", &o.tokenFile),
		stringSetting("tls-cert", "PEM certificate chain: enables TLS (with --tls-key)", &o.tlsCert),
		stringSetting("tls-key", "PEM private key for --tls-cert", &o.tlsKey),
		stringSetting("tls-client-ca", "PEM CA bundle: require client certificates signed by it", &o.tlsCA),
		intSetting("max-key-len", "longest key in bytes (<= 65535)", &c.MaxKeyLen),
		durationSetting("min-lease", "shortest lease accepted", &c.MinLease),
		durationSetting("max-lease", "longest lease accepted", &c.MaxLease),
		intSetting("max-connections", "connections at once", &c.MaxConnections),
		intSetting("max-waiters-per-key", "queued acquires on one key", &c.MaxWaitersPerKey),
		intSetting("max-waiters", "queued acquires in total", &c.MaxWaiters),
		intSetting("max-locks", "distinct keys held, waited on or in lock-delay", &c.MaxLocks),
		intSetting("max-inflight", "pending acquires per connection", &c.MaxInflight),
		durationSetting("handshake-timeout", "time allowed for the handshake", &c.HandshakeTimeout),
		durationSetting("write-timeout", "a write blocked longer closes the connection", &c.WriteTimeout),
		intSetting("max-output", "bytes queued for a client that does not read before it is closed", &c.MaxOutput),
		durationSetting("lock-delay", "keep a key unavailable this long after a lease expiry (0: off)", &c.LockDelay),
		durationSetting("startup-grace", "grant nothing for this long after start (set it to the longest lease for strict exclusion across restarts)", &c.StartupGrace),
		durationSetting("shutdown-timeout", "bound on graceful shutdown", &c.ShutdownTimeout),
		stringSetting("log-level", "debug, info, warn or error", &o.logLevel),
		stringSetting("log-format", "text or json", &o.logFormat),
	}
}

// parseServerSettings reads defaults, then TICKETING_* variables, then flags.
func parseServerSettings(args []string, getenv func(string) string) (*serverSettings, error) {
	o := &serverSettings{cfg: server.Default(), logLevel: "info", logFormat: "text"}
	fs := flag.NewFlagSet("ticketing server", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: ticketing server [--flag value ...]\n\nEvery flag is also an environment variable (--max-lease = TICKETING_MAX_LEASE).")
		fs.PrintDefaults()
	}
	for _, st := range o.list() {
		if v := getenv(envName(st.name)); v != "" {
			if err := st.set(v); err != nil {
				return nil, fmt.Errorf("%s=%q: %w", envName(st.name), v, err)
			}
		}
		fs.Func(st.name, st.help+" (env "+envName(st.name)+", default "+strconv.Quote(st.def)+")", st.set)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("TICKETING_TOKEN_FILE: %w", err)
		}
		o.cfg.Token = strings.TrimRight(string(b), "\r\n")
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return nil, errors.New("TICKETING_TLS_CERT and TICKETING_TLS_KEY go together")
	}
	if o.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("TLS key pair: %w", err)
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
	}
	return o, o.cfg.Validate()
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("TICKETING_LOG_LEVEL: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("TICKETING_LOG_FORMAT %q: want text or json", format)
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
	log, err := newLogger(o.logLevel, o.logFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ticketing server:", err)
		return 2
	}
	srv, err := server.New(o.cfg, log)
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	ln, err := srv.Listen()
	if err != nil {
		log.Error("cannot listen", "addr", o.cfg.Addr, "err", err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		log.Error("serve failed", "err", err)
		return 1
	case s := <-sig:
		log.Info("shutting down", "signal", s.String())
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
