package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ticketing/ticketing/internal/deploy"
	"github.com/ticketing/ticketing/internal/server"
	"github.com/ticketing/ticketing/internal/settings"
)

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

// startOps wires the operations side into a server built by runServer, before it serves:
// metrics (unless TICKETING_METRICS=off) and the launch-command generator's route on the admin
// listener (the admin page's form).
func startOps(srv *server.Server, o *settings.Server) {
	if !o.MetricsOff {
		srv.EnableMetrics()
	}
	srv.AdminMux().Handle("POST /api/deploy", deploy.ServeDeploy)
}

// runServer is `ticketing server`: it parses the settings (internal/settings), serves until
// SIGINT or SIGTERM, reloads the token file and TLS key pair on SIGHUP, and returns the exit code.
func runServer(args []string) int {
	o, err := settings.Parse(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ticketing server:", err)
		return 2
	}
	log, lw, err := newLogger(o.LogLevel, o.LogFormat, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ticketing server:", err)
		return 2
	}
	defer lw.flush(time.Second) // the last lines, before main exits (bounded: stderr may be stalled)
	o.Config.LogFlush = lw.flush
	srv, err := server.New(o.Config, log)
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	startOps(srv, o)
	ln, err := srv.Listen()
	if err != nil {
		log.Error("cannot listen", "addr", o.Config.Addr, "err", err)
		return 1
	}
	if a := o.Config.AdminListenAddr(); a != "" {
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
				o.Reload(srv, log)
				continue
			}
			log.Info("shutting down", "signal", s.String())
		}
		break
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.Config.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Error("shutdown incomplete", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}
