package conformance

import (
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/wire"
)

// proxies is one proxy per endpoint of a target; a client given addrs() reaches the target
// only through them.
type proxies []*testserver.Proxy

// proxy starts a proxy to each of the target's endpoints, closed when the scenario ends. On a
// cluster it proxies the leader only: a follower's leader hint names the leader's own address,
// which would take the client around the proxy.
func (s *S) proxy(t *target) proxies {
	if s.onCluster() {
		return s.proxyTo(t.leader())
	}
	return s.proxyTo(t.Endpoints()...)
}

// proxyTo starts a proxy to each address, closed when the scenario ends.
func (s *S) proxyTo(addrs ...string) proxies {
	var ps proxies
	for _, ep := range addrs {
		p, err := testserver.StartProxy(ep)
		if err != nil {
			s.Fatalf("%v", err)
		}
		s.cleanup(p.Close)
		ps = append(ps, p)
		s.mu.Lock()
		s.proxies = append(s.proxies, p)
		s.mu.Unlock()
	}
	return ps
}

// notLeader makes every proxy answer new connections CHALLENGE NOT_LEADER without a hint (a
// cluster electing a leader), or relay them again.
func (ps proxies) notLeader(on bool) {
	for _, p := range ps {
		p.NotLeader(on)
	}
}

func (ps proxies) notLeaderAnswers() int {
	n := 0
	for _, p := range ps {
		n += p.NotLeaderAnswers()
	}
	return n
}

// refuse makes every proxy reset new connections at once (a node that is down).
func (ps proxies) refuse(on bool) {
	for _, p := range ps {
		p.Refuse(on)
	}
}

func (ps proxies) addrs() []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Addr)
	}
	return out
}

// open returns the relayed connections still open, on every proxy.
func (ps proxies) open() []*testserver.ProxyConn {
	var out []*testserver.ProxyConn
	for _, p := range ps {
		out = append(out, p.Open()...)
	}
	return out
}

// frames returns every frame of every connection, in order per connection.
func (ps proxies) frames() []testserver.Frame {
	var out []testserver.Frame
	for _, p := range ps {
		for _, c := range p.Conns() {
			out = append(out, c.Frames()...)
		}
	}
	return out
}

// proxiedConn waits until the client has exactly one open connection through ps and returns it.
func (s *S) proxiedConn(ps proxies, c *client) *testserver.ProxyConn {
	var pc *testserver.ProxyConn
	s.eventually(5*time.Second, fmt.Sprintf("one open connection of %s through the proxy", c.name), func() (bool, string) {
		open := ps.open()
		if len(open) != 1 {
			return false, fmt.Sprintf("%d open", len(open))
		}
		pc = open[0]
		return true, ""
	})
	if id, ok := pc.SessionID(); ok && strings.Trim(c.session, "0") != "" && hex.EncodeToString(id[:]) != strings.ToLower(c.session) {
		s.Errorf("%s: connect replied session_id %s but its HELLO carried %x", c.name, c.session, id)
	}
	return pc
}

// logFrames puts the frames the proxy saw on a connection into the step log.
func (s *S) logFrames(pc *testserver.ProxyConn, what string) {
	for _, line := range frameLines(pc, what) {
		s.log.add(line.at, "%s", line.text)
	}
}

// frameLines renders the frames the proxy saw on a connection.
func frameLines(pc *testserver.ProxyConn, what string) []logLine {
	var out []logLine
	for _, f := range pc.Frames() {
		desc := ""
		if f.Op() < 0x10 {
			desc = fmt.Sprintf("handshake op %#x, %d bytes", f.Op(), len(f.Bytes))
		} else if f.Dir == testserver.ClientToServer {
			desc = describeRequest(f.Bytes)
		} else {
			var resp wire.Response
			if _, err := wire.DecodeResponse(f.Bytes, wire.MaxDataLen, &resp); err == nil {
				desc = describeFrame(resp)
			}
		}
		held := ""
		if f.Held {
			held = " (held back)"
		}
		out = append(out, logLine{f.At, fmt.Sprintf("proxy %s conn %d %s %s%s", what, pc.ID, f.Dir, desc, held)})
	}
	return out
}

func scResumeQueuePlace(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	const n = 10
	ps := make([]proxies, n)
	clients := make([]*client, n)
	for i := range clients {
		ps[i] = s.proxy(t)
		clients[i] = s.connect(s.d, t, connectOpts{endpoints: ps[i].addrs()})
	}
	tokR := s.rAcquire(r, "k", 30*time.Second)
	calls, locks := s.queueInOrder(r, "k", clients, 10*time.Second)
	third := ps[2]
	old := s.proxiedConn(third, clients[2])
	s.Step("reset the third waiter's connection (RST both ways)")
	old.Reset()
	s.eventually(5*time.Second, "the third waiter reconnected through its proxy", func() (bool, string) {
		open := third.open()
		return len(open) == 1 && open[0] != old, fmt.Sprintf("%d open", len(open))
	})
	fresh := third.open()[0]
	s.eventually(5*time.Second, "the third waiter re-sent its ACQUIRE on the new connection", func() (bool, string) {
		for _, f := range fresh.Frames() {
			if f.Dir == testserver.ClientToServer && f.Op() == byte(wire.OpAcquire) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d frames", len(fresh.Frames()))
	})
	s.logFrames(fresh, "third waiter")
	s.expectInspect(r, "k", true, n)
	s.rRelease(r, "k", tokR)
	s.grantInOrder(clients, calls, locks, "k", tokR)
	s.expectInspect(r, "k", false, 0)
	for i, c := range clients {
		s.expectNoEvent(held{c: c, lock: locks[i]})
	}
}

func scRetryIdempotent(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	after := s.probeToken(r)
	p := s.proxy(t)
	a := s.connect(s.d, t, connectOpts{endpoints: p.addrs()})
	pc := s.proxiedConn(p, a)
	s.Step("hold back server->client bytes on A's connection")
	pc.HoldServerBytes()
	c, lock := a.acquire("k", 10*time.Second, acquireArgs{})
	s.waitInspect(r, "k", true, 0, 5*time.Second)
	tok := s.holderToken(r, "k", after)
	s.logFrames(pc, "A")
	s.Step("reset A's connection, dropping %d held bytes", pc.HeldBytes())
	pc.Reset()
	h := s.granted(a, c, lock, 5*time.Second, "A's acquire across the reset")
	if h.token != tok {
		s.Fatalf("A's acquire returned token %d; the server granted %d (a second grant?)", h.token, tok)
	}
	s.ok(h.release(), prompt, "A's release")
	s.expectInspect(r, "k", false, 0)
	tokR := s.rAcquire(r, "k", 10*time.Second)
	if tokR != tok+1 {
		s.Fatalf("R's acquire got token %d; want %d (no grant between A's and R's)", tokR, tok+1)
	}
	s.expectNoEvent(h)
}

func scReleaseRetry(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	p := s.proxy(t)
	a := s.connect(s.d, t, connectOpts{endpoints: p.addrs()})
	h := a.mustAcquire("k", 10*time.Second, acquireArgs{}, prompt)
	pc := s.proxiedConn(p, a)
	s.Step("hold back server->client bytes on A's connection")
	pc.HoldServerBytes()
	c := h.release()
	s.waitInspect(r, "k", false, 0, 5*time.Second)
	s.logFrames(pc, "A")
	s.Step("reset A's connection, dropping %d held bytes", pc.HeldBytes())
	pc.Reset()
	s.ok(c, 5*time.Second, "A's release across the reset")
	observe(200 * time.Millisecond)
	s.expectNotLost(h)
	s.expectInspect(r, "k", false, 0)
}

func scAckOutcomes(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	tok := s.rAcquire(r, "k", 60*time.Second)
	// Every RELEASE stores an outcome on the server until the client ACKs it; above 4,096 the
	// session's next one would get BUSY. A release by a token that does not hold k: NOT_HELD.
	const total, batch = 4500, 100
	s.Step("A releases k with token %d (not the holder's) %d times, %d at a time", tok+1000, total, batch)
	start := time.Now()
	for done := 0; done < total; done += batch {
		calls := make([]*call, batch)
		for i := range calls {
			calls[i] = a.releaseToken("k", tok+1000)
		}
		for i, c := range calls {
			s.fails(c, 10*time.Second, fmt.Sprintf("release_token #%d of a token that holds nothing", done+i+1), "not_held")
		}
	}
	s.Step("%d releases answered not_held in %v", total, time.Since(start).Round(time.Millisecond))
	s.expectInspect(r, "k", true, 0)
}

// freePort returns a loopback address nobody listens on (it was free a moment ago).
func (s *S) freePort() string {
	addrs, err := testserver.FreeAddrs("127.0.0.1", 1)
	if err != nil {
		s.Fatalf("%v", err)
	}
	return addrs[0]
}

func scUnreachable(s *S) {
	addr := s.freePort()
	c, _ := s.connectCall(s.d, connectOpts{endpoints: []string{addr}, dialTimeout: time.Second})
	s.fails(c, prompt, "connect to "+addr+" where nobody listens", "unavailable")
}

// electionPhase is how long connect_election's endpoint answers NOT_LEADER before a leader is
// there: about one election.
const electionPhase = 800 * time.Millisecond

func scConnectElection(s *S) {
	t := s.server(targetConfig{})
	p := s.proxy(t)
	s.Step("the endpoint answers every HELLO with CHALLENGE NOT_LEADER, no hint (an election)")
	p.notLeader(true)
	c, cl := s.connectCall(s.d, connectOpts{endpoints: p.addrs()})
	time.Sleep(electionPhase)
	if c.isDone() {
		s.Fatalf("connect replied during the election (%s); want it to keep trying until a leader is there", c.reply.raw)
	}
	if n := p.notLeaderAnswers(); n < 2 {
		s.Errorf("connect tried %d time(s) in %v of election; want it to try again (with backoff)", n, electionPhase)
	}
	s.Step("a leader is elected: the endpoint relays to the server again (%d NOT_LEADER answers so far)", p.notLeaderAnswers())
	p.notLeader(false)
	r := s.ok(c, 5*time.Second, "connect once a leader is there")
	_ = r.decode("session_id", &cl.session)
	h := cl.mustAcquire("k", 5*time.Second, acquireArgs{}, prompt)
	s.ok(h.release(), prompt, "release")

	s.Step("an election that outlasts the request timeout (1 s): connect gives up")
	p.notLeader(true)
	c, _ = s.connectCall(s.d, connectOpts{endpoints: p.addrs(), requestTimeout: time.Second})
	s.fails(c, 3*time.Second, "connect during an election longer than its request timeout", "unavailable", "timeout")
}

func scHalfOpen(s *S) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.Fatalf("%v", err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	s.cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	c, _ := s.connectCall(s.d, connectOpts{endpoints: []string{ln.Addr().String()}, dialTimeout: time.Second})
	s.fails(c, 3*time.Second, "connect to a server that accepts and never answers", "timeout", "unavailable")
}

func scFrozenServer(s *S) {
	t := s.server(targetConfig{})
	a := s.connect(s.d, t, connectOpts{requestTimeout: 500 * time.Millisecond, heartbeat: 200 * time.Millisecond})
	s.ok(a.ping(), prompt, "ping before the freeze")
	s.Step("SIGSTOP the server")
	if err := t.Freeze(); err != nil {
		s.Fatalf("freeze: %v", err)
	}
	defer func() {
		s.Step("SIGCONT the server")
		if err := t.Thaw(); err != nil {
			s.Errorf("thaw: %v", err)
		}
	}()
	calls := []struct {
		what string
		c    *call
	}{
		{"ping", a.ping()},
		{"inspect", a.inspectCall("k")},
		{"release_token", a.releaseToken("k", uint64(1))},
	}
	acq, _ := a.acquire("k", 5*time.Second, acquireArgs{wait: waitFor(100 * time.Millisecond)})
	calls = append(calls, struct {
		what string
		c    *call
	}{"acquire (wait_ms 100)", acq})
	for _, c := range calls {
		s.fails(c.c, 3*time.Second, c.what+" to a frozen server", "timeout", "connection_lost")
		if c.c.elapsed() > 3*time.Second {
			s.Fatalf("%s failed after %v; want within 3 s", c.what, c.c.elapsed())
		}
	}
	s.ok(a.close(), 5*time.Second, "close with the server frozen")
}

func scWrongToken(s *S) {
	const secret = "conformance-secret"
	t := s.server(targetConfig{Token: secret})
	c, _ := s.connectCall(s.d, connectOpts{endpoints: t.Endpoints(), token: "not-the-token"})
	s.fails(c, prompt, "connect with the wrong token", "auth_failed")
	c, _ = s.connectCall(s.d, connectOpts{endpoints: t.Endpoints()})
	e := s.fails(c, prompt, "connect without a token to a server that requires one", "auth_failed")
	if !strings.Contains(strings.ToLower(e.Message), "token") {
		s.Errorf("auth_failed without a token: message %q does not say that the server requires a token", e.Message)
	}
	a := s.connect(s.d, t, connectOpts{})
	s.ok(a.ping(), prompt, "ping with the right token")
}

func scAuthDowngrade(s *S) {
	t := s.server(targetConfig{})
	c, _ := s.connectCall(s.d, connectOpts{endpoints: t.Endpoints(), token: "conformance-secret"})
	s.fails(c, prompt, "connect with a token to a server that requires none", "auth_failed")
}

func scTLS(s *S) {
	t := s.server(targetConfig{TLS: true})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	h := a.mustAcquire("k", 5*time.Second, acquireArgs{}, prompt)
	s.expectInspect(r, "k", true, 0)
	s.releaseAny(h, "k", prompt)
	s.expectInspect(r, "k", false, 0)

	s.Step("plaintext connect to the TLS server")
	c, _ := s.connectCall(s.d, connectOpts{endpoints: t.Endpoints(), dialTimeout: time.Second})
	s.fails(c, 3*time.Second, "plaintext connect to a TLS server", "tls", "timeout", "unavailable", "connection_lost")

	plain := s.server(targetConfig{})
	s.Step("TLS connect to a plaintext server")
	c, _ = s.connectCall(s.d, connectOpts{endpoints: plain.Endpoints(), tls: t.tlsArg(false), dialTimeout: time.Second})
	s.fails(c, 3*time.Second, "TLS connect to a plaintext server", "tls")
}

func scMTLS(s *S) {
	t := s.server(targetConfig{TLS: true, ClientCA: true})
	a := s.connect(s.d, t, connectOpts{})
	s.ok(a.ping(), prompt, "ping with a client certificate")
	s.Step("connect without a client certificate")
	c, _ := s.connectCall(s.d, connectOpts{endpoints: t.Endpoints(), tls: t.tlsArg(false), dialTimeout: time.Second})
	s.fails(c, 3*time.Second, "connect without a client certificate", "tls", "connection_lost")
}

func scBadArguments(s *S) {
	t := s.server(targetConfig{})
	r := t.R()
	a := s.connect(s.d, t, connectOpts{})
	cases := []struct {
		what string
		args map[string]any
	}{
		{"acquire with an empty key", map[string]any{"key": "", "lease_ms": 5000}},
		{"acquire with a key of 65,536 bytes", map[string]any{"key": strings.Repeat("k", 65536), "lease_ms": 5000}},
		{"acquire with lease_ms 0", map[string]any{"key": "k", "lease_ms": 0}},
		{"acquire with lease_ms -5", map[string]any{"key": "k", "lease_ms": -5}},
		{"acquire with wait_ms -5", map[string]any{"key": "k", "lease_ms": 5000, "wait_ms": -5}},
	}
	for _, tc := range cases {
		c, _ := a.acquireRaw(tc.args)
		s.fails(c, prompt, tc.what, "invalid_argument")
		s.expectInspect(r, "k", false, 0)
	}
	s.fails(a.releaseToken("k", "0"), prompt, `release_token with token "0"`, "invalid_argument")
	s.expectInspect(r, "k", false, 0)
	if s.d.features["locks"] {
		h := a.mustAcquire("k", 5*time.Second, acquireArgs{}, prompt)
		s.fails(h.extend(0), prompt, "extend with lease_ms 0", "invalid_argument")
		in := s.inspect(r, "k")
		s.log.add(time.Now(), "R INSPECT %q: %s", "k", in)
		if !in.held() || in.Waiters != 0 || in.LeaseLeft < 3000 {
			s.Fatalf("after the rejected extend: %s; want k still held with its 5 s lease, nothing queued", in)
		}
		s.ok(h.release(), prompt, "release")
	}
}
