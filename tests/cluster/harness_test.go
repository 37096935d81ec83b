// Package cluster holds black-box tests of a Ticketing cluster: real server processes on
// 127.0.0.x, killed with SIGKILL, paused with SIGSTOP, stopped with SIGTERM, restarted, cut off
// by TCP proxies on their raft links (netproxy_test.go), run in their own time namespaces, and
// driven by raw protocol clients that see exactly what the servers send (client here; session
// in session_test.go follows the leader) or by the official Go client. chaos_test.go and
// history_test.go are the chaos test and its checker; docs/cluster.md describes them.
package cluster

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/wire"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// serverBin returns TICKETING_BIN, or builds the binary once.
func serverBin(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("TICKETING_BIN"); b != "" {
		return b
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ticketing-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "ticketing")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/ticketing")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// node is one server process.
type node struct {
	id, host, addr, raftAddr, admin, dir string
	env                                  []string
	prefix                               []string // e.g. unshare --time ... --
	cmd                                  *exec.Cmd
	log                                  *bytes.Buffer
	logMu                                sync.Mutex
	exited                               chan struct{}
	waitErr                              error // the process's exit (set before exited is closed)
	paused                               bool  // SIGSTOPped by the test
}

type proc struct {
	t      *testing.T
	bin    string
	nodes  []*node
	secret string
	timing string
	links  *linkNet // per-link proxies between the nodes' raft ports (nil: direct)
}

// clusterSpec describes the nodes newClusterWith prepares.
type clusterSpec struct {
	n int
	// proxied: every node reaches every other node's raft port through a proxy of its own
	// (p.links), so the test can cut any link in either direction.
	proxied bool
	env     []string // extra environment for every node
	timing  string   // TICKETING_RAFT_TIMING (default 0.3)
}

// newCluster prepares n nodes on 127.0.0.(base+i) with free ports.
func newCluster(t *testing.T, n int, extraEnv ...string) *proc {
	t.Helper()
	return newClusterWith(t, clusterSpec{n: n, env: extraEnv})
}

// newClusterWith prepares the nodes of spec: node i on 127.0.0.(10+i) with a free client port,
// raft port and admin port. With spec.proxied, node i's TICKETING_PEERS names its own raft
// address and, for every other node j, the proxy i->j (listening on node i's host), so that
// each node has its own view of its peers and every directed link can be cut.
func newClusterWith(t *testing.T, spec clusterSpec) *proc {
	t.Helper()
	p := &proc{t: t, bin: serverBin(t), secret: "chaos-secret", timing: "0.3"}
	if spec.timing != "" {
		p.timing = spec.timing
	}
	for i := 0; i < spec.n; i++ {
		p.nodes = append(p.nodes, p.newNode(i))
	}
	t.Cleanup(func() {
		for _, nd := range p.nodes {
			p.kill(nd)
		}
		if p.links != nil {
			p.links.close()
		}
	})
	if spec.proxied {
		p.links = newLinkNet(t, p.nodes)
	}
	for i, nd := range p.nodes {
		var peers []string
		for j, o := range p.nodes {
			addr := o.raftAddr
			if p.links != nil && i != j {
				addr = p.links.link(i, j).addr
			}
			peers = append(peers, o.id+"="+addr)
		}
		nd.env = append(p.baseEnv(nd, strings.Join(peers, ",")), spec.env...)
	}
	return p
}

// newNode allocates node i's addresses and data directory (not started, no environment).
func (p *proc) newNode(i int) *node {
	host := fmt.Sprintf("127.0.0.%d", 10+i)
	a := freePorts(p.t, host, 3)
	return &node{id: fmt.Sprintf("n%d", i+1), host: host, addr: a[0], raftAddr: a[1], admin: a[2], dir: p.t.TempDir()}
}

func (p *proc) baseEnv(nd *node, peers string) []string {
	return []string{
		"TICKETING_NODE_ID=" + nd.id, "TICKETING_PEERS=" + peers,
		"TICKETING_ADDR=" + nd.addr, "TICKETING_ADMIN_ADDR=" + nd.admin, "TICKETING_DATA_DIR=" + nd.dir,
		"TICKETING_CLUSTER_SECRET=" + p.secret, "TICKETING_RAFT_TIMING=" + p.timing,
		"TICKETING_SESSION_GRACE=5s", "TICKETING_LOG_LEVEL=info",
	}
}

// addJoiner prepares one more node that joins the running cluster (TICKETING_JOIN=true: it
// never bootstraps); an operator adds it with `ticketing cluster add`. Not started.
func (p *proc) addJoiner(extraEnv ...string) *node {
	p.t.Helper()
	if p.links != nil {
		p.t.Fatal("addJoiner: not with proxied links")
	}
	nd := p.newNode(len(p.nodes))
	var peers []string
	for _, o := range p.nodes {
		peers = append(peers, o.id+"="+o.raftAddr)
	}
	peers = append(peers, nd.id+"="+nd.raftAddr)
	nd.env = append(append(p.baseEnv(nd, strings.Join(peers, ",")), "TICKETING_JOIN=true"), extraEnv...)
	p.nodes = append(p.nodes, nd)
	return nd
}

// freePorts returns n distinct free addresses on host (testserver.FreeAddrs: below the
// ephemeral range, so no outgoing connection takes one before its node listens).
func freePorts(t *testing.T, host string, n int) []string {
	t.Helper()
	addrs, err := testserver.FreeAddrs(host, n)
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

func (p *proc) startAll() {
	for _, nd := range p.nodes {
		p.start(nd)
	}
}

func (p *proc) start(nd *node) {
	p.t.Helper()
	args := append(append([]string(nil), nd.prefix...), p.bin, "server")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), nd.env...)
	nd.log = &bytes.Buffer{}
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	nd.cmd = cmd
	nd.paused = false
	nd.exited = make(chan struct{})
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			nd.logMu.Lock()
			nd.log.WriteString(sc.Text() + "\n")
			nd.logMu.Unlock()
			if !once && strings.Contains(sc.Text(), "msg=listening") {
				once = true
				close(listening)
			}
		}
		nd.waitErr = cmd.Wait()
		close(nd.exited)
	}()
	select {
	case <-listening:
	case <-nd.exited:
		// The exit status too: once a node exited within 20 ms with no output at all.
		p.t.Fatalf("%s exited before listening (%v):\n%s", nd.id, nd.waitErr, nd.logText())
	case <-time.After(20 * time.Second):
		p.t.Fatalf("%s did not listen:\n%s", nd.id, nd.logText())
	}
}

func (nd *node) logText() string {
	nd.logMu.Lock()
	defer nd.logMu.Unlock()
	return nd.log.String()
}

func (p *proc) kill(nd *node) {
	if nd.cmd != nil && nd.cmd.Process != nil {
		select {
		case <-nd.exited:
		default:
			nd.cmd.Process.Signal(syscall.SIGKILL)
			<-nd.exited
		}
	}
	nd.paused = false
}

// terminate sends SIGTERM (graceful stop: a leader hands leadership over first) and waits for
// the process to exit, at most within; it is SIGKILLed after that. It returns how long the stop
// took and whether it finished in time.
func (p *proc) terminate(nd *node, within time.Duration) (time.Duration, bool) {
	if !p.running(nd) {
		return 0, true
	}
	start := time.Now()
	nd.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-nd.exited:
		return time.Since(start), true
	case <-time.After(within):
		p.kill(nd)
		return time.Since(start), false
	}
}

// pause stops the process with SIGSTOP (it keeps its sockets; peers see silence); resume
// continues it.
func (p *proc) pause(nd *node) {
	if p.running(nd) && !nd.paused {
		nd.cmd.Process.Signal(syscall.SIGSTOP)
		nd.paused = true
	}
}

func (p *proc) resume(nd *node) {
	if p.running(nd) && nd.paused {
		nd.cmd.Process.Signal(syscall.SIGCONT)
		nd.paused = false
	}
}

// checkStateHashes compares the state hashes the nodes logged along the way
// (TICKETING_TEST_STATE_HASH_EVERY): replicas that applied the same entries have the same state,
// at every index, also when one came back through a snapshot. A replica that diverged for a
// while (a hand-off with another token) and converged again by the end shows only here.
func (p *proc) checkStateHashes() {
	p.t.Helper()
	logs := map[string]string{}
	for _, nd := range p.nodes {
		logs[nd.id] = nd.logText()
	}
	compared, indexes, diverged := compareStateHashes(logs)
	for i, d := range diverged {
		if i == 10 {
			p.t.Errorf("... and %d more", len(diverged)-10)
			break
		}
		p.t.Errorf("replicas diverged: %s", d)
	}
	if compared == 0 {
		p.t.Errorf("no state hash was logged by two nodes at one index: nothing compared")
	}
	p.t.Logf("state hashes compared at %d (index, node) pairs of %d indexes", compared, indexes)
}

// compareStateHashes reads the "state hash" lines of each node's log and compares every pair of
// nodes that logged the same index; it returns the pairs compared, the indexes seen, and the
// mismatches.
func compareStateHashes(logs map[string]string) (compared, indexes int, diverged []string) {
	type seen struct{ node, hash string }
	at := map[uint64]seen{}
	ids := make([]string, 0, len(logs))
	for id := range logs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		for _, line := range strings.Split(logs[id], "\n") {
			if !strings.Contains(line, `msg="state hash"`) {
				continue
			}
			var idx uint64
			var hash string
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "index="); ok {
					fmt.Sscan(v, &idx)
				} else if v, ok := strings.CutPrefix(f, "hash="); ok {
					hash = v
				}
			}
			if prev, ok := at[idx]; !ok {
				at[idx] = seen{id, hash}
			} else if prev.node != id {
				compared++
				if prev.hash != hash {
					diverged = append(diverged, fmt.Sprintf("state hash at index %d is %s on %s and %s on %s", idx, prev.hash, prev.node, hash, id))
				}
			}
		}
	}
	return compared, len(at), diverged
}

// runSingle runs the server on nd's data directory and client address without its cluster
// settings (a single node), waits at most within for it to exit, and returns its exit status
// (-1: still running at within, then killed) and output.
func (p *proc) runSingle(nd *node, within time.Duration) (int, string) {
	p.t.Helper()
	var env []string
	for _, e := range nd.env {
		name, _, _ := strings.Cut(e, "=")
		switch name {
		case "TICKETING_NODE_ID", "TICKETING_PEERS", "TICKETING_CLUSTER_SECRET", "TICKETING_RAFT_TIMING":
			continue
		}
		if strings.HasPrefix(name, "TICKETING_RAFT_") {
			continue
		}
		env = append(env, e)
	}
	cmd := exec.Command(p.bin, "server")
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	select {
	case <-exited:
		return cmd.ProcessState.ExitCode(), out.String()
	case <-time.After(within):
		cmd.Process.Kill()
		<-exited
		return -1, out.String()
	}
}

// setEnv sets (or adds) one variable of nd's environment for its next start.
func (nd *node) setEnv(name, value string) {
	for i, e := range nd.env {
		if strings.HasPrefix(e, name+"=") {
			nd.env[i] = name + "=" + value
			return
		}
	}
	nd.env = append(nd.env, name+"="+value)
}

// exitCode is the exit status of nd's last process (-1 if it is running or was killed by a
// signal).
func (p *proc) exitCode(nd *node) int {
	if p.running(nd) || nd.cmd == nil || nd.cmd.ProcessState == nil {
		return -1
	}
	return nd.cmd.ProcessState.ExitCode()
}

// clientAddrs lists every node's client address (the endpoint list of a client).
func (p *proc) clientAddrs() []string {
	var a []string
	for _, nd := range p.nodes {
		a = append(a, nd.addr)
	}
	return a
}

// byAddr returns the node whose client address is addr (nil if none).
func (p *proc) byAddr(addr string) *node {
	for _, nd := range p.nodes {
		if nd.addr == addr {
			return nd
		}
	}
	return nil
}

func (p *proc) running(nd *node) bool {
	if nd.cmd == nil {
		return false
	}
	select {
	case <-nd.exited:
		return false
	default:
		return true
	}
}

// leader probes every running node's handshake and returns the one that serves clients.
func (p *proc) leader(within time.Duration) *node {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, nd := range p.nodes {
			if !p.running(nd) || nd.paused {
				continue
			}
			if st, _ := probe(nd.addr); st == wire.StatusOK {
				return nd
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, nd := range p.nodes {
		p.t.Logf("%s log:\n%s", nd.id, nd.logText())
	}
	p.t.Fatal("no leader")
	return nil
}

// probe sends HELLO and returns CHALLENGE's status and data (without going further).
func probe(addr string) (wire.Status, string) {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 255, ""
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(time.Second))
	var sid [16]byte
	rand.Read(sid[:])
	if _, err := nc.Write(wire.AppendHello(nil, &wire.Hello{Version: wire.Version, SessionID: sid})); err != nil {
		return 255, ""
	}
	ch, err := readChallenge(nc)
	if err != nil {
		return 255, ""
	}
	return ch.Status, string(ch.Data)
}

func readChallenge(r io.Reader) (wire.Challenge, error) {
	head := make([]byte, 4)
	if _, err := io.ReadFull(r, head); err != nil {
		return wire.Challenge{}, err
	}
	n, err := wire.ChallengeLen(head)
	if err != nil {
		return wire.Challenge{}, err
	}
	b := make([]byte, n)
	copy(b, head)
	if _, err := io.ReadFull(r, b[4:]); err != nil {
		return wire.Challenge{}, err
	}
	var ch wire.Challenge
	err = wire.DecodeChallenge(b, &ch)
	ch.Data = bytes.Clone(ch.Data)
	return ch, err
}

// client is a raw protocol session that follows the leader: on a dropped connection it
// reconnects to whichever node leads and resumes, like the official clients.
type client struct {
	t       *testing.T
	p       *proc
	sid     [16]byte
	nc      net.Conn
	buf     []byte
	state   [16]byte
	resumed bool
}

func (p *proc) newClient() *client {
	c := &client{t: p.t, p: p}
	rand.Read(c.sid[:])
	c.connect(p.leader(15 * time.Second))
	return c
}

// connect runs the handshake on nd (no auth).
func (c *client) connect(nd *node) {
	c.t.Helper()
	nc, err := net.DialTimeout("tcp", nd.addr, 2*time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	h := wire.Hello{Version: wire.Version, SessionID: c.sid}
	rand.Read(h.Nonce[:])
	nc.Write(wire.AppendHello(nil, &h))
	ch, err := readChallenge(nc)
	if err != nil || ch.Status != wire.StatusOK {
		c.t.Fatalf("challenge from %s: %v %+v", nd.id, err, ch)
	}
	nc.Write(wire.AppendAuth(nil, &wire.Auth{}))
	wb := make([]byte, wire.WelcomeSize)
	if _, err := io.ReadFull(nc, wb); err != nil {
		c.t.Fatal(err)
	}
	var w wire.Welcome
	if err := wire.DecodeWelcome(wb, &w); err != nil || w.Status != wire.StatusOK {
		c.t.Fatalf("welcome from %s: %v %+v", nd.id, err, w)
	}
	nc.SetDeadline(time.Time{})
	if c.state != ([16]byte{}) && c.state != w.StateID {
		c.t.Fatalf("state id changed across a failover")
	}
	c.state = w.StateID
	c.resumed = w.Flags&wire.WelcomeResumed != 0
	c.nc, c.buf = nc, nil
}

// reconnect drops the connection and resumes on the leader.
func (c *client) reconnect() {
	c.t.Helper()
	if c.nc != nil {
		c.nc.Close()
	}
	c.connect(c.p.leader(15 * time.Second))
	if !c.resumed {
		c.t.Fatal("session not resumed on the new leader")
	}
}

func (c *client) send(r wire.Request) {
	c.t.Helper()
	c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.nc.Write(wire.AppendRequest(nil, &r)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// recv reads the next frame; err when the connection fails or nothing comes within d.
func (c *client) recv(d time.Duration) (wire.Response, error) {
	c.nc.SetReadDeadline(time.Now().Add(d))
	for {
		if size, err := wire.FrameLen(c.buf); err == nil && len(c.buf) >= size {
			var r wire.Response
			_, err := wire.DecodeResponse(c.buf, wire.MaxDataLen, &r)
			r.Data = bytes.Clone(r.Data)
			c.buf = c.buf[size:]
			return r, err
		}
		tmp := make([]byte, 4096)
		n, err := c.nc.Read(tmp)
		c.buf = append(c.buf, tmp[:n]...)
		if err != nil && n == 0 {
			return wire.Response{}, err
		}
	}
}

// answer waits for the answer to request id, skipping pushes; err if the connection fails.
func (c *client) answer(id uint64, d time.Duration) (wire.Response, error) {
	deadline := time.Now().Add(d)
	for {
		r, err := c.recv(time.Until(deadline))
		if err != nil {
			return r, err
		}
		if r.ID == id {
			return r, nil
		}
	}
}

// call sends r and returns its answer, following the leader: when the connection ends first
// (GOAWAY, a leader change, a crash) it resumes the session on the leader and re-sends r with
// the same id, a few times at most.
func (c *client) call(r wire.Request) wire.Response {
	c.t.Helper()
	for attempt := 0; ; attempt++ {
		c.send(r)
		a, err := c.answer(r.ID, 10*time.Second)
		if err == nil {
			return a
		}
		if attempt == 3 {
			c.t.Fatalf("answer to %d: %v (after %d reconnects)", r.ID, err, attempt)
		}
		c.reconnect()
	}
}

func (c *client) mustAnswer(id uint64) wire.Response {
	c.t.Helper()
	r, err := c.answer(id, 10*time.Second)
	if err != nil {
		c.t.Fatalf("answer to %d: %v", id, err)
	}
	return r
}

func acquire(id uint64, key string, leaseMs, waitMs uint32) wire.Request {
	return wire.Request{Op: wire.OpAcquire, ID: id, Key: []byte(key), Lease: leaseMs, WaitMs: waitMs}
}

func release(id uint64, key string, token uint64) wire.Request {
	return wire.Request{Op: wire.OpRelease, ID: id, Key: []byte(key), Token: token}
}

// nodeStatus is the part of GET /cluster/status (the admin listener) the tests read.
type nodeStatus struct {
	Node         string `json:"node"`
	Role         string `json:"role"`
	Serving      bool   `json:"serving"`
	Leader       string `json:"leader"`
	LeaderAddr   string `json:"leader_addr"`
	Term         uint64 `json:"term"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	StateID      string `json:"state_id"`
	StateHash    string `json:"state_hash"`
	Members      []struct {
		ID       string `json:"id"`
		RaftAddr string `json:"raft_addr"`
		Voter    bool   `json:"voter"`
	} `json:"members"`
}

var adminHTTP = &http.Client{Timeout: 5 * time.Second}

// status reads nd's GET /cluster/status.
func (p *proc) status(nd *node) (nodeStatus, error) {
	var st nodeStatus
	resp, err := adminHTTP.Get("http://" + nd.admin + "/cluster/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("%s: %s", nd.id, resp.Status)
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st)
	return st, err
}

// readyz returns the HTTP status of nd's GET /readyz and its body (0 when unreachable).
func readyz(nd *node) (int, string) {
	return adminGet(nd, "/readyz")
}

// adminPost posts a JSON body (or none) to nd's admin listener.
func adminPost(nd *node, path, body string) (int, string) {
	resp, err := adminHTTP.Post("http://"+nd.admin+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func adminGet(nd *node, path string) (int, string) {
	resp, err := adminHTTP.Get("http://" + nd.admin + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// waitConverged waits until every running node reports the same applied index and state hash
// twice in a row (no entry in between) and returns that status; it fails the test after within.
func (p *proc) waitConverged(within time.Duration) nodeStatus {
	p.t.Helper()
	deadline := time.Now().Add(within)
	var prev []nodeStatus
	var last string
	for time.Now().Before(deadline) {
		var round []nodeStatus
		ok := true
		for _, nd := range p.nodes {
			if !p.running(nd) {
				continue
			}
			st, err := p.status(nd)
			if err != nil {
				ok, last = false, err.Error()
				break
			}
			round = append(round, st)
		}
		if ok && len(round) > 0 {
			same := true
			for _, st := range round {
				if st.AppliedIndex != round[0].AppliedIndex || st.StateHash != round[0].StateHash || st.StateID != round[0].StateID {
					same = false
				}
			}
			if same && len(prev) == len(round) && prev[0].AppliedIndex == round[0].AppliedIndex {
				return round[0]
			}
			last = fmt.Sprintf("%+v", summarize(round))
			prev = round
			if !same {
				prev = nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	var logs []string
	for _, nd := range p.nodes {
		logs = append(logs, fmt.Sprintf("%s (%s; last 40 lines):\n%s", nd.id, p.diagnose(nd), tailLines(nd.logText(), 40)))
	}
	p.t.Fatalf("nodes did not converge to one state hash at one applied index within %v: %s\n%s", within, last, strings.Join(logs, "\n"))
	return nodeStatus{}
}

// diagnose says, for a failure report, whether nd's process runs (and its kernel state: R, S,
// T for stopped...) and what its admin listener does with a bare request on a new connection:
// an answer, a close without one, or silence. It tells a wedged node from a wedged admin
// listener (issue 27: a node whose admin endpoint answered every request with EOF).
func (p *proc) diagnose(nd *node) string {
	if !p.running(nd) {
		return "process not running"
	}
	state := "?"
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", nd.cmd.Process.Pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "State:") {
				state = strings.TrimSpace(strings.TrimPrefix(line, "State:"))
			}
		}
	}
	probe := "admin: no connection"
	if nc, err := net.DialTimeout("tcp", nd.admin, time.Second); err == nil {
		nc.SetDeadline(time.Now().Add(2 * time.Second))
		nc.Write([]byte("GET /healthz HTTP/1.0\r\n\r\n"))
		b, err := io.ReadAll(io.LimitReader(nc, 256))
		nc.Close()
		switch {
		case len(b) > 0:
			probe = "admin answers " + strings.SplitN(string(b), "\r\n", 2)[0]
		case err == nil:
			probe = "admin: accepted, closed without an answer"
		default:
			probe = "admin: accepted, no answer (" + err.Error() + ")"
		}
	} else {
		probe = "admin: " + err.Error()
	}
	return fmt.Sprintf("pid %d state %s, paused=%v; %s", nd.cmd.Process.Pid, state, nd.paused, probe)
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func summarize(sts []nodeStatus) []string {
	var out []string
	for _, st := range sts {
		h := st.StateHash
		if len(h) > 12 {
			h = h[:12]
		}
		out = append(out, fmt.Sprintf("%s:%s applied=%d hash=%s", st.Node, st.Role, st.AppliedIndex, h))
	}
	return out
}
