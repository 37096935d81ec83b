package cluster

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// TestStalledDiskLeaderStepsDown: the leader's log writes hang (a failpoint blocks them while a
// file exists); within a bound it hands leadership over, and clients resume on the new leader.
func TestStalledDiskLeaderStepsDown(t *testing.T) {
	dir := t.TempDir()
	p := newCluster(t, 3)
	for _, nd := range p.nodes {
		nd.env = append(nd.env, "TICKETING_FAILPOINT_STALL_FILE="+filepath.Join(dir, "stall-"+nd.id))
	}
	p.startAll()
	c := p.newClient()
	c.send(acquire(1, "k", 10000, 0))
	if r := c.mustAnswer(1); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
	l := p.leader(5 * time.Second)
	stall := filepath.Join(dir, "stall-"+l.id)
	if err := os.WriteFile(stall, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(stall)
	start := time.Now()
	c.send(acquire(2, "k2", 10000, 0)) // needs a log write: it hangs on the stalled leader
	var nl *node
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, nd := range p.nodes {
			if nd != l && p.running(nd) {
				if st, _ := probe(nd.addr); st == wire.StatusOK {
					nl = nd
				}
			}
		}
		if nl != nil {
			break
		}
	}
	if nl == nil {
		t.Fatal("no new leader while the old one's disk is stalled")
	}
	took := time.Since(start)
	t.Logf("stalled leader %s replaced by %s after %v", l.id, nl.id, took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Fatalf("new leader only after %v", took)
	}
	os.Remove(stall)
	c.reconnect()
	c.send(acquire(2, "k2", 10000, 0))
	if r := c.mustAnswer(2); r.Status != wire.StatusOK {
		t.Fatalf("after the failover: %+v", r)
	}
}
