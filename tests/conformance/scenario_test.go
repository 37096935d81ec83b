package conformance

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/wire"
)

// prompt is SCENARIOS.md's "promptly".
const prompt = 2 * time.Second

// scenarioTimeout bounds one scenario; every wait inside is bounded more tightly.
const scenarioTimeout = 90 * time.Second

// scenario is one entry of SCENARIOS.md.
type scenario struct {
	name  string
	needs []string // driver features (DRIVER.md); a driver without one of them: n/a
	// single: the scenario relies on single-node rules and has no cluster variant: n/a on other
	// targets.
	single bool
	// clusterOnly: the scenario needs a cluster (a leader to lose): n/a on a single node.
	clusterOnly bool
	// cluster: the scenario's variant on a cluster target (SCENARIOS.md, "On a cluster"); nil:
	// run runs there too.
	cluster func(s *S)
	// exclusive: timing-sensitive; runs while no other scenario runs.
	exclusive bool
	cross     bool // uses every driver at once (run once, after the per-driver scenarios)
	run       func(s *S)
}

// runEnv is what every scenario of a run shares.
type runEnv struct {
	bin       string
	certs     *testserver.TLSFiles
	newTarget targetFactory
	kind      string // the target kind newTarget makes
}

// stepLog is a scenario's step log: the runner's steps, every driver command, reply and event,
// and R's requests, with the time since the scenario started.
type stepLog struct {
	mu      sync.Mutex
	start   time.Time
	lines   []string
	dropped int
}

const maxLogLines = 3000

func newStepLog() *stepLog { return &stepLog{start: time.Now()} }

func (l *stepLog) add(at time.Time, format string, args ...any) {
	l.addLine(at, false, format, args...)
}

// addLine adds a line; a forced line (a failure) is kept even when the log is full.
func (l *stepLog) addLine(at time.Time, force bool, format string, args ...any) {
	line := fmt.Sprintf("%8.3fs  ", at.Sub(l.start).Seconds()) + fmt.Sprintf(format, args...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) >= maxLogLines && !force {
		l.dropped++
		return
	}
	l.lines = append(l.lines, line)
}

func (l *stepLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.Join(l.lines, "\n")
	if l.dropped > 0 {
		s += fmt.Sprintf("\n... %d more lines dropped", l.dropped)
	}
	return s
}

// S is one scenario run against one driver (or, for a cross scenario, several).
type S struct {
	name    string
	env     *runEnv
	d       *driver   // the driver under test
	drivers []*driver // cross scenarios: every participant
	log     *stepLog
	start   time.Time

	mu       sync.Mutex
	failures []string
	cleanups []func()
	targets  []*target
	proxies  []*testserver.Proxy
	nKeys    int
}

func newS(name string, env *runEnv, drivers ...*driver) *S {
	s := &S{name: name, env: env, drivers: drivers, log: newStepLog()}
	s.start = s.log.start
	if len(drivers) == 1 {
		s.d = drivers[0]
	}
	return s
}

// outcome runs the scenario body in its own goroutine (Fatalf ends it) and then the cleanups.
func (s *S) execute(body func(*S)) {
	for _, d := range s.drivers {
		d.setLog(s.log)
		d.forgetEvents()
		d.takeProtocolErrors()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				s.fail("panic: %v", r)
			}
		}()
		body(s)
	}()
	select {
	case <-done:
	case <-time.After(scenarioTimeout):
		s.fail("scenario did not finish within %v", scenarioTimeout)
		<-done // every wait inside is bounded: it ends
	}
	s.finish()
}

func (s *S) finish() {
	// Every driver goes back to a clean state: clients closed, handles forgotten.
	for _, d := range s.drivers {
		if !d.alive() {
			s.fail("driver %s exited (%v)", d.name, d.waitEr)
			continue
		}
		c := d.send("reset", nil)
		if err := c.wait(replyTimeout); err != nil {
			s.fail("reset: %v", err)
		} else if !c.reply.OK {
			s.fail("reset failed: %s", c.reply.raw)
		}
		for _, e := range d.takeProtocolErrors() {
			s.fail("driver %s broke the protocol: %s", d.name, e)
		}
	}
	s.mu.Lock()
	cleanups := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	for _, d := range s.drivers {
		d.setLog(nil)
	}
}

// Step records a step of the scenario.
func (s *S) Step(format string, args ...any) { s.log.add(time.Now(), "-- "+format, args...) }

func (s *S) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.log.addLine(time.Now(), true, "FAIL: %s", msg)
	s.mu.Lock()
	s.failures = append(s.failures, msg)
	s.mu.Unlock()
}

// Errorf records a failure and goes on.
func (s *S) Errorf(format string, args ...any) { s.fail(format, args...) }

// Fatalf records a failure and ends the scenario (the goroutine running it).
func (s *S) Fatalf(format string, args ...any) {
	s.fail(format, args...)
	runtime.Goexit()
}

func (s *S) failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.failures) > 0
}

func (s *S) cleanup(f func()) {
	s.mu.Lock()
	s.cleanups = append(s.cleanups, f)
	s.mu.Unlock()
}

// since is the time since the scenario started, for messages.
func (s *S) since() string { return fmt.Sprintf("%.3fs", time.Since(s.start).Seconds()) }

// ---- servers ----

// target is a started Target with the configuration it was started with.
type target struct {
	Target
	s   *S
	cfg targetConfig
}

// server starts a target for this scenario, stopped when the scenario ends.
func (s *S) server(cfg targetConfig) *target {
	t, err := s.env.newTarget(cfg)
	if err != nil {
		s.Fatalf("starting the server: %v", err)
	}
	tg := &target{Target: t, s: s, cfg: cfg}
	s.mu.Lock()
	s.targets = append(s.targets, tg)
	s.mu.Unlock()
	s.cleanup(t.Close)
	s.Step("server started (%s) at %v token=%v tls=%v mtls=%v", t.Kind(), t.Endpoints(), cfg.Token != "", cfg.TLS, cfg.ClientCA)
	return tg
}

// unplannedElections counts the leader changes the runner did not cause in the scenario's
// cluster targets (0 on one node).
func (s *S) unplannedElections() int {
	s.mu.Lock()
	ts := append([]*target(nil), s.targets...)
	s.mu.Unlock()
	n := 0
	for _, t := range ts {
		if c, ok := t.Target.(*clusterTarget); ok {
			n += c.UnplannedElections()
		}
	}
	return n
}

// serverLogs returns the logs of the scenario's servers, for failure reports.
func (s *S) serverLogs() string {
	s.mu.Lock()
	ts := append([]*target(nil), s.targets...)
	s.mu.Unlock()
	var b strings.Builder
	for _, t := range ts {
		fmt.Fprintf(&b, "server %v:\n%s", t.Endpoints(), t.Log())
	}
	return b.String()
}

// rawOptions are the options R needs for this target.
func (t *target) rawOptions() rawOptions {
	o := rawOptions{Token: t.cfg.Token}
	if t.cfg.TLS {
		pool := x509.NewCertPool()
		pem, err := os.ReadFile(t.s.env.certs.CA)
		if err != nil {
			t.s.Fatalf("reading the test CA: %v", err)
		}
		pool.AppendCertsFromPEM(pem)
		cfg := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
		if t.cfg.ClientCA {
			cert, err := tls.LoadX509KeyPair(t.s.env.certs.ClientCert, t.s.env.certs.ClientKey)
			if err != nil {
				t.s.Fatalf("loading the client certificate: %v", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		o.TLS = cfg
	}
	return o
}

// R opens a new observer connection to the target, closed when the scenario ends. It tries
// the endpoints in order and follows a NOT_LEADER hint (a cluster's follower); on a cluster it
// tries again for up to 10 s (an election may be under way), and R follows the leader from then
// on (rawClient.redial).
func (t *target) R() *rawClient {
	s := t.s
	logf := func(format string, args ...any) { s.log.add(time.Now(), format, args...) }
	o := t.rawOptions()
	var errs []string
	deadline := time.Now().Add(10 * time.Second)
	for round := 0; ; round++ {
		conn, addr, err := t.dialLeader(o)
		if err == nil {
			if eps := t.Endpoints(); round > 0 || addr != eps[0] {
				s.log.add(time.Now(), "R connected to %s (round %d)", addr, round+1)
			}
			var redial func([wire.SessionIDSize]byte) (*rawConn, error)
			if s.onCluster() {
				redial = func(session [wire.SessionIDSize]byte) (*rawConn, error) {
					o := o
					o.Session = &session
					conn, _, err := t.dialLeader(o)
					return conn, err
				}
			}
			r := newRawClientOn(conn, logf, redial)
			s.cleanup(r.close)
			return r
		}
		errs = append(errs[:0], err.Error())
		if !s.onCluster() || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.Fatalf("R: cannot connect: %s", strings.Join(errs, "; "))
	return nil
}

// dialLeader tries the target's endpoints once each, following NOT_LEADER hints, and returns
// the first connection whose handshake succeeds.
func (t *target) dialLeader(o rawOptions) (*rawConn, string, error) {
	var errs []string
	tried := map[string]bool{}
	queue := t.Endpoints()
	for len(queue) > 0 && len(tried) < 10 {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		conn, err := dialRaw(addr, o)
		if err == nil {
			return conn, addr, nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", addr, err))
		var he *handshakeError
		if errors.As(err, &he) && he.Status == wire.StatusNotLeader && he.Msg != "" {
			queue = append([]string{he.Msg}, queue...)
		}
	}
	return nil, "", errors.New(strings.Join(errs, "; "))
}

// onCluster reports whether the scenario runs against a cluster target.
func (s *S) onCluster() bool { return s.env.kind != "single" }

// leader is the client address of the node that serves now (on a single node, the node).
func (t *target) leader() string {
	addr, err := t.Leader()
	if err != nil {
		t.s.Fatalf("%v", err)
	}
	return addr
}

// others are the target's endpoints other than addr, in order.
func (t *target) others(addr string) []string {
	var out []string
	for _, ep := range t.Endpoints() {
		if ep != addr {
			out = append(out, ep)
		}
	}
	return out
}

// minLease is max(d, the target's minimum lease): the lease a scenario uses where it wants a
// short one.
func (t *target) minLease(d time.Duration) time.Duration { return max(d, t.MinLease()) }

// kill is Target.Kill, failing the scenario on error.
func (t *target) kill() {
	if err := t.Kill(); err != nil {
		t.s.Fatalf("kill: %v", err)
	}
}

// tlsArg is DRIVER.md's connect "tls" argument for this target, or nil.
func (t *target) tlsArg(clientCert bool) map[string]any {
	if !t.cfg.TLS {
		return nil
	}
	m := map[string]any{"ca": t.s.env.certs.CA, "server_name": "localhost"}
	if clientCert {
		m["cert"], m["key"] = t.s.env.certs.ClientCert, t.s.env.certs.ClientKey
	}
	return m
}

// ---- R helpers ----

// inspect is R's INSPECT, failing the scenario on error.
func (s *S) inspect(r *rawClient, key string) inspection {
	in, err := r.inspect(key, 0)
	if err != nil {
		s.Fatalf("%v", err)
	}
	return in
}

// expectInspect checks an INSPECT now and logs it.
func (s *S) expectInspect(r *rawClient, key string, held bool, waiters uint32) {
	in := s.inspect(r, key)
	s.log.add(time.Now(), "R INSPECT %q: %s", key, in)
	if in.held() != held || in.Waiters != waiters {
		s.Fatalf("INSPECT %q: got %s; want held=%v waiters=%d", key, in, held, waiters)
	}
}

// eventually polls cond every 10 ms until it holds, and fails the scenario after within.
func (s *S) eventually(within time.Duration, what string, cond func() (bool, string)) {
	deadline := time.Now().Add(within)
	var last string
	for {
		ok, detail := cond()
		if ok {
			return
		}
		last = detail
		if time.Now().After(deadline) {
			s.Fatalf("%s: not within %v (last: %s)", what, within, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitInspect polls R's INSPECT of key until it shows held and waiters as given.
func (s *S) waitInspect(r *rawClient, key string, held bool, waiters uint32, within time.Duration) inspection {
	var got inspection
	s.eventually(within, fmt.Sprintf("INSPECT %q held=%v waiters=%d", key, held, waiters), func() (bool, string) {
		got = s.inspect(r, key)
		return got.held() == held && got.Waiters == waiters, got.String()
	})
	s.log.add(time.Now(), "R INSPECT %q: %s", key, got)
	return got
}

// rAcquire makes R take key at once.
func (s *S) rAcquire(r *rawClient, key string, lease time.Duration) uint64 {
	resp, err := r.acquire(key, lease, 0)
	if err != nil {
		s.Fatalf("%v", err)
	}
	if resp.Status != wire.StatusOK || resp.Token == 0 {
		s.Fatalf("R could not take %q: %s", key, describeFrame(resp))
	}
	return resp.Token
}

func (s *S) rRelease(r *rawClient, key string, token uint64) {
	resp, err := r.release(key, token)
	if err != nil {
		s.Fatalf("%v", err)
	}
	if resp.Status != wire.StatusOK {
		s.Fatalf("R could not release %q token %d: %s", key, token, describeFrame(resp))
	}
}

// probeToken returns the token the server's counter is at: R takes and releases a key of its
// own, so the next grant gets a token above the one returned.
func (s *S) probeToken(r *rawClient) uint64 {
	s.nKeys++
	key := fmt.Sprintf("probe-%d", s.nKeys)
	tok := s.rAcquire(r, key, 10*time.Second)
	s.rRelease(r, key, tok)
	return tok
}

// holderToken finds the token holding key by INSPECT with candidate tokens after "after" (the
// server shows a holder's token only to a request that carries it): TOKEN_MATCH.
func (s *S) holderToken(r *rawClient, key string, after uint64) uint64 {
	for tok := after + 1; tok <= after+50; tok++ {
		in, err := r.inspect(key, tok)
		if err != nil {
			s.Fatalf("%v", err)
		}
		if !in.held() {
			s.Fatalf("INSPECT %q: not held while looking for its token", key)
		}
		if in.tokenMatch() {
			if in.Token != tok {
				s.Errorf("INSPECT %q with token %d: TOKEN_MATCH but token field %d", key, tok, in.Token)
			}
			s.log.add(time.Now(), "R INSPECT %q token %d: TOKEN_MATCH (%s)", key, tok, in)
			return tok
		}
	}
	s.Fatalf("INSPECT %q: no token in %d..%d matches its holder", key, after+1, after+50)
	return 0
}

// ---- driver clients ----

// client is a client created by connect in a driver.
type client struct {
	s       *S
	d       *driver
	name    string
	session string
}

// connectOpts are connect's arguments; zero durations are null (the client's default).
type connectOpts struct {
	endpoints      []string
	token          string // "" = null
	tls            map[string]any
	requestTimeout time.Duration
	heartbeat      time.Duration
	dialTimeout    time.Duration
}

func nullMs(d time.Duration) any {
	if d == 0 {
		return nil
	}
	return d.Milliseconds()
}

// connectCall sends connect and returns the call with the new client (valid if it succeeds).
func (s *S) connectCall(d *driver, o connectOpts) (*call, *client) {
	name := d.uniqueName("c")
	args := map[string]any{"client": name, "endpoints": o.endpoints, "token": nil, "tls": nil,
		"request_timeout_ms": nullMs(o.requestTimeout), "heartbeat_ms": nullMs(o.heartbeat), "dial_timeout_ms": nullMs(o.dialTimeout)}
	if o.token != "" {
		args["token"] = o.token
	}
	if o.tls != nil {
		args["tls"] = o.tls
	}
	return d.send("connect", args), &client{s: s, d: d, name: name}
}

// connect connects a client of d to the target (a proxy address when given).
func (s *S) connect(d *driver, t *target, o connectOpts) *client {
	if o.endpoints == nil {
		o.endpoints = t.Endpoints()
	}
	if o.token == "" {
		o.token = t.cfg.Token
	}
	if o.tls == nil {
		o.tls = t.tlsArg(t.cfg.ClientCA)
	}
	c, cl := s.connectCall(d, o)
	r := s.ok(c, replyTimeout, "connect")
	_ = r.decode("session_id", &cl.session)
	return cl
}

// ok waits for a successful reply within the bound.
func (s *S) ok(c *call, within time.Duration, what string) reply {
	if err := c.wait(within); err != nil {
		s.Fatalf("%s: %v", what, err)
	}
	if !c.reply.OK {
		s.Fatalf("%s: failed %s; want success", what, c.reply.Error)
	}
	return c.reply
}

// fails waits for a failed reply within the bound, with one of the kinds.
func (s *S) fails(c *call, within time.Duration, what string, kinds ...string) *driverError {
	if err := c.wait(within); err != nil {
		s.Fatalf("%s: %v; want failure %s", what, err, strings.Join(kinds, " or "))
	}
	if c.reply.OK {
		s.Fatalf("%s: succeeded (%s); want failure %s", what, clip(c.reply.raw, 200), strings.Join(kinds, " or "))
	}
	for _, k := range kinds {
		if c.reply.Error.Kind == k {
			return c.reply.Error
		}
	}
	s.Fatalf("%s: failed %s; want %s", what, c.reply.Error, strings.Join(kinds, " or "))
	return nil
}

// acquireArgs are acquire's optional arguments.
type acquireArgs struct {
	wait       *time.Duration // nil: without limit
	keepalive  bool
	refuseHeld bool
}

func waitFor(d time.Duration) *time.Duration { return &d }

// acquire sends acquire and returns the call and the handle name.
func (c *client) acquire(key string, lease time.Duration, a acquireArgs) (*call, string) {
	lock := c.d.uniqueName("l")
	args := map[string]any{"client": c.name, "key": key, "lease_ms": lease.Milliseconds(), "wait_ms": nil,
		"keepalive": a.keepalive, "lock": lock}
	if a.wait != nil {
		args["wait_ms"] = a.wait.Milliseconds()
	}
	if a.refuseHeld {
		args["refuse_held"] = true
	}
	return c.d.send("acquire", args), lock
}

// acquireRaw sends acquire with raw argument values (bad_arguments).
func (c *client) acquireRaw(args map[string]any) (*call, string) {
	lock := c.d.uniqueName("l")
	m := map[string]any{"client": c.name, "keepalive": false, "lock": lock, "wait_ms": nil}
	for k, v := range args {
		m[k] = v
	}
	return c.d.send("acquire", m), lock
}

// held is a lock a client acquired: its handle name and token.
type held struct {
	c     *client
	lock  string
	token uint64
	lease int64
}

// mustAcquire acquires a free (or soon free) key and returns the lock.
func (c *client) mustAcquire(key string, lease time.Duration, a acquireArgs, within time.Duration) held {
	call, lock := c.acquire(key, lease, a)
	return c.s.granted(c, call, lock, within, "acquire "+key)
}

// granted waits for an acquire's success and reads its token.
func (s *S) granted(c *client, call *call, lock string, within time.Duration, what string) held {
	r := s.ok(call, within, what)
	tok, err := r.token("token")
	if err != nil {
		s.Fatalf("%s: %v", what, err)
	}
	if tok == 0 {
		s.Fatalf("%s: token 0", what)
	}
	h := held{c: c, lock: lock, token: tok}
	_ = r.decode("lease_ms", &h.lease)
	return h
}

func (c *client) tryAcquire(key string, lease time.Duration) (*call, string) {
	lock := c.d.uniqueName("l")
	return c.d.send("try_acquire", map[string]any{"client": c.name, "key": key, "lease_ms": lease.Milliseconds(), "lock": lock}), lock
}

func (c *client) releaseToken(key string, token any) *call {
	if t, ok := token.(uint64); ok {
		token = fmt.Sprint(t)
	}
	return c.d.send("release_token", map[string]any{"client": c.name, "key": key, "token": token})
}

func (c *client) inspectCall(key string) *call {
	return c.d.send("inspect", map[string]any{"client": c.name, "key": key})
}

func (c *client) ping() *call { return c.d.send("ping", map[string]any{"client": c.name}) }

func (c *client) close() *call { return c.d.send("close", map[string]any{"client": c.name}) }

func (c *client) withLock(key string, lease, hold time.Duration) *call {
	return c.d.send("with_lock", map[string]any{"client": c.name, "key": key, "lease_ms": lease.Milliseconds(), "hold_ms": hold.Milliseconds()})
}

func (h held) release() *call { return h.c.d.send("release", map[string]any{"lock": h.lock}) }

func (h held) extend(lease time.Duration) *call {
	return h.c.d.send("extend", map[string]any{"lock": h.lock, "lease_ms": lease.Milliseconds()})
}

func (h held) state() *call  { return h.c.d.send("lock_state", map[string]any{"lock": h.lock}) }
func (h held) verify() *call { return h.c.d.send("verify", map[string]any{"lock": h.lock}) }

// releaseAny releases a lock through its handle, or by token for a driver without handles.
func (s *S) releaseAny(h held, key string, within time.Duration) {
	if h.c.d.features["locks"] {
		s.ok(h.release(), within, "release "+h.lock)
		return
	}
	s.ok(h.c.releaseToken(key, h.token), within, "release_token "+key)
}

// expectNotLost checks lock_state (not lost) and that no lost event came for the lock.
func (s *S) expectNotLost(h held) {
	if !h.c.d.features["locks"] {
		return
	}
	r := s.ok(h.state(), prompt, "lock_state "+h.lock)
	var lost bool
	if err := r.decode("lost", &lost); err != nil {
		s.Fatalf("lock_state: %v", err)
	}
	if lost {
		var reason string
		_ = r.decode("reason", &reason)
		s.Fatalf("lock_state %s: lost (reason %q); want not lost", h.lock, reason)
	}
	s.expectNoEvent(h)
}

// expectNoEvent checks that no lost event came for the lock so far (drivers with lost_events).
func (s *S) expectNoEvent(h held) {
	if !h.c.d.features["lost_events"] {
		return
	}
	if evs := h.c.d.eventsFor(h.lock); len(evs) > 0 {
		s.Fatalf("unexpected lost event for %s: reason %q at %v", h.lock, evs[0].Reason, evs[0].at.Sub(s.start))
	}
}

// expectLostEvent waits for the lock's lost event with the reason; it must be the only one.
func (s *S) expectLostEvent(h held, reason string, within time.Duration) event {
	ev, ok := h.c.d.waitEvent(h.lock, within)
	if !ok {
		s.Fatalf("no lost event for %s within %v; want reason %q", h.lock, within, reason)
	}
	if ev.Event != "lost" || ev.Reason != reason {
		s.Fatalf("event for %s: %q reason %q; want lost reason %q", h.lock, ev.Event, ev.Reason, reason)
	}
	return ev
}

// expectSingleEvent checks that the lock got exactly one event.
func (s *S) expectSingleEvent(h held) {
	if evs := h.c.d.eventsFor(h.lock); len(evs) != 1 {
		s.Fatalf("%s got %d events; want exactly one lost event", h.lock, len(evs))
	}
}

// lockLost checks a failure of kind lock_lost with the reason.
func (s *S) lockLost(c *call, within time.Duration, what, reason string) {
	e := s.fails(c, within, what, "lock_lost")
	if e.Reason != reason {
		s.Fatalf("%s: lock_lost with reason %q; want %q", what, e.Reason, reason)
	}
}

// observe waits out a window in which nothing must happen (an observation, not a
// synchronisation: the check is that nothing came in that time).
func observe(d time.Duration) { time.Sleep(d) }
