// Package deploytest is test support shared by the tests of internal/deploy and internal/cli: a
// ticketing server process started from a command (as an operator starts one from generated
// output), with its client and admin addresses read from its log; and a minimal protocol client
// (the wire package) that takes locks on it without the client library.
package deploytest

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"os/exec"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/wire"
)

// Node is a server process started from generated output, stopped by its PID at the end of the
// test. Addr and Admin are its client and admin listeners, from its log.
type Node struct {
	cmd         *exec.Cmd
	Addr, Admin string
	mu          sync.Mutex
	log         bytes.Buffer
	exited      chan struct{}
}

var (
	listeningRE = regexp.MustCompile(`msg=listening addr=(\S+)`)
	adminRE     = regexp.MustCompile(`msg="admin listening" addr=(\S+)`)
)

// StartNode starts cmd (a ticketing server, possibly through a shell that execs it) and
// waits for its "listening" and "admin listening" log lines.
func StartNode(t *testing.T, cmd *exec.Cmd) *Node {
	t.Helper()
	n := &Node{cmd: cmd, exited: make(chan struct{})}
	cmd.SysProcAttr = killWithParent()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		done := false
		for sc.Scan() {
			line := sc.Text()
			n.mu.Lock()
			n.log.WriteString(line + "\n")
			if m := listeningRE.FindStringSubmatch(line); m != nil {
				n.Addr = m[1]
			}
			if m := adminRE.FindStringSubmatch(line); m != nil {
				n.Admin = m[1]
			}
			ready := n.Addr != "" && n.Admin != ""
			n.mu.Unlock()
			if ready && !done {
				done = true
				close(found)
			}
		}
	}()
	go func() { cmd.Wait(); close(n.exited) }()
	t.Cleanup(func() { n.stop(t) })
	select {
	case <-found:
	case <-n.exited:
		t.Fatalf("server exited at start:\n%s", n.Log())
	case <-time.After(30 * time.Second):
		t.Fatalf("server did not start within 30s:\n%s", n.Log())
	}
	return n
}

// Log is what the process has written to stderr so far.
func (n *Node) Log() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.log.String()
}

// stop sends SIGTERM to the process by its PID, then SIGKILL after 15 s.
func (n *Node) stop(t *testing.T) {
	select {
	case <-n.exited:
		return
	default:
	}
	syscall.Kill(n.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(15 * time.Second):
		syscall.Kill(n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.exited
		t.Errorf("server ignored SIGTERM:\n%s", n.Log())
	}
}

// Conn is a minimal protocol client (the wire package), so that these tests need no client
// library: one session on NC.
type Conn struct {
	NC  net.Conn
	buf []byte
	id  uint64
}

// Dial connects and completes the handshake; the status is WELCOME's (or CHALLENGE's).
func Dial(addr, token string) (*Conn, wire.Status, error) {
	nc, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return nil, 0, err
	}
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	var sid [wire.SessionIDSize]byte
	rand.Read(sid[:])
	h := wire.Hello{Version: wire.Version, SessionID: sid}
	rand.Read(h.Nonce[:])
	fail := func(err error) (*Conn, wire.Status, error) { nc.Close(); return nil, 0, err }
	if _, err := nc.Write(wire.AppendHello(nil, &h)); err != nil {
		return fail(err)
	}
	head := make([]byte, 4)
	if _, err := io.ReadFull(nc, head); err != nil {
		return fail(err)
	}
	size, err := wire.ChallengeLen(head)
	if err != nil {
		return fail(err)
	}
	b := append(head, make([]byte, size-4)...)
	if _, err := io.ReadFull(nc, b[4:]); err != nil {
		return fail(err)
	}
	var ch wire.Challenge
	if err := wire.DecodeChallenge(b, &ch); err != nil {
		return fail(err)
	}
	if ch.Status != wire.StatusOK {
		nc.Close()
		return nil, ch.Status, nil
	}
	var a wire.Auth
	if token != "" {
		a.Proof = wire.ClientProof([]byte(token), &sid, &h.Nonce, &ch.Nonce)
	}
	if _, err := nc.Write(wire.AppendAuth(nil, &a)); err != nil {
		return fail(err)
	}
	wb := make([]byte, wire.WelcomeSize)
	if _, err := io.ReadFull(nc, wb); err != nil {
		return fail(err)
	}
	var w wire.Welcome
	if err := wire.DecodeWelcome(wb, &w); err != nil {
		return fail(err)
	}
	if w.Status != wire.StatusOK {
		nc.Close()
		return nil, w.Status, nil
	}
	nc.SetDeadline(time.Time{})
	return &Conn{NC: nc}, wire.StatusOK, nil
}

// Send sends r with the next request id.
func (c *Conn) Send(r wire.Request) error {
	c.id++
	r.ID = c.id
	_, err := c.NC.Write(wire.AppendRequest(nil, &r))
	return err
}

// Recv reads the next response, waiting at most d.
func (c *Conn) Recv(d time.Duration) (wire.Response, error) {
	c.NC.SetReadDeadline(time.Now().Add(d))
	for {
		if size, err := wire.FrameLen(c.buf); err == nil && len(c.buf) >= size {
			var r wire.Response
			_, err := wire.DecodeResponse(c.buf, wire.MaxDataLen, &r)
			c.buf = c.buf[size:]
			return r, err
		}
		tmp := make([]byte, 4096)
		n, err := c.NC.Read(tmp)
		c.buf = append(c.buf, tmp[:n]...)
		if err != nil && n == 0 {
			return wire.Response{}, err
		}
	}
}

// Acquire sends an ACQUIRE (lease 30 s) and, unless wait is non-zero, waits for its answer.
func (c *Conn) Acquire(t *testing.T, key string, waitMs uint32) uint64 {
	t.Helper()
	if err := c.Send(wire.Request{Op: wire.OpAcquire, Key: []byte(key), Lease: 30000, WaitMs: waitMs}); err != nil {
		t.Fatal(err)
	}
	if waitMs != 0 {
		return 0
	}
	r, err := c.Recv(10 * time.Second)
	if err != nil || r.Status != wire.StatusOK || r.Token == 0 {
		t.Fatalf("acquire %s: %+v %v", key, r, err)
	}
	return r.Token
}

// TakeLock connects to addr with token and takes key, proving the node serves.
func TakeLock(t *testing.T, addr, token, key string) uint64 {
	t.Helper()
	c, st, err := Dial(addr, token)
	if err != nil || st != wire.StatusOK {
		t.Fatalf("handshake with %s: %v %v", addr, st, err)
	}
	defer c.NC.Close()
	return c.Acquire(t, key, 0)
}

// Binary is the ticketing binary built from this checkout (testserver.Binary).
func Binary(t *testing.T) string {
	t.Helper()
	bin, err := testserver.Binary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// FreePort finds a port free on every host given, with the next one free too.
func FreePort(t *testing.T, hosts ...string) int {
	t.Helper()
	port, err := testserver.FreePortRun(hosts, 2)
	if err != nil {
		t.Fatal(err)
	}
	return port
}
