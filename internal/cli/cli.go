// Package cli is the client side of the ticketing binary, everything but `ticketing server`:
// the client commands on the Go client (acquire, release, extend, inspect, ping, and lock with
// its watchdog process), the commands that talk to a server's admin listener (top,
// healthcheck, cluster) and `ticketing deploy` (on internal/deploy). cmd/ticketing dispatches
// to Run, RunOps, RunCluster and RunSupervisor and exits with the code they return (Exit*,
// docs/cli.md "Exit status").
package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
)

// Exit codes of the client commands (docs/cli.md, "Exit status").
const (
	ExitOK          = 0  // done
	ExitNo          = 1  // the server said no: not acquired (wait timed out) or not held
	ExitUsage       = 2  // bad arguments: the command line, or an argument the server refused
	ExitUnavailable = 3  // could not reach or talk to the server: unavailable, timeout, connection lost, protocol
	ExitAuth        = 4  // authentication failed
	ExitTLS         = 5  // TLS error
	ExitLockLost    = 75 // lock: the lock was lost (or about to be) while COMMAND ran; COMMAND was stopped (EX_TEMPFAIL)
)

// Defaults of the client commands.
const (
	defaultLease   = 30 * time.Second
	defaultTimeout = 10 * time.Second
)

// stderr and stdout are variables so that tests can capture them.
var (
	stdout io.Writer = os.Stdout
	stderr io.Writer = os.Stderr
)

// Run runs one client command (everything but "server") and returns the process exit code.
func Run(cmd string, args []string) int {
	switch cmd {
	case "acquire":
		return runAcquire(args)
	case "release":
		return runRelease(args)
	case "extend":
		return runExtend(args)
	case "ping":
		return runPing(args)
	case "lock":
		return runLock(args)
	case "inspect":
		return runInspect(args)
	}
	fmt.Fprintf(stderr, "ticketing: unknown command %q (run 'ticketing help')\n", cmd)
	return ExitUsage
}

// globalValueFlags are the flags a client command accepts before its name (`ticketing --addr A
// acquire K`) as well as after it; those with a value.
var globalValueFlags = map[string]bool{"addr": true, "tls-ca": true, "tls-cert": true, "tls-key": true, "timeout": true}

// SplitGlobal separates the flags before the command name from the rest: it returns them (to be
// given to the command), the command and its arguments. An unknown flag there is a usage error.
func SplitGlobal(args []string) (global []string, cmd string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			return global, a, args[i+1:], nil
		}
		if a == "--" {
			break
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case name == "tls":
			global = append(global, a)
		case globalValueFlags[name] && hasValue:
			global = append(global, a)
		case globalValueFlags[name]:
			if i+1 >= len(args) {
				return nil, "", nil, fmt.Errorf("flag needs an argument: %s", a)
			}
			global = append(global, a, args[i+1])
			i++
		default:
			return nil, "", nil, fmt.Errorf("unknown flag %s before the command (global flags: --addr, --timeout, --tls, --tls-ca, --tls-cert, --tls-key)", a)
		}
	}
	return nil, "", nil, errors.New("missing COMMAND")
}

// common holds the flags every client command takes.
type common struct {
	addr    string
	tlsCA   string
	tls     bool
	tlsCert string
	tlsKey  string
	timeout durationFlag
}

func addCommon(fs *flag.FlagSet) *common {
	c := &common{timeout: durationFlag{d: defaultTimeout}}
	addr := os.Getenv("TICKETING_ADDR")
	if addr == "" {
		addr = ticketing.DefaultEndpoint
	}
	fs.StringVar(&c.addr, "addr", addr, "server address(es) host:port, comma-separated for a cluster (env TICKETING_ADDR)")
	fs.StringVar(&c.tlsCA, "tls-ca", os.Getenv("TICKETING_TLS_CA"), "PEM CA bundle to verify the server: enables TLS (env TICKETING_TLS_CA)")
	fs.BoolVar(&c.tls, "tls", false, "use TLS, verifying the server against the system's CAs")
	fs.StringVar(&c.tlsCert, "tls-cert", os.Getenv("TICKETING_TLS_CLIENT_CERT"), "PEM client certificate for mutual TLS, with --tls-key: enables TLS (env TICKETING_TLS_CLIENT_CERT)")
	fs.StringVar(&c.tlsKey, "tls-key", os.Getenv("TICKETING_TLS_CLIENT_KEY"), "PEM private key of --tls-cert (env TICKETING_TLS_CLIENT_KEY)")
	fs.Var(&c.timeout, "timeout", "bound on connecting and on each request (time spent queued for a lock is not a request's: acquire and lock bound it with --wait)")
	return c
}

// check validates the common flags before anything is dialled.
func (c *common) check() error {
	switch {
	case c.timeout.d <= 0:
		return fmt.Errorf("--timeout %v must be positive", c.timeout.d)
	case (c.tlsCert == "") != (c.tlsKey == ""):
		return errors.New("--tls-cert and --tls-key go together")
	}
	var eps []string
	for _, a := range strings.Split(c.addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				return fmt.Errorf("--addr (or TICKETING_ADDR) %q: want host:port", a)
			}
			eps = append(eps, a)
		}
	}
	if len(eps) == 0 {
		return errors.New("--addr is empty")
	}
	return nil
}

// options turns the common flags into client options; the auth token comes from
// TICKETING_TOKEN or the first line of the file named by TICKETING_TOKEN_FILE.
func (c *common) options() ([]ticketing.Option, error) {
	var eps []string
	for _, a := range strings.Split(c.addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			eps = append(eps, a)
		}
	}
	opts := []ticketing.Option{ticketing.WithEndpoints(eps...), ticketing.WithDialTimeout(c.timeout.d), ticketing.WithRequestTimeout(c.timeout.d)}
	if tok, ok := os.LookupEnv("TICKETING_TOKEN"); ok && tok != "" {
		opts = append(opts, ticketing.WithToken(tok))
	} else if f := os.Getenv("TICKETING_TOKEN_FILE"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, usageError{fmt.Errorf("TICKETING_TOKEN_FILE: %w", err)}
		}
		line, _, _ := strings.Cut(string(b), "\n")
		opts = append(opts, ticketing.WithToken(strings.TrimRight(line, "\r")))
	}
	if c.tlsCA != "" || c.tls || c.tlsCert != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.tlsCA != "" {
			pem, err := os.ReadFile(c.tlsCA)
			if err != nil {
				return nil, usageError{fmt.Errorf("--tls-ca: %w", err)}
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, usageError{fmt.Errorf("--tls-ca %s: no PEM certificate found", c.tlsCA)}
			}
			cfg.RootCAs = pool
		}
		if c.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
			if err != nil {
				return nil, usageError{fmt.Errorf("--tls-cert/--tls-key: %w", err)}
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, ticketing.WithTLS(cfg))
	}
	return opts, nil
}

// usageError is a bad argument found before anything was sent (exit 2).
type usageError struct{ error }

func (c *common) dial(ctx context.Context) (*ticketing.Client, error) {
	opts, err := c.options()
	if err != nil {
		return nil, err
	}
	return ticketing.Dial(ctx, opts...)
}

// call dials, runs fn (bounded by the client's request timeout and SIGINT/SIGTERM), and turns
// its error into the command's exit status.
func (c *common) call(name string, fn func(context.Context, *ticketing.Client) error) int {
	ctx, which, stop := interruptible()
	defer stop()
	client, err := c.dial(ctx)
	if err != nil {
		return failOrSignal(name, err, which())
	}
	defer client.Close()
	if err := fn(ctx, client); err != nil {
		return failOrSignal(name, err, which())
	}
	return ExitOK
}
