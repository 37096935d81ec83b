package cluster

import (
	"os/exec"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// TestLeaseNeverEarlyAcrossLeadersWithSkewedClocks: every node runs in its own time namespace
// with a different CLOCK_MONOTONIC/CLOCK_BOOTTIME offset, one node's clock runs fast and one
// slow (within the protocol's rate bound, CLOCK_RATE_BOUND_PPM); leaders are killed while a
// lock is held. The next client is never granted the key before the holder's local deadline
// (t_send + lease·(1 − 2ρ)): time comes from the log, and clocks are never compared across
// nodes.
func TestLeaseNeverEarlyAcrossLeadersWithSkewedClocks(t *testing.T) {
	if err := exec.Command("unshare", "--time", "--monotonic", "1", "true").Run(); err != nil {
		t.Fatalf("time namespaces unavailable (unshare --time needs root and util-linux): %v", err)
	}
	p := newCluster(t, 3)
	offsets := []string{"0", "100000", "7000000"}
	rates := []string{"1", "1.0009", "0.9991"} // ±900 ppm, inside the 1000 ppm bound
	for i, nd := range p.nodes {
		nd.prefix = []string{"unshare", "--time", "--monotonic", offsets[i], "--boottime", offsets[i], "--"}
		nd.env = append(nd.env, "TICKETING_TEST_CLOCK_RATE="+rates[i])
	}
	p.startAll()
	const lease = 3000 * time.Millisecond
	const rho = 0.001
	for round := 0; round < 3; round++ {
		a, b := p.newClient(), p.newClient()
		key := "k"
		tSend := time.Now()
		g := a.call(acquire(1, key, uint32(lease/time.Millisecond), 0))
		if g.Status != wire.StatusOK {
			t.Fatalf("round %d: %v", round, g.Status)
		}
		localDeadline := tSend.Add(time.Duration(float64(g.Lease) * (1 - 2*rho) * float64(time.Millisecond)))
		b.send(acquire(1, key, 1000, wire.WaitForever))
		time.Sleep(300 * time.Millisecond)
		// Kill the leader mid-lease; the waiter follows the new one and waits there.
		l := p.leader(5 * time.Second)
		p.kill(l)
		// The waiter resumes on the new leader and re-sends its acquire (a retry: it keeps its
		// place); under load a two-node cluster may change leader again, so it follows.
		var r wire.Response
		var err error
		for until := time.Now().Add(20 * time.Second); ; {
			b.reconnect()
			b.send(acquire(1, key, 1000, wire.WaitForever))
			if r, err = b.answer(1, time.Until(until)); err == nil || time.Now().After(until) {
				break
			}
		}
		granted := time.Now()
		if err != nil || r.Status != wire.StatusOK {
			t.Fatalf("round %d: waiter: %v %+v", round, err, r)
		}
		if granted.Before(localDeadline) {
			t.Fatalf("round %d: the key went to the next client %v before the holder's local deadline", round, localDeadline.Sub(granted))
		}
		t.Logf("round %d: next grant %v after the holder's local deadline", round, granted.Sub(localDeadline).Round(time.Millisecond))
		p.start(l) // back in the cluster for the next round
		b.call(release(2, key, r.Token))
	}
}
