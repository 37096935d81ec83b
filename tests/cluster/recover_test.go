package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// TestForcedRecovery: two of three nodes are lost for good; the survivor is restarted with
// TICKETING_RAFT_RECOVER and itself as the only peer. It serves again with a new state id,
// tokens above every token issued before, and no grant until the maximum lease has passed
// (a lease the lost majority granted may still run).
func TestForcedRecovery(t *testing.T) {
	const maxLease = 3 * time.Second
	p := newCluster(t, 3, "TICKETING_MAX_LEASE=3s")
	p.startAll()
	c := p.newClient()
	c.send(acquire(1, "k", 2000, 0))
	g := c.mustAnswer(1)
	if g.Status != wire.StatusOK {
		t.Fatal(g.Status)
	}
	oldState := c.state
	survivor := p.leader(5 * time.Second)
	for _, nd := range p.nodes {
		p.kill(nd)
	}
	for i, e := range survivor.env {
		if strings.HasPrefix(e, "TICKETING_PEERS=") {
			survivor.env[i] = "TICKETING_PEERS=" + survivor.id + "=" + survivor.raftAddr
		}
	}
	survivor.env = append(survivor.env, "TICKETING_RAFT_RECOVER=true")
	start := time.Now()
	p.start(survivor)
	p.nodes = []*node{survivor}
	r := &client{t: t, p: p}
	copy(r.sid[:], "recovery-check--")
	r.connect(p.leader(20 * time.Second))
	if r.state == oldState {
		t.Fatal("the recovered cluster kept the old state id")
	}
	r.send(acquire(1, "k", 1000, 10000))
	a, err := r.answer(1, 15*time.Second)
	if err != nil || a.Status != wire.StatusOK {
		t.Fatalf("acquire after recovery: %v %+v", err, a)
	}
	if waited := time.Since(start); waited < maxLease {
		t.Fatalf("granted %v after the recovery, before the max lease", waited)
	}
	if a.Token <= g.Token {
		t.Fatalf("token %d after recovery, not above %d", a.Token, g.Token)
	}
}
