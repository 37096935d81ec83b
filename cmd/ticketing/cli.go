package main

import (
	"bufio"
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

// Exit codes of the client commands (docs/cli.md, "Exit status").
const (
	exitOK          = 0  // done
	exitNo          = 1  // the server said no: not acquired (wait timed out) or not held
	exitUsage       = 2  // bad arguments: the command line, or an argument the server refused
	exitUnavailable = 3  // could not reach or talk to the server: unavailable, timeout, connection lost, protocol
	exitAuth        = 4  // authentication failed
	exitTLS         = 5  // TLS error
	exitLockLost    = 75 // lock: the lock was lost (or about to be) while COMMAND ran; COMMAND was stopped (EX_TEMPFAIL)
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

// globalValueFlags are the flags a client command accepts before its name (`ticketing --addr A
// acquire K`) as well as after it; those with a value.
var globalValueFlags = map[string]bool{"addr": true, "tls-ca": true, "tls-cert": true, "tls-key": true, "timeout": true}

// splitGlobal separates the flags before the command name from the rest: it returns them (to be
// given to the command), the command and its arguments. An unknown flag there is a usage error.
func splitGlobal(args []string) (global []string, cmd string, rest []string, err error) {
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
	fs.Var(&c.timeout, "timeout", "bound on connecting and on each request (not on time spent queued: see --wait)")
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
	return exitOK
}

// newFlagSet returns a flag set that reports its errors as one line (see parseCommand); --help
// prints the synopsis, what the command does and its flags on stdout.
func newFlagSet(name, synopsis, about string) *flag.FlagSet {
	fs := flag.NewFlagSet("ticketing "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	helpText[fs] = fmt.Sprintf("usage: ticketing %s %s\n\n%s\n\nOptions (they may also come before the command name):\n", name, synopsis, about)
	return fs
}

var helpText = map[*flag.FlagSet]string{}

func printHelp(fs *flag.FlagSet) {
	fmt.Fprint(stdout, helpText[fs])
	fs.SetOutput(stdout)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// usage prints one line `ticketing COMMAND: message` and returns exit status 2.
func usage(fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(stderr, "%s: %s (see '%s --help')\n", fs.Name(), fmt.Sprintf(format, args...), fs.Name())
	return exitUsage
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

// parseCommand parses flags and exactly len(names) positional arguments. On --help or an error
// it returns ok false and the exit status.
func parseCommand(fs *flag.FlagSet, args []string, names ...string) ([]string, int, bool) {
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		printHelp(fs)
		return nil, exitOK, false
	}
	if err != nil {
		return nil, usage(fs, "%v", err), false
	}
	if len(pos) != len(names) {
		if len(pos) < len(names) {
			return nil, usage(fs, "missing %s", strings.Join(names[len(pos):], " ")), false
		}
		return nil, usage(fs, "unexpected argument %q", pos[len(names)]), false
	}
	return pos, 0, true
}

// durationFlag is a duration flag whose errors say what was expected: `--lease 30` suggests 30s.
type durationFlag struct{ d time.Duration }

func (f *durationFlag) String() string { return f.d.String() }

func (f *durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return fmt.Errorf("%q has no unit (did you mean %ss or %sms?)", s, s, s)
		}
		return fmt.Errorf("%q is not a duration like 30s, 1m or 500ms", s)
	}
	f.d = d
	return nil
}

// checkLease validates a --lease before anything is sent.
func checkLease(d time.Duration) error {
	switch {
	case d < ticketing.MinLease:
		return fmt.Errorf("--lease %v must be at least 1ms", d)
	case d > ticketing.MaxLease:
		return fmt.Errorf("--lease %v is above the protocol's maximum of %v", d, ticketing.MaxLease)
	}
	return nil
}

func checkKey(key string) error {
	switch {
	case key == "":
		return errors.New("KEY is empty")
	case len(key) > ticketing.MaxKeyLen:
		return fmt.Errorf("KEY is %d bytes, above the protocol's %d", len(key), ticketing.MaxKeyLen)
	}
	return nil
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
	var d durationFlag
	if err := d.Set(s); err != nil {
		return err
	}
	if d.d < 0 {
		return fmt.Errorf("%v is negative (0 tries once; \"forever\" waits without limit)", d.d)
	}
	w.d, w.forever = d.d, false
	return nil
}

func (w *waitFlag) options() []ticketing.AcquireOption {
	if w.forever {
		return nil
	}
	return []ticketing.AcquireOption{ticketing.WithWaitTimeout(w.d)}
}

func parseToken(s string) (uint64, error) {
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil || t == 0 {
		return 0, fmt.Errorf("TOKEN %q is not a positive integer", s)
	}
	return t, nil
}

// exitCodeOf maps a client error to the exit status of docs/cli.md.
func exitCodeOf(err error) int {
	var ue usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, ticketing.ErrInvalid):
		return exitUsage
	case errors.Is(err, ticketing.ErrNotAcquired), errors.Is(err, ticketing.ErrNotHeld), errors.Is(err, ticketing.ErrLockLost):
		return exitNo
	case errors.Is(err, ticketing.ErrAuthFailed):
		return exitAuth
	case errors.Is(err, ticketing.ErrTLS):
		return exitTLS
	}
	return exitUnavailable
}

// message is err as one line, without the package prefix and without repeating the command
// name: `ticketing acquire: "k": not acquired within 1s (TIMED_OUT)`.
func message(name string, err error) string {
	s := strings.TrimPrefix(err.Error(), "ticketing: ")
	cmd := strings.TrimPrefix(name, "ticketing ")
	if rest, ok := strings.CutPrefix(s, cmd+" "); ok {
		s = rest
	} else if rest, ok := strings.CutPrefix(s, cmd+": "); ok {
		s = rest
	}
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// fail prints err for command name on one line and returns its exit status.
func fail(name string, err error) int {
	fmt.Fprintf(stderr, "%s: %s\n", name, message(name, err))
	return exitCodeOf(err)
}

// failOrSignal is fail, unless a signal interrupted the command: then 128+N.
func failOrSignal(name string, err error, sig os.Signal) int {
	if sig != nil {
		fmt.Fprintf(stderr, "%s: interrupted (%s); nothing is held\n", name, signalName(sig))
		return signalExit(sig)
	}
	return fail(name, err)
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

// signalName is the conventional name of a signal ("SIGTSTP"), where Go's is a description
// ("stopped").
func signalName(s os.Signal) string {
	if n, ok := s.(syscall.Signal); ok {
		if name, ok := signalNames[n]; ok {
			return name
		}
		return "signal " + strconv.Itoa(int(n))
	}
	return s.String()
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
	lease := &durationFlag{d: defaultLease}
	fs.Var(lease, "lease", "lease: the server takes the lock back after this long unless extended")
	wait := &waitFlag{forever: true}
	fs.Var(wait, "wait", "how long to wait in the queue: a duration (0 = try once) or \"forever\"")
	pos, code, ok := parseCommand(fs, args, "KEY")
	if !ok {
		return code
	}
	if err := errors.Join(checkKey(pos[0]), checkLease(lease.d), cf.check()); err != nil {
		return usage(fs, "%v", oneLine(err))
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		lk, err := c.Acquire(ctx, pos[0], lease.d, wait.options()...)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, lk.Token())
		return nil
	})
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

func runRelease(args []string) int {
	fs := newFlagSet("release", "KEY TOKEN",
		"Release the lock on KEY held with TOKEN; the next waiter gets it at once.\n"+
			"Exit status 1 when TOKEN does not hold KEY (expired, released, wrong): nothing changed.")
	cf := addCommon(fs)
	pos, code, ok := parseCommand(fs, args, "KEY", "TOKEN")
	if !ok {
		return code
	}
	token, err := parseToken(pos[1])
	if err := errors.Join(checkKey(pos[0]), err, cf.check()); err != nil {
		return usage(fs, "%v", oneLine(err))
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
	lease := &durationFlag{d: defaultLease}
	fs.Var(lease, "lease", "the new lease, from now")
	pos, code, ok := parseCommand(fs, args, "KEY", "TOKEN")
	if !ok {
		return code
	}
	token, err := parseToken(pos[1])
	if err := errors.Join(checkKey(pos[0]), err, checkLease(lease.d), cf.check()); err != nil {
		return usage(fs, "%v", oneLine(err))
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		_, err := c.Extend(ctx, pos[0], token, lease.d)
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
	if err := cf.check(); err != nil {
		return usage(fs, "%v", err)
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
		"Show whether KEY is held, the lease left, how long it has been held, how many acquires\n"+
			"wait, and the lock-delay left. Changes nothing. The holder's token is shown only to\n"+
			"its holder, so `inspect` shows token=0 for a lock another client holds.")
	cf := addCommon(fs)
	asJSON := fs.Bool("json", false, "print a JSON object")
	showWaiters := addWaitersFlags(fs) // top.go: --waiters, from the admin listener
	pos, code, ok := parseCommand(fs, args, "KEY")
	if !ok {
		return code
	}
	if err := errors.Join(checkKey(pos[0]), cf.check()); err != nil {
		return usage(fs, "%v", oneLine(err))
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		info, err := c.Inspect(ctx, pos[0])
		if err != nil {
			return err
		}
		printKeyInfo(info, *asJSON)
		return showWaiters(ctx, pos[0], *asJSON)
	})
}

func printKeyInfo(info ticketing.KeyInfo, asJSON bool) {
	if asJSON {
		b, _ := json.Marshal(map[string]any{
			"key": info.Key, "held": info.Held, "token": info.Token, "waiters": info.Waiters,
			"lease_left_ms": info.LeaseLeft.Milliseconds(), "held_for_ms": info.HeldFor.Milliseconds(),
			"lock_delay_left_ms": info.LockDelayLeft.Milliseconds(), "startup_wait": info.Startup,
		})
		fmt.Fprintln(stdout, string(b))
		return
	}
	startup := ""
	if info.Startup {
		startup = " startup_wait=true (the server grants nothing before lock_delay_left has passed)"
	}
	fmt.Fprintf(stdout, "key=%s held=%t token=%d lease_left=%v held_for=%v waiters=%d lock_delay_left=%v%s\n",
		strconv.Quote(info.Key), info.Held, info.Token, info.LeaseLeft, info.HeldFor, info.Waiters, info.LockDelayLeft, startup)
}

// readLines sends every line of r to the returned channel, which is closed at EOF.
func readLines(r io.Reader) <-chan string {
	ch := make(chan string, 16)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}
