package server

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ticketing/ticketing/wire"
)

// The replicated part runs on injected stores and transport (ClusterStores): here hashicorp/raft's
// in-memory ones, with no data-directory log and no sockets between the nodes. The same code as
// on the real stores: a leader is elected, grants replicate, every replica reaches the same
// state, and after a leadership transfer the new leader's tokens go on above the old ones.
func TestClusterOnInMemoryStores(t *testing.T) {
	addrs := map[string]raft.ServerAddress{}
	trans := map[string]*raft.InmemTransport{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("n%d", i)
		addr, tr := raft.NewInmemTransport(raft.ServerAddress("inmem-" + id))
		addrs[id], trans[id] = addr, tr
	}
	for a, ta := range trans {
		for b, tb := range trans {
			if a != b {
				ta.Connect(addrs[b], tb)
			}
		}
	}
	inmem := func(c *Config) {
		id := c.Cluster.NodeID
		store := raft.NewInmemStore()
		c.Cluster.Stores = &ClusterStores{Logs: store, Stable: store, Snapshots: raft.NewInmemSnapshotStore(), Transport: trans[id]}
		peers := map[string]string{}
		for pid, a := range addrs {
			peers[pid] = string(a)
		}
		c.Cluster.Peers = peers
		// Snapshots every few entries, while requests run: under -race, a snapshot taken
		// without Server.mu (fsm.Snapshot) beside the request path's reads.
		c.Cluster.SnapshotThreshold, c.Cluster.SnapshotInterval = 4, 20*time.Millisecond
	}
	tc := startCluster(t, 3, inmem)
	li := tc.leader()
	c := connect(t, tc.nodes[li].addr, "")
	var last uint64
	for i := 0; i < 10; i++ {
		key := fmt.Sprintf("k%d", i%3)
		r := c.roundTrip(acquire(uint64(2*i+1), key, 2000, 5000))
		if r.Status != wire.StatusOK || r.Token <= last {
			t.Fatalf("acquire %d: %+v", i, r)
		}
		last = r.Token
		if rr := c.roundTrip(release(uint64(2*i+2), key, r.Token)); rr.Status != wire.StatusOK {
			t.Fatalf("release: %v", rr.Status)
		}
	}
	tc.converge()

	if err := tc.nodes[li].cluster.raft.LeadershipTransfer().Error(); err != nil {
		t.Fatal(err)
	}
	var nl int
	waitFor(t, 10e9, "a new leader", func() bool {
		for i, n := range tc.nodes {
			if i != li && n.cluster.leads() {
				nl = i
				return true
			}
		}
		return false
	})
	c2 := connect(t, tc.nodes[nl].addr, "")
	r := c2.roundTrip(acquire(1, "after", 2000, 5000))
	if r.Status != wire.StatusOK || r.Token <= last {
		t.Fatalf("acquire on the new leader: %+v (last token before %d)", r, last)
	}
	tc.converge()

	waitFor(t, 10e9, "a snapshot taken while requests ran", func() bool {
		return tc.nodes[li].cluster.raft.Stats()["last_snapshot_index"] != "0"
	})

	// A replica's snapshot for log compaction is taken without the server's lock (fsm.Snapshot):
	// with the lock held elsewhere, as a request or an admin view holds it, it still completes,
	// and it is the replica's state.
	n := tc.nodes[li]
	n.mu.Lock()
	done := make(chan raft.FSMSnapshot, 1)
	go func() {
		snap, err := (*fsm)(n.cluster).Snapshot()
		if err != nil {
			t.Error(err)
		}
		done <- snap
	}()
	var snap raft.FSMSnapshot
	select {
	case snap = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("fsm.Snapshot waits for Server.mu")
	}
	want := n.table.Snapshot()
	n.mu.Unlock()
	if !bytes.Equal(snap.(*fsmSnapshot).b, want) {
		t.Fatal("the snapshot differs from the table's state")
	}
}
