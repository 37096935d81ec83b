package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A cluster node's data directory started as a single node, or bootstrapped into a new cluster
// after its raft/ was deleted, must not hand out tokens the cluster already issued nor grant
// keys the cluster's holders may still hold: such starts are refused with the way out in the
// message. (Before: the single node issued token 1 and granted a key held in the cluster 5 s
// into its 60 s lease.)
func TestClusterDirectoryIsNotReusedSilently(t *testing.T) {
	tc := startCluster(t, 1, nil)
	l := tc.nodes[tc.leader()]
	c := connect(t, l.addr, "")
	var last uint64
	for i := 0; i < 3; i++ {
		r := c.roundTrip(acquire(uint64(i+1), "held"+string(rune('a'+i)), 60_000, 0))
		if r.Token <= last {
			t.Fatalf("acquire: %+v", r)
		}
		last = r.Token
	}
	l.stop(t)
	dir := tc.dirs[0]

	single := Default()
	single.Addr = "127.0.0.1:0"
	single.DataDir = dir
	if s, err := New(single, quietLogger()); err == nil {
		s.store.Close()
		t.Fatal("a single node started on a cluster node's data directory")
	} else if !strings.Contains(err.Error(), "cluster") || !strings.Contains(err.Error(), "TICKETING_NODE_ID") {
		t.Fatalf("unclear refusal: %v", err)
	}
	// Even with a token floor: the raft state is still there, and would be resumed (with tokens
	// below the single node's) by a later cluster start.
	single.MinToken = 1000
	if s, err := New(single, quietLogger()); err == nil {
		s.store.Close()
		t.Fatal("a single node started on a directory that still holds raft state")
	}

	if err := os.RemoveAll(filepath.Join(dir, "raft")); err != nil {
		t.Fatal(err)
	}
	cl := tc.config(0, nil)
	if s, err := New(cl, quietLogger()); err == nil {
		s.Shutdown(t.Context())
		t.Fatal("a new cluster bootstrapped from a cluster node's directory without its raft state")
	} else if !strings.Contains(err.Error(), "TICKETING_MIN_TOKEN") {
		t.Fatalf("unclear refusal: %v", err)
	}
	single.MinToken = 0
	if s, err := New(single, quietLogger()); err == nil {
		s.store.Close()
		t.Fatal("a single node started on a former cluster node's directory without a token floor")
	} else if !strings.Contains(err.Error(), "TICKETING_MIN_TOKEN") {
		t.Fatalf("unclear refusal: %v", err)
	}

	// The way out: a token floor. Tokens continue above it, and nothing is granted until every
	// lease the cluster could have granted has ended (its maximum lease).
	single.MinToken = 1000
	single.MaxLease = 3 * time.Second
	single.StartupGrace = 0
	ts := startServerCfg(t, single)
	if ts.startWait < int64(single.MaxLease) {
		t.Fatalf("start-up wait %v, want the maximum lease %v", time.Duration(ts.startWait), single.MaxLease)
	}
	c = connect(t, ts.addr, "")
	r := c.roundTrip(acquire(1, "helda", 1000, 0))
	if r.Token != 0 {
		t.Fatalf("granted during the start-up wait: %+v", r)
	}
	r = c.roundTrip(acquire(2, "other", 1000, 10_000))
	if r.Token <= 1000 {
		t.Fatalf("first grant after the floor: %+v", r)
	}
	ts.stop(t)
	// From now on the directory is a single node's: it restarts without the floor.
	single.MinToken = 0
	ts = startServerCfg(t, single)
	r = connect(t, ts.addr, "").roundTrip(acquire(1, "next", 1000, 10_000))
	if r.Token <= 1000 {
		t.Fatalf("after the conversion: %+v", r)
	}
}
