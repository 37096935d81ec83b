// Command cli is the conformance driver of the ticketing command-line client (see
// tests/conformance/DRIVER.md). It speaks the driver protocol on stdin/stdout and runs
// $TICKETING_BIN client commands for each driver command, mapping exit statuses and the one-line
// stderr message to DRIVER.md's error kinds:
//
//	0 ok, 1 not acquired / not held, 2 bad arguments, 3 cannot reach or talk to the server,
//	4 authentication failed, 5 TLS error, 75 lock lost while COMMAND ran, 128+N killed by signal N.
//
// A CLI has no lock handles: acquire prints the token and the lock stays held until released by
// token or until its lease ends, so the driver offers no "locks" feature. connect records the
// client's options and runs "ticketing ping" to surface auth, TLS and unreachable errors.
// with_lock runs "ticketing lock KEY --lease D -- sleep S", which keeps the lease alive while
// the command runs (feature with_lock_keepalive). cancel interrupts a waiting "ticketing
// acquire" with SIGINT, which withdraws the request.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// version is the driver's client_version.
const version = "cli-driver/1"

// globalFlagsFirst places the client's flags (--addr, --timeout, TLS) before the command name
// ("ticketing [global flags] COMMAND ...") instead of right after it, where the CLI has always
// accepted them.
const globalFlagsFirst = false

type driver struct {
	bin  string
	out  io.Writer
	omu  sync.Mutex
	mu   sync.Mutex
	cls  map[string]*client
	runs map[int64]*run // running commands, by driver command id
	wg   sync.WaitGroup
}

// client is what connect recorded: the options every command of this client gets.
type client struct {
	name    string
	flags   []string // --addr, --timeout, TLS flags
	env     []string // TICKETING_TOKEN
	closed  bool
	running map[*run]bool
}

// run is one CLI process.
type run struct {
	cmd         *exec.Cmd
	interrupted bool // cancel sent SIGINT
	closed      bool // close or reset ended it
}

type kindError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"`
}

func (e *kindError) Error() string { return e.Kind + ": " + e.Message }

func fail(kind, format string, a ...any) *kindError {
	return &kindError{Kind: kind, Message: fmt.Sprintf(format, a...)}
}

func main() {
	d := &driver{bin: os.Getenv("TICKETING_BIN"), out: os.Stdout, cls: map[string]*client{}, runs: map[int64]*run{}}
	if d.bin == "" {
		fmt.Fprintln(os.Stderr, "cli driver: TICKETING_BIN is not set")
		os.Exit(2)
	}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			fmt.Fprintf(os.Stderr, "cli driver: bad command %q: %v\n", sc.Text(), err)
			continue
		}
		var id int64
		var op string
		json.Unmarshal(m["id"], &id)
		json.Unmarshal(m["op"], &op)
		if op == "exit" {
			d.reset()
			d.reply(id, nil, nil)
			return
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			res, err := d.handle(id, op, m)
			d.reply(id, res, err)
		}()
	}
	d.reset()
	d.wg.Wait()
}

func (d *driver) reply(id int64, res map[string]any, err error) {
	m := map[string]any{"id": id, "ok": err == nil}
	if err != nil {
		var ke *kindError
		if !errors.As(err, &ke) {
			ke = fail("other", "%v", err)
		}
		m["error"] = ke
	}
	for k, v := range res {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	d.omu.Lock()
	defer d.omu.Unlock()
	d.out.Write(append(b, '\n'))
}

func str(m map[string]json.RawMessage, k string) string {
	var s string
	json.Unmarshal(m[k], &s)
	return s
}

func isNull(m map[string]json.RawMessage, k string) bool {
	v, ok := m[k]
	return !ok || string(v) == "null"
}

// num renders a JSON number argument as given (so that -5 stays -5).
func num(m map[string]json.RawMessage, k string) (string, error) {
	var n json.Number
	if err := json.Unmarshal(m[k], &n); err != nil {
		return "", fail("invalid_argument", "%s must be a number", k)
	}
	return n.String(), nil
}

// durationArg renders milliseconds as a duration flag value ("-5ms", "300ms").
func durationArg(m map[string]json.RawMessage, k string) (string, error) {
	n, err := num(m, k)
	if err != nil {
		return "", err
	}
	return n + "ms", nil
}

func (d *driver) client(m map[string]json.RawMessage) (*client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.cls[str(m, "client")]
	if c == nil || c.closed {
		return nil, fail("closed", "no open client %q", str(m, "client"))
	}
	return c, nil
}

func (d *driver) handle(id int64, op string, m map[string]json.RawMessage) (map[string]any, error) {
	switch op {
	case "hello":
		return map[string]any{"language": "cli", "client_version": version,
			"features": []string{"cancel", "with_lock", "with_lock_keepalive", "tls", "mtls", "request_timeout"}}, nil
	case "connect":
		return d.connect(id, m)
	case "close":
		d.mu.Lock()
		c := d.cls[str(m, "client")]
		d.mu.Unlock()
		if c != nil {
			d.closeClient(c)
		}
		return nil, nil
	case "acquire", "try_acquire":
		return d.acquire(id, op, m)
	case "cancel":
		var target int64
		json.Unmarshal(m["target"], &target)
		d.mu.Lock()
		r := d.runs[target]
		if r != nil {
			r.interrupted = true
		}
		d.mu.Unlock()
		if r != nil {
			r.cmd.Process.Signal(syscall.SIGINT)
		}
		return nil, nil
	case "release_token":
		c, err := d.client(m)
		if err != nil {
			return nil, err
		}
		_, err = d.exec(id, c, "release", str(m, "key"), str(m, "token"))
		return nil, mapNo(err, "not_held")
	case "inspect":
		c, err := d.client(m)
		if err != nil {
			return nil, err
		}
		out, err := d.exec(id, c, "inspect", str(m, "key"), "--json")
		if err != nil {
			return nil, err
		}
		var info struct {
			Held      bool  `json:"held"`
			Waiters   int64 `json:"waiters"`
			LeaseLeft int64 `json:"lease_left_ms"`
		}
		if err := json.Unmarshal(out, &info); err != nil {
			return nil, fail("other", "inspect --json printed %q: %v", out, err)
		}
		return map[string]any{"held": info.Held, "waiters": info.Waiters, "lease_left_ms": info.LeaseLeft}, nil
	case "ping":
		c, err := d.client(m)
		if err != nil {
			return nil, err
		}
		_, err = d.exec(id, c, "ping")
		return nil, err
	case "with_lock":
		c, err := d.client(m)
		if err != nil {
			return nil, err
		}
		lease, err := durationArg(m, "lease_ms")
		if err != nil {
			return nil, err
		}
		var hold float64
		if err := json.Unmarshal(m["hold_ms"], &hold); err != nil {
			return nil, fail("invalid_argument", "hold_ms must be a number")
		}
		_, err = d.exec(id, c, "lock", str(m, "key"), "--lease", lease, "--",
			"sleep", strconv.FormatFloat(hold/1000, 'f', 3, 64))
		return nil, mapNo(err, "not_acquired")
	case "reset":
		d.reset()
		return nil, nil
	}
	return nil, fail("other", "the CLI has no %q (it offers no lock handles)", op)
}

// connect records the options and runs "ticketing ping" with them.
func (d *driver) connect(id int64, m map[string]json.RawMessage) (map[string]any, error) {
	var eps []string
	if err := json.Unmarshal(m["endpoints"], &eps); err != nil {
		return nil, fail("invalid_argument", "endpoints must be a list of host:port")
	}
	c := &client{name: str(m, "client"), running: map[*run]bool{}}
	c.flags = append(c.flags, "--addr", strings.Join(eps, ","))
	// The CLI's --timeout bounds connecting and each request; a dial timeout or a request
	// timeout given by the scenario becomes it (the smaller when both are given).
	var timeout int64
	for _, k := range []string{"request_timeout_ms", "dial_timeout_ms"} {
		if isNull(m, k) {
			continue
		}
		var v int64
		json.Unmarshal(m[k], &v)
		if timeout == 0 || v < timeout {
			timeout = v
		}
	}
	if timeout > 0 {
		c.flags = append(c.flags, "--timeout", fmt.Sprintf("%dms", timeout))
	}
	if !isNull(m, "tls") {
		var t map[string]string
		json.Unmarshal(m["tls"], &t)
		if t["ca"] != "" {
			c.flags = append(c.flags, "--tls-ca", t["ca"])
		} else {
			c.flags = append(c.flags, "--tls")
		}
		if t["cert"] != "" {
			c.flags = append(c.flags, "--tls-cert", t["cert"], "--tls-key", t["key"])
		}
	}
	if !isNull(m, "token") {
		c.env = append(c.env, "TICKETING_TOKEN="+str(m, "token"))
	}
	if _, err := d.exec(id, c, "ping"); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.cls[c.name] = c
	d.mu.Unlock()
	return map[string]any{"session_id": strings.Repeat("0", 32)}, nil
}

func (d *driver) acquire(id int64, op string, m map[string]json.RawMessage) (map[string]any, error) {
	c, err := d.client(m)
	if err != nil {
		return nil, err
	}
	lease, err := durationArg(m, "lease_ms")
	if err != nil {
		return nil, err
	}
	wait := "0"
	if op == "acquire" {
		wait = "forever"
		if !isNull(m, "wait_ms") {
			if wait, err = durationArg(m, "wait_ms"); err != nil {
				return nil, err
			}
		}
	}
	var leaseMs int64
	json.Unmarshal(m["lease_ms"], &leaseMs)
	out, err := d.exec(id, c, "acquire", str(m, "key"), "--lease", lease, "--wait", wait)
	if op == "try_acquire" {
		var ke *kindError
		if errors.As(err, &ke) && ke.Kind == "no" {
			return map[string]any{"acquired": false}, nil
		}
	}
	if err != nil {
		return nil, mapNo(err, "not_acquired")
	}
	tok := strings.TrimSpace(string(out))
	if _, perr := strconv.ParseUint(tok, 10, 64); perr != nil {
		return nil, fail("other", "acquire printed %q, not a token", out)
	}
	if op == "try_acquire" {
		return map[string]any{"acquired": true, "token": tok}, nil
	}
	return map[string]any{"token": tok, "lease_ms": leaseMs}, nil
}

// mapNo turns exit status 1 ("no") into the kind the command means by it.
func mapNo(err error, kind string) error {
	var ke *kindError
	if errors.As(err, &ke) && ke.Kind == "no" {
		return &kindError{Kind: kind, Message: ke.Message}
	}
	return err
}

// exec runs "ticketing COMMAND <client flags> ARGS..." and maps its exit status. Status 1
// comes back as kind "no" for the caller to name.
func (d *driver) exec(id int64, c *client, command string, args ...string) ([]byte, error) {
	argv := append(append([]string{command}, c.flags...), args...)
	if globalFlagsFirst {
		argv = append(append(append([]string(nil), c.flags...), command), args...)
	}
	cmd := exec.Command(d.bin, argv...)
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TICKETING_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, c.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	r := &run{cmd: cmd}
	d.mu.Lock()
	if c.closed {
		d.mu.Unlock()
		return nil, fail("closed", "client closed")
	}
	if err := cmd.Start(); err != nil {
		d.mu.Unlock()
		return nil, fail("other", "starting %s: %v", d.bin, err)
	}
	d.runs[id] = r
	c.running[r] = true
	d.mu.Unlock()
	start := time.Now()
	werr := cmd.Wait()
	d.mu.Lock()
	delete(d.runs, id)
	delete(c.running, r)
	interrupted, closed := r.interrupted, r.closed
	d.mu.Unlock()
	msg := lastLine(stderr.String())
	fmt.Fprintf(os.Stderr, "cli driver: ticketing %s -> %v in %v: %s\n", strings.Join(clipArgs(argv), " "), werr, time.Since(start).Round(time.Millisecond), msg)
	if werr == nil {
		return stdout.Bytes(), nil
	}
	var ee *exec.ExitError
	if !errors.As(werr, &ee) {
		return nil, fail("other", "%v", werr)
	}
	switch {
	case closed:
		return nil, fail("closed", "client closed (%s)", msg)
	case interrupted:
		return nil, fail("cancelled", "interrupted (%v): %s", werr, msg)
	}
	return nil, kindOf(ee.ExitCode(), msg)
}

// kindOf maps an exit status (and, for status 3, the message) to an error kind.
func kindOf(code int, msg string) *kindError {
	switch code {
	case 1:
		return fail("no", "%s", msg)
	case 2:
		return fail("invalid_argument", "%s", msg)
	case 4:
		return fail("auth_failed", "%s", msg)
	case 5:
		return fail("tls", "%s", msg)
	case 75:
		return &kindError{Kind: "lock_lost", Message: msg, Reason: "expired"}
	case 3:
		l := strings.ToLower(msg)
		for _, p := range []struct{ sub, kind string }{
			{"shutting down", "shutting_down"},
			{"restarted", "server_restarted"},
			{"connection lost", "connection_lost"},
			{"timeout", "timeout"},
			{"timed out", "timeout"},
			{"deadline exceeded", "timeout"},
			{"busy", "busy"},
			{"unsupported", "unsupported_version"},
		} {
			if strings.Contains(l, p.sub) {
				return fail(p.kind, "%s", msg)
			}
		}
		return fail("unavailable", "%s", msg)
	}
	return fail("other", "exit status %d: %s", code, msg)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func clipArgs(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if len(a) > 40 {
			a = a[:40] + fmt.Sprintf("...(%d bytes)", len(a))
		}
		out[i] = a
	}
	return out
}

// closeClient marks the client closed and interrupts its running commands (SIGINT: a waiting
// acquire withdraws, a lock stops its command and releases), then waits for them (SIGKILL
// after 5 s).
func (d *driver) closeClient(c *client) {
	d.mu.Lock()
	c.closed = true
	var runs []*run
	for r := range c.running {
		r.closed = true
		runs = append(runs, r)
	}
	d.mu.Unlock()
	for _, r := range runs {
		r.cmd.Process.Signal(syscall.SIGINT)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.mu.Lock()
		n := len(c.running)
		d.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, r := range runs {
				r.cmd.Process.Kill()
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (d *driver) reset() {
	d.mu.Lock()
	cls := d.cls
	d.cls = map[string]*client{}
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range cls {
		wg.Add(1)
		go func() { defer wg.Done(); d.closeClient(c) }()
	}
	wg.Wait()
}
