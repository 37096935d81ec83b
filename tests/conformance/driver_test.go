package conformance

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// helloTimeout bounds a driver's start: process start, runtime start-up (a JVM, Mono) and the
// answer to hello, on a loaded 2-core machine.
const helloTimeout = 90 * time.Second

// replyTimeout is how long the runner waits for a reply when a scenario states no bound.
const replyTimeout = 15 * time.Second

// driver is one running conformance driver process (DRIVER.md).
type driver struct {
	name string
	argv []string

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
	exitAt time.Time
	waitEr error

	wmu sync.Mutex // one line at a time on stdin

	mu        sync.Mutex
	nextID    int64
	names     int // clients and locks are named uniquely for the driver's lifetime
	pending   map[int64]*call
	events    []event
	changed   chan struct{} // closed and replaced whenever an event arrives
	seq       int64         // order of the lines read from stdout
	stderr    []logLine
	protoErrs []string // lines that broke the protocol, since the last takeProtocolErrors
	log       *stepLog // the running scenario's log, or nil

	language, version string
	features          map[string]bool
}

type logLine struct {
	at   time.Time
	text string
}

// call is one command sent to a driver.
type call struct {
	d    *driver
	id   int64
	op   string
	sent time.Time
	done chan struct{}

	// Set once done is closed:
	at    time.Time // when the reply was read
	seq   int64     // its place among the driver's stdout lines
	reply reply
	err   error // the driver exited or wrote a malformed reply; no reply
}

// reply is a driver's answer to a command.
type reply struct {
	OK     bool
	Error  *driverError
	fields map[string]json.RawMessage
	raw    string
}

// driverError is a reply's "error" object.
type driverError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
}

func (e *driverError) String() string {
	s := e.Kind
	if e.Reason != "" {
		s += " (reason " + e.Reason + ")"
	}
	return s + ": " + strconv.Quote(e.Message)
}

// event is an unsolicited line from a driver.
type event struct {
	Event  string `json:"event"`
	Lock   string `json:"lock"`
	Reason string `json:"reason"`
	at     time.Time
	seq    int64
}

// startDriver starts the driver and waits for its answer to hello.
func startDriver(name string, argv []string, env []string) (*driver, error) {
	d := &driver{name: name, argv: argv, pending: map[int64]*call{}, changed: make(chan struct{}), exited: make(chan struct{})}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = repoRoot()
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its own group: the runner's signals stay the runner's
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("driver %s: %v", name, err)
	}
	d.cmd, d.stdin = cmd, stdin
	var readers sync.WaitGroup
	readers.Add(2)
	go func() { defer readers.Done(); d.readStdout(stdout) }()
	go func() { defer readers.Done(); d.readStderr(stderr) }()
	go func() {
		readers.Wait()
		d.waitEr = cmd.Wait()
		d.mu.Lock()
		d.exitAt = time.Now()
		pending := d.pending
		d.pending = map[int64]*call{}
		d.mu.Unlock()
		for _, c := range pending {
			c.finish(reply{}, fmt.Errorf("driver %s exited (%v) before replying", name, d.waitEr))
		}
		close(d.exited)
	}()
	c := d.send("hello", nil)
	if err := c.wait(helloTimeout); err != nil {
		d.kill()
		return nil, fmt.Errorf("driver %s: hello: %v\nstderr:\n%s", name, err, d.stderrSince(time.Time{}, 40))
	}
	if !c.reply.OK {
		d.kill()
		return nil, fmt.Errorf("driver %s: hello failed: %s", name, c.reply.raw)
	}
	var feats []string
	if err := c.reply.decode("features", &feats); err != nil {
		d.kill()
		return nil, fmt.Errorf("driver %s: hello: %v", name, err)
	}
	d.features = map[string]bool{}
	for _, f := range feats {
		d.features[f] = true
	}
	_ = c.reply.decode("language", &d.language)
	_ = c.reply.decode("client_version", &d.version)
	if errs := d.takeProtocolErrors(); len(errs) > 0 {
		d.kill()
		return nil, fmt.Errorf("driver %s broke the protocol while starting:\n%s", name, strings.Join(errs, "\n"))
	}
	return d, nil
}

func (d *driver) readStdout(r io.Reader) {
	br := bufio.NewReaderSize(r, 1<<16)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			d.handleLine(bytes.TrimSpace(line))
		}
		if err != nil {
			return
		}
	}
}

func (d *driver) handleLine(line []byte) {
	now := time.Now()
	var m map[string]json.RawMessage
	d.mu.Lock()
	d.seq++
	seq := d.seq
	log := d.log
	d.mu.Unlock()
	if err := json.Unmarshal(line, &m); err != nil {
		d.protocolError("not a JSON object: %s", clip(string(line), 300))
		return
	}
	if _, isEvent := m["event"]; isEvent {
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			d.protocolError("bad event %s: %v", clip(string(line), 300), err)
			return
		}
		ev.at, ev.seq = now, seq
		if log != nil {
			log.add(now, "%s event %s", d.name, clip(string(line), 300))
		}
		d.mu.Lock()
		d.events = append(d.events, ev)
		close(d.changed)
		d.changed = make(chan struct{})
		d.mu.Unlock()
		return
	}
	var id int64
	if err := json.Unmarshal(m["id"], &id); err != nil || id <= 0 {
		d.protocolError("line without a valid id: %s", clip(string(line), 300))
		return
	}
	rep := reply{fields: m, raw: string(line)}
	if err := json.Unmarshal(m["ok"], &rep.OK); err != nil {
		d.protocolError("reply without a boolean ok: %s", clip(string(line), 300))
		return
	}
	if !rep.OK {
		rep.Error = &driverError{}
		if err := json.Unmarshal(m["error"], rep.Error); err != nil || rep.Error.Kind == "" {
			d.protocolError("failed reply without an error kind: %s", clip(string(line), 300))
			rep.Error.Kind = "other"
		}
	}
	d.mu.Lock()
	c := d.pending[id]
	delete(d.pending, id)
	d.mu.Unlock()
	if c == nil {
		d.protocolError("reply to an unknown or already answered id %d: %s", id, clip(string(line), 300))
		return
	}
	if log != nil {
		log.add(now, "%s #%d %s <- %s (%s)", d.name, id, c.op, clip(string(line), 400), ms(now.Sub(c.sent)))
	}
	c.at, c.seq = now, seq
	c.finish(rep, nil)
}

func (c *call) finish(r reply, err error) {
	c.reply, c.err = r, err
	close(c.done)
}

func (d *driver) protocolError(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	d.mu.Lock()
	d.protoErrs = append(d.protoErrs, msg)
	log := d.log
	d.mu.Unlock()
	if log != nil {
		log.add(time.Now(), "%s PROTOCOL ERROR: %s", d.name, msg)
	}
}

// takeProtocolErrors returns and forgets the protocol errors seen so far.
func (d *driver) takeProtocolErrors() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	errs := d.protoErrs
	d.protoErrs = nil
	return errs
}

const maxStderrLines = 20000

func (d *driver) readStderr(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		d.mu.Lock()
		if len(d.stderr) >= maxStderrLines {
			d.stderr = append(d.stderr[:0], d.stderr[maxStderrLines/2:]...)
		}
		d.stderr = append(d.stderr, logLine{time.Now(), sc.Text()})
		d.mu.Unlock()
	}
}

// stderrSince returns the last n lines (all when n is 0) the driver wrote to stderr at or
// after t (all of them when t is zero).
func (d *driver) stderrSince(t time.Time, n int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var lines []string
	for _, l := range d.stderr {
		if !l.at.Before(t) {
			lines = append(lines, l.text)
		}
	}
	if n > 0 && len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines before)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// send writes one command; args may be nil. The reply comes through the returned call.
func (d *driver) send(op string, args map[string]any) *call {
	d.mu.Lock()
	d.nextID++
	c := &call{d: d, id: d.nextID, op: op, done: make(chan struct{})}
	d.pending[c.id] = c
	log := d.log
	d.mu.Unlock()
	m := map[string]any{}
	for k, v := range args {
		m[k] = v
	}
	m["id"], m["op"] = c.id, op
	line, err := json.Marshal(m)
	if err != nil {
		panic(err) // the runner's own arguments
	}
	d.wmu.Lock()
	c.sent = time.Now()
	if log != nil {
		log.add(c.sent, "%s #%d %s -> %s", d.name, c.id, op, clip(string(line), 400))
	}
	_, werr := d.stdin.Write(append(line, '\n'))
	d.wmu.Unlock()
	if werr != nil {
		d.mu.Lock()
		_, still := d.pending[c.id]
		delete(d.pending, c.id)
		d.mu.Unlock()
		if still {
			c.finish(reply{}, fmt.Errorf("driver %s: writing %s: %v", d.name, op, werr))
		}
	}
	return c
}

// uniqueName returns a new client or lock name, never used before in this driver (so that a late
// event about a lock of an earlier scenario cannot be taken for one of this scenario's).
func (d *driver) uniqueName(prefix string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.names++
	return fmt.Sprintf("%s%d", prefix, d.names)
}

// wait waits up to timeout for the reply.
func (c *call) wait(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.done:
		return c.err
	case <-t.C:
		return fmt.Errorf("driver %s: no reply to #%d %s within %v", c.d.name, c.id, c.op, timeout)
	}
}

// isDone reports whether the reply (or a failure) has arrived.
func (c *call) isDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// elapsed is the time from sending the command to reading its reply.
func (c *call) elapsed() time.Duration { return c.at.Sub(c.sent) }

func (r reply) has(field string) bool { _, ok := r.fields[field]; return ok }

func (r reply) decode(field string, v any) error {
	raw, ok := r.fields[field]
	if !ok {
		return fmt.Errorf("reply has no %q: %s", field, clip(r.raw, 300))
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("reply field %q: %v: %s", field, err, clip(r.raw, 300))
	}
	return nil
}

// token reads a 64-bit token, which DRIVER.md requires as a decimal string.
func (r reply) token(field string) (uint64, error) {
	var s string
	if err := r.decode(field, &s); err != nil {
		return 0, fmt.Errorf("%v (tokens are decimal strings)", err)
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reply field %q: %q is not a decimal 64-bit token", field, s)
	}
	return v, nil
}

// eventsFor returns the events about lock, in order.
func (d *driver) eventsFor(lock string) []event {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []event
	for _, e := range d.events {
		if e.Lock == lock {
			out = append(out, e)
		}
	}
	return out
}

// waitEvent waits up to timeout for an event about lock and returns the first one.
func (d *driver) waitEvent(lock string, timeout time.Duration) (event, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		d.mu.Lock()
		ch := d.changed
		for _, e := range d.events {
			if e.Lock == lock {
				d.mu.Unlock()
				return e, true
			}
		}
		d.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			return event{}, false
		case <-d.exited:
			return event{}, false
		}
	}
}

// allEvents returns every event received so far.
func (d *driver) allEvents() []event {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]event(nil), d.events...)
}

func (d *driver) forgetEvents() {
	d.mu.Lock()
	d.events = nil
	d.mu.Unlock()
}

func (d *driver) setLog(l *stepLog) {
	d.mu.Lock()
	d.log = l
	d.mu.Unlock()
}

func (d *driver) alive() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

func (d *driver) hasAll(features []string) (missing []string) {
	for _, f := range features {
		if !d.features[f] {
			missing = append(missing, f)
		}
	}
	sort.Strings(missing)
	return missing
}

// stop asks the driver to exit, then closes its stdin, then kills its process group.
func (d *driver) stop() {
	if !d.alive() {
		return
	}
	d.send("exit", nil)
	select {
	case <-d.exited:
		return
	case <-time.After(5 * time.Second):
	}
	d.stdin.Close()
	select {
	case <-d.exited:
		return
	case <-time.After(5 * time.Second):
	}
	d.kill()
}

// kill ends the driver's process group (the driver and whatever it started) by its id.
func (d *driver) kill() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
	}
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("...(%d bytes)", len(s))
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

// driverEnv is the environment of a driver: the runner's, without TICKETING_* settings that
// would change a client's defaults, plus TICKETING_BIN and TICKETING_CONFORMANCE=1.
func driverEnv(bin string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TICKETING_") && !strings.HasPrefix(kv, "TICKETING_CONFORMANCE_") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "TICKETING_BIN="+bin, "TICKETING_CONFORMANCE=1")
	return append(env, extra...)
}
