package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
)

// Exit codes of the client commands (docs/cli.md).
const (
	exitOK       = 0  // done
	exitNo       = 1  // the server said no: not acquired (wait timed out) or not held
	exitUsage    = 2  // bad command line
	exitError    = 3  // could not talk to the server (connection, TLS, auth, server error)
	exitLockLost = 75 // lock: the lock was lost (or about to be) while COMMAND ran; COMMAND was stopped (EX_TEMPFAIL)
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

// runCLI runs one client command (everything but "server") and returns the process exit code.
func runCLI(cmd string, args []string) int {
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
	return exitUsage
}

// common holds the flags every client command takes.
type common struct {
	addr    string
	tlsCA   string
	tls     bool
	timeout time.Duration
}

func addCommon(fs *flag.FlagSet) *common {
	c := &common{}
	addr := os.Getenv("TICKETING_ADDR")
	if addr == "" {
		addr = ticketing.DefaultEndpoint
	}
	fs.StringVar(&c.addr, "addr", addr, "server address(es) host:port, comma-separated for a cluster (env TICKETING_ADDR)")
	fs.StringVar(&c.tlsCA, "tls-ca", os.Getenv("TICKETING_TLS_CA"), "PEM CA bundle to verify the server: enables TLS (env TICKETING_TLS_CA)")
	fs.BoolVar(&c.tls, "tls", false, "use TLS, verifying the server against the system's CAs")
	fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "bound on connecting and on each request (not on time spent queued: see --wait)")
	return c
}

// dial connects with the common flags; the auth token comes from TICKETING_TOKEN or the file
// named by TICKETING_TOKEN_FILE.
func (c *common) dial(ctx context.Context) (*ticketing.Client, error) {
	var eps []string
	for _, a := range strings.Split(c.addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			eps = append(eps, a)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("--addr is empty")
	}
	opts := []ticketing.Option{ticketing.WithEndpoints(eps...), ticketing.WithDialTimeout(c.timeout), ticketing.WithMaxRetries(2)}
	if tok, ok := os.LookupEnv("TICKETING_TOKEN"); ok && tok != "" {
		opts = append(opts, ticketing.WithToken(tok))
	} else if f := os.Getenv("TICKETING_TOKEN_FILE"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("TICKETING_TOKEN_FILE: %w", err)
		}
		opts = append(opts, ticketing.WithToken(strings.TrimRight(string(b), "\r\n")))
	}
	if c.tlsCA != "" || c.tls {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.tlsCA != "" {
			pem, err := os.ReadFile(c.tlsCA)
			if err != nil {
				return nil, fmt.Errorf("--tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca %s: no PEM certificate found", c.tlsCA)
			}
			cfg.RootCAs = pool
		}
		opts = append(opts, ticketing.WithTLS(cfg))
	}
	dctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return ticketing.Dial(dctx, opts...)
}

// newFlagSet returns a flag set whose --help prints usage (the synopsis and what the command
// does) and the flags.
// call dials, runs fn under the request timeout (and SIGINT/SIGTERM), and turns its error into
// the command's exit status.
func (c *common) call(name string, fn func(context.Context, *ticketing.Client) error) int {
	ctx, _, stop := interruptible()
	defer stop()
	client, err := c.dial(ctx)
	if err != nil {
		return fail(name, err)
	}
	defer client.Close()
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if err := fn(rctx, client); err != nil {
		return fail(name, err)
	}
	return exitOK
}

func newFlagSet(name, synopsis, about string) *flag.FlagSet {
	fs := flag.NewFlagSet("ticketing "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: ticketing %s %s\n\n%s\n\nOptions:\n", name, synopsis, about)
		fs.PrintDefaults()
	}
	return fs
}

// parseInterleaved parses flags anywhere among the arguments (`acquire KEY --lease 5s` and
// `acquire --lease 5s KEY` alike) and returns the positional arguments. After `--` everything is
// positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		consumed := len(args) - len(fs.Args())
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, fs.Args()...), nil
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseCommand parses flags and exactly len(names) positional arguments.
func parseCommand(fs *flag.FlagSet, args []string, names ...string) ([]string, int, bool) {
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil, exitOK, false
	}
	if err != nil {
		return nil, exitUsage, false // flag already printed the error and the usage
	}
	if len(pos) != len(names) {
		if len(pos) < len(names) {
			fmt.Fprintf(stderr, "%s: missing %s\n", fs.Name(), strings.Join(names[len(pos):], " "))
		} else {
			fmt.Fprintf(stderr, "%s: unexpected argument %q\n", fs.Name(), pos[len(names)])
		}
		fs.Usage()
		return nil, exitUsage, false
	}
	return pos, 0, true
}

// waitFlag is --wait: a duration, or "forever" (the default: wait until granted or interrupted).
type waitFlag struct {
	d       time.Duration
	forever bool
}

func (w *waitFlag) String() string {
	if w == nil || w.forever {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	if s == "forever" || s == "inf" || s == "-1" {
		w.forever = true
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("negative wait")
	}
	w.d, w.forever = d, false
	return nil
}

func (w *waitFlag) options() []ticketing.AcquireOption {
	if w.forever {
		return nil
	}
	return []ticketing.AcquireOption{ticketing.WithWaitTimeout(w.d)}
}

func parseToken(fs *flag.FlagSet, s string) (uint64, bool) {
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil || t == 0 {
		fmt.Fprintf(stderr, "%s: TOKEN %q is not a positive integer\n", fs.Name(), s)
		return 0, false
	}
	return t, true
}

// fail prints err for command name and returns its exit code.
func fail(name string, err error) int {
	switch {
	case errors.Is(err, ticketing.ErrNotAcquired):
		fmt.Fprintf(stderr, "%s: not acquired: the wait timed out (the key is taken)\n", name)
		return exitNo
	case errors.Is(err, ticketing.ErrNotHeld):
		fmt.Fprintf(stderr, "%s: not held: the token does not hold the key (expired, released, or wrong)\n", name)
		return exitNo
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return exitError
}

// interruptible returns a context cancelled by SIGINT or SIGTERM, and the signal that did it.
func interruptible() (context.Context, func() os.Signal, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	got := make(chan os.Signal, 1)
	go func() {
		select {
		case s := <-ch:
			got <- s
			cancel()
		case <-ctx.Done():
		}
	}()
	which := func() os.Signal {
		select {
		case s := <-got:
			got <- s
			return s
		default:
			return nil
		}
	}
	return ctx, which, func() { signal.Stop(ch); cancel() }
}

func signalExit(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 130
}

func runAcquire(args []string) int {
	fs := newFlagSet("acquire", "KEY [--lease D] [--wait D]",
		"Take the lock on KEY and print its fencing token. The lock stays held after the command\n"+
			"exits, until 'ticketing release KEY TOKEN' or until the lease runs out. Waits in the\n"+
			"key's FIFO queue (--wait); exit status 1 when it was not acquired in time.")
	cf := addCommon(fs)
	lease := fs.Duration("lease", defaultLease, "lease: the server takes the lock back after this long unless extended")
	wait := &waitFlag{forever: true}
	fs.Var(wait, "wait", "how long to wait in the queue: a duration (0 = try once) or \"forever\"")
	pos, code, ok := parseCommand(fs, args, "KEY")
	if !ok {
		return code
	}
	ctx, which, stop := interruptible()
	defer stop()
	c, err := cf.dial(ctx)
	if err != nil {
		return fail(fs.Name(), err)
	}
	defer c.Close()
	lk, err := c.Acquire(ctx, pos[0], *lease, wait.options()...)
	if err != nil {
		if s := which(); s != nil {
			fmt.Fprintf(stderr, "%s: interrupted (%v); nothing is held\n", fs.Name(), s)
			return signalExit(s)
		}
		return fail(fs.Name(), err)
	}
	fmt.Fprintln(stdout, lk.Token())
	return exitOK
}

func runRelease(args []string) int {
	fs := newFlagSet("release", "KEY TOKEN",
		"Release the lock on KEY held with TOKEN; the next waiter gets it at once.\n"+
			"Exit status 1 when TOKEN does not hold KEY (expired, released, wrong): nothing changed.")
	cf := addCommon(fs)
	pos, code, ok := parseCommand(fs, args, "KEY", "TOKEN")
	if !ok {
		return code
	}
	token, ok := parseToken(fs, pos[1])
	if !ok {
		return exitUsage
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		return c.Release(ctx, pos[0], token)
	})
}

func runExtend(args []string) int {
	fs := newFlagSet("extend", "KEY TOKEN [--lease D]",
		"Set the lease of the lock on KEY held with TOKEN to --lease from now (it may shorten it).\n"+
			"Exit status 1 when TOKEN does not hold KEY.")
	cf := addCommon(fs)
	lease := fs.Duration("lease", defaultLease, "the new lease, from now")
	pos, code, ok := parseCommand(fs, args, "KEY", "TOKEN")
	if !ok {
		return code
	}
	token, ok := parseToken(fs, pos[1])
	if !ok {
		return exitUsage
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		_, err := c.Extend(ctx, pos[0], token, *lease)
		return err
	})
}

func runPing(args []string) int {
	fs := newFlagSet("ping", "", "Connect (handshake and auth included), send PING, and print the round trip.")
	cf := addCommon(fs)
	_, code, ok := parseCommand(fs, args)
	if !ok {
		return code
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		start := time.Now()
		if err := c.Ping(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ok %v\n", time.Since(start).Round(time.Microsecond))
		return nil
	})
}

func runInspect(args []string) int {
	fs := newFlagSet("inspect", "KEY [--json]",
		"Show who holds KEY (the holder's token), the lease left, how long it has been held, how\n"+
			"many acquires wait, and the lock-delay left. Changes nothing.")
	cf := addCommon(fs)
	asJSON := fs.Bool("json", false, "print a JSON object")
	pos, code, ok := parseCommand(fs, args, "KEY")
	if !ok {
		return code
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		info, err := c.Inspect(ctx, pos[0])
		if err != nil {
			return err
		}
		printKeyInfo(info, *asJSON)
		return nil
	})
}

func printKeyInfo(info ticketing.KeyInfo, asJSON bool) {
	if asJSON {
		b, _ := json.Marshal(map[string]any{
			"key": info.Key, "held": info.Held, "token": info.Token, "waiters": info.Waiters,
			"lease_left_ms": info.LeaseLeft.Milliseconds(), "held_for_ms": info.HeldFor.Milliseconds(),
			"lock_delay_left_ms": info.LockDelayLeft.Milliseconds(),
		})
		fmt.Fprintln(stdout, string(b))
		return
	}
	fmt.Fprintf(stdout, "key=%s held=%t token=%d lease_left=%v held_for=%v waiters=%d lock_delay_left=%v\n",
		strconv.Quote(info.Key), info.Held, info.Token, info.LeaseLeft, info.HeldFor, info.Waiters, info.LockDelayLeft)
}
