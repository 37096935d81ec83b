package server

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/wire"
)

// While the leader's log is slow, a pipelining client is held back by TCP instead of filling
// the leader's memory: the proposer holds at most TICKETING_RAFT_MAX_PENDING (plus one batch)
// of requests Raft has not taken, the client's writes stop, and no entry is much larger than
// maxEntry. Once the log is fast again every request is answered, in order.
func TestClusterProposerBackpressure(t *testing.T) {
	stall := filepath.Join(t.TempDir(), "stall")
	const limit = 3 << 19 // 1.5 MiB: one closed entry of maxEntry queues behind the open one
	tc := startCluster(t, 1, func(c *Config) { c.RaftMaxPending, c.Faults.StallLog = limit, stall })
	n := tc.nodes[tc.leader()]
	c := connect(t, n.addr, "")
	c.nc.(interface{ SetWriteBuffer(int) error }).SetWriteBuffer(32 << 10)

	const total = 80000 // 22 MB: far more than the socket buffers, the proposer and Raft hold
	key := bytes.Repeat([]byte{'k'}, 250)
	var frames []byte
	for i := 0; i < total; i++ {
		frames = wire.AppendRequest(frames, &wire.Request{Op: wire.OpInspect, ID: uint64(i + 1), Key: key})
	}
	answered := make(chan error, 1)
	go func() { // every answer, in request order
		c.nc.SetReadDeadline(time.Now().Add(60 * time.Second))
		br := bufio.NewReaderSize(c.nc, 64<<10)
		hdr := make([]byte, 0, 256)
		for i := 0; i < total; i++ {
			hdr = hdr[:0]
			for {
				size, err := wire.FrameLen(hdr)
				if err == nil && len(hdr) == size {
					break
				}
				need := 1
				if err == nil {
					need = size - len(hdr)
				}
				b := make([]byte, need)
				if _, err := io.ReadFull(br, b); err != nil {
					answered <- fmt.Errorf("after %d answers: %w", i, err)
					return
				}
				hdr = append(hdr, b...)
			}
			var r wire.Response
			if _, err := wire.DecodeResponse(hdr, wire.MaxDataLen, &r); err != nil || r.ID != uint64(i+1) || r.Status != wire.StatusOK {
				answered <- fmt.Errorf("answer %d: %+v (%v)", i+1, r, err)
				return
			}
		}
		answered <- nil
	}()

	if err := os.WriteFile(stall, nil, 0o600); err != nil { // the leader's log writes now block
		t.Fatal(err)
	}
	written := make(chan error, 1)
	go func() {
		c.nc.SetWriteDeadline(time.Now().Add(60 * time.Second))
		_, err := c.nc.Write(frames)
		written <- err
	}()
	p := &n.cluster.prop
	maxQueued := 0
	for start := time.Now(); time.Since(start) < 700*time.Millisecond; time.Sleep(2 * time.Millisecond) {
		p.mu.Lock()
		maxQueued = max(maxQueued, p.queued())
		p.mu.Unlock()
	}
	select {
	case err := <-written:
		t.Fatalf("the client wrote all of its 22 MB while the log was stalled (err %v): no backpressure", err)
	default:
	}
	os.Remove(stall)
	if maxQueued > limit+64<<10 {
		t.Errorf("the proposer held %d bytes not yet handed to Raft; the limit is %d", maxQueued, limit)
	}
	if maxQueued < maxEntry {
		t.Errorf("the proposer never held more than %d bytes: the test did not fill it", maxQueued)
	}
	select {
	case err := <-written:
		if err != nil {
			t.Fatalf("write: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the client's write did not finish after the log recovered")
	}
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
	// Entries are split at maxEntry (one batch of slack).
	logs := n.cluster.logs
	first, _ := logs.FirstIndex()
	last, _ := logs.LastIndex()
	biggest := 0
	for i := first; i <= last; i++ {
		var l raft.Log
		if err := logs.GetLog(i, &l); err == nil && l.Type == raft.LogCommand {
			biggest = max(biggest, len(l.Data))
		}
	}
	if biggest > maxEntry+64<<10 {
		t.Errorf("an entry of %d bytes (maxEntry %d)", biggest, maxEntry)
	}
	t.Logf("proposer held at most %d KiB; largest entry %d KiB", maxQueued>>10, biggest>>10)
}

// The limits that shape the table are replicated: every replica uses the current leader's,
// whatever its own settings, and a new leader brings its own (docs/cluster.md).
func TestClusterLimitsFollowTheLeader(t *testing.T) {
	tc := startCluster(t, 3, func(c *Config) {
		c.MaxWaitersPerKey = 100 + int(c.Cluster.NodeID[1]-'0') // 101, 102, 103
		c.LockDelay = time.Duration(c.Cluster.NodeID[1]-'0') * time.Millisecond
	})
	li := tc.leader()
	check := func(li int) {
		t.Helper()
		want := tc.nodes[li].tableConfig().Limits()
		waitFor(t, 5*time.Second, "every replica uses the leader's limits", func() bool {
			for _, n := range tc.nodes {
				n.mu.Lock()
				got := n.table.Limits()
				n.mu.Unlock()
				if got != want {
					return false
				}
			}
			return true
		})
		tc.converge()
	}
	check(li)
	next := (li + 1) % 3
	id := fmt.Sprintf("n%d", next+1)
	if err := tc.nodes[li].cluster.raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(tc.peers[id])).Error(); err != nil {
		t.Fatal(err)
	}
	if got := tc.leader(); got != next {
		t.Fatalf("leader n%d after the transfer to %s", got+1, id)
	}
	check(next)
}

// A committed entry a replica cannot apply stops that replica (it would diverge): one error
// line and exit code 70 in production; here exitProcess only records the code, and the node
// must then apply nothing more and serve nobody.
func TestClusterApplyErrorStopsTheReplica(t *testing.T) {
	codes := make(chan int, 4)
	prev := exitProcess
	exitProcess = func(code int) { codes <- code }
	t.Cleanup(func() { exitProcess = prev }) // after the cluster's own cleanup has stopped it
	tc := startCluster(t, 1, nil)
	n := tc.nodes[tc.leader()]
	c := connect(t, n.addr, "")
	if r := c.roundTrip(acquire(1, "k", 5000, 0)); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}

	// An entry of a newer version: a command type this one does not know, not ignorable.
	var e locktable.Encoder
	e.Reset(0)
	e.Tick()
	bad := bytes.Clone(e.Bytes())
	bad[16] = 0x7e
	if err := n.cluster.raft.Apply(bad, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-codes:
		if code != 70 {
			t.Fatalf("exit code %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an entry that cannot be applied did not stop the replica")
	}
	// It serves nobody: its client is sent away, and it never leads again.
	r, err := c.recvWithin(5 * time.Second)
	if err == nil && r.Op != wire.OpGoaway {
		t.Fatalf("after the failed apply the client got %+v", r)
	}
	if n.cluster.leads() {
		t.Fatal("the halted node still serves")
	}
	// It applies nothing more (a NODE entry, committed, leaves no trace).
	e.Reset(0)
	e.Node("later", "127.0.0.1:1")
	if err := n.cluster.raft.Apply(bytes.Clone(e.Bytes()), 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	addr := n.table.NodeAddr("later")
	n.mu.Unlock()
	if addr != "" {
		t.Fatal("the halted node applied a later entry")
	}
	select {
	case code := <-codes:
		t.Fatalf("stopped twice (code %d)", code)
	default:
	}
}

// A forced recovery seeds tokens RecoveryTokenMargin above the last token of the recovering
// node's log, and never below TICKETING_MIN_TOKEN.
func TestClusterForcedRecoveryTokenFloor(t *testing.T) {
	tc := startCluster(t, 1, func(c *Config) { c.MaxLease = time.Second })
	c := connect(t, tc.nodes[tc.leader()].addr, "")
	var last uint64
	for i := uint64(1); i <= 3; i++ {
		r := c.roundTrip(acquire(i, fmt.Sprintf("k%d", i), 1000, 0))
		if r.Status != wire.StatusOK {
			t.Fatal(r.Status)
		}
		last = r.Token
	}
	recoverNode := func(minToken uint64) uint64 {
		t.Helper()
		tc.nodes[0].stop(t)
		cfg := tc.config(0, func(c *Config) { c.MaxLease = time.Second; c.MinToken = minToken })
		cfg.Cluster.Recover = true
		tc.nodes[0] = startServerCfg(t, cfg)
		n := tc.nodes[tc.leader()]
		r := connect(t, n.addr, "").roundTrip(acquire(1, "after", 1000, 10000))
		if r.Status != wire.StatusOK {
			t.Fatalf("acquire after recovery: %+v", r)
		}
		return r.Token
	}
	tok := recoverNode(0)
	if tok <= last+RecoveryTokenMargin {
		t.Fatalf("token %d after a recovery from a log whose last token was %d: want above %d", tok, last, last+RecoveryTokenMargin)
	}
	floor := tok + 5*RecoveryTokenMargin
	if tok2 := recoverNode(floor); tok2 <= floor {
		t.Fatalf("token %d after a recovery with TICKETING_MIN_TOKEN %d", tok2, floor)
	}
}
