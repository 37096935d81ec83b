// Package cluster holds black-box tests of a Ticketing cluster: real server processes on
// 127.0.0.x, killed with SIGKILL, restarted, run in their own time namespaces, driven by a raw
// protocol client that sees exactly what the servers send.
package cluster

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
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
	id, addr, raftAddr, dir string
	env                     []string
	prefix                  []string // e.g. unshare --time ... --
	cmd                     *exec.Cmd
	log                     *bytes.Buffer
	logMu                   sync.Mutex
	exited                  chan struct{}
}

type proc struct {
	t      *testing.T
	bin    string
	nodes  []*node
	secret string
	timing string
}

// newCluster prepares n nodes on 127.0.0.(base+i) with free ports.
func newCluster(t *testing.T, n int, extraEnv ...string) *proc {
	t.Helper()
	p := &proc{t: t, bin: serverBin(t), secret: "chaos-secret", timing: "0.3"}
	var peers []string
	for i := 0; i < n; i++ {
		host := fmt.Sprintf("127.0.0.%d", 10+i)
		nd := &node{id: fmt.Sprintf("n%d", i+1), addr: freePort(t, host), raftAddr: freePort(t, host), dir: t.TempDir()}
		peers = append(peers, nd.id+"="+nd.raftAddr)
		p.nodes = append(p.nodes, nd)
	}
	for _, nd := range p.nodes {
		nd.env = append([]string{
			"TICKETING_NODE_ID=" + nd.id, "TICKETING_PEERS=" + strings.Join(peers, ","),
			"TICKETING_ADDR=" + nd.addr, "TICKETING_DATA_DIR=" + nd.dir, "TICKETING_CLUSTER_SECRET=" + p.secret,
			"TICKETING_RAFT_TIMING=" + p.timing, "TICKETING_SESSION_GRACE=5s", "TICKETING_LOG_LEVEL=info",
		}, extraEnv...)
	}
	t.Cleanup(func() {
		for _, nd := range p.nodes {
			p.kill(nd)
		}
	})
	return p
}

func freePort(t *testing.T, host string) string {
	t.Helper()
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
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
		cmd.Wait()
		close(nd.exited)
	}()
	select {
	case <-listening:
	case <-nd.exited:
		p.t.Fatalf("%s exited before listening:\n%s", nd.id, nd.logText())
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
			if !p.running(nd) {
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
