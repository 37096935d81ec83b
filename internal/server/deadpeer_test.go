//go:build linux

package server

import (
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// TestMain lets this test binary double as the client inside a network namespace
// (deadPeerChild).
func TestMain(m *testing.M) {
	if addr := os.Getenv("TICKETING_DEADPEER_CHILD"); addr != "" {
		deadPeerChild(addr)
		return
	}
	os.Exit(m.Run())
}

// deadPeerChild connects to addr, queues an ACQUIRE on "k", reports "queued" on stdout and
// then waits to be killed.
func deadPeerChild(addr string) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	if st, err := handshakeQuiet(nc, ""); err != nil || st != wire.StatusOK {
		fmt.Println("handshake:", st, err)
		os.Exit(1)
	}
	nc.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpAcquire, ID: 1, Key: []byte("k"), Lease: 60000, WaitMs: wire.WaitForever}))
	fmt.Println("queued")
	io.Copy(io.Discard, nc)
	select {}
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestDeadPeerDetected: a client whose packets vanish (an nftables drop rule in the network
// namespace it runs in: no FIN, no RST) is detected within about TICKETING_DEAD_PEER_TIMEOUT;
// its waiter leaves the queue and the next live waiter is granted at the hand-off.
func TestDeadPeerDetected(t *testing.T) {
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (make test installs iproute2 and nftables): %v", tool, err)
		}
	}
	var rnd [3]byte
	rand.Read(rnd[:])
	ns := fmt.Sprintf("tkdp%x", rnd)
	hostIf, nsIf := "tkh"+fmt.Sprintf("%x", rnd), "tkc"+fmt.Sprintf("%x", rnd)
	subnet := fmt.Sprintf("10.%d.%d", 200+int(rnd[0])%50, rnd[1])
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { exec.Command("ip", "link", "del", hostIf).Run() })
	run(t, "ip", "link", "set", nsIf, "netns", ns)
	run(t, "ip", "addr", "add", subnet+".1/30", "dev", hostIf)
	run(t, "ip", "link", "set", hostIf, "up")
	run(t, "ip", "netns", "exec", ns, "ip", "addr", "add", subnet+".2/30", "dev", nsIf)
	run(t, "ip", "netns", "exec", ns, "ip", "link", "set", nsIf, "up")
	run(t, "ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

	const d = 3 * time.Second
	ts := startServer(t, func(c *Config) { c.Addr = subnet + ".1:0"; c.DeadPeerTimeout = d })
	h := connect(t, ts.addr, "")
	g := h.roundTrip(acquire(1, "k", 60000, 0))

	child := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "TICKETING_DEADPEER_CHILD="+ts.addr)
	out, _ := child.StdoutPipe()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	line := make([]byte, 64)
	n, _ := out.Read(line)
	if !strings.Contains(string(line[:n]), "queued") {
		t.Fatalf("child: %q", line[:n])
	}
	waitFor(t, 5*time.Second, "child queued", func() bool { return ts.waiters() == 1 })
	live := connect(t, ts.addr, "")
	live.send(acquire(1, "k", 60000, wire.WaitForever))
	waitFor(t, 5*time.Second, "live waiter queued", func() bool { return ts.waiters() == 2 })

	// The child's host goes silent: every packet in and out of its namespace is dropped.
	run(t, "ip", "netns", "exec", ns, "nft", "add", "table", "inet", "tk")
	run(t, "ip", "netns", "exec", ns, "nft", "add", "chain", "inet", "tk", "in", "{ type filter hook input priority 0; policy drop; }")
	run(t, "ip", "netns", "exec", ns, "nft", "add", "chain", "inet", "tk", "out", "{ type filter hook output priority 0; policy drop; }")
	start := time.Now()
	waitFor(t, d+5*time.Second, "dead peer detected", func() bool { return ts.waiters() == 1 })
	t.Logf("dead peer detected after %v (TICKETING_DEAD_PEER_TIMEOUT %v)", time.Since(start).Round(time.Millisecond), d)
	h.roundTrip(release(2, "k", g.Token))
	if r := live.recv(); r.Status != wire.StatusOK || r.ID != 1 {
		t.Fatalf("live waiter: %+v", r)
	}
}
