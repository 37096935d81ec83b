package cluster

import (
	"crypto/rand"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// TestLogsSayWhatHappened: a cluster's log is for people (issue 30, defect 4). A client trying a
// follower first is routine and logs nothing at INFO; hashicorp/raft's events are lines of the
// server's own log (one level, one timestamp, component=raft), not its formatted lines wrapped
// in a WARN; and every node says when the leader changes, with the term.
func TestLogsSayWhatHappened(t *testing.T) {
	p := newCluster(t, 3)
	p.startAll()
	l := p.leader(20 * time.Second)
	for _, nd := range p.nodes {
		if nd == l {
			continue
		}
		for i := 0; i < 5; i++ { // clients trying the endpoints in turn
			nc, err := net.DialTimeout("tcp", nd.addr, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			h := wire.Hello{Version: wire.Version}
			rand.Read(h.SessionID[:])
			rand.Read(h.Nonce[:])
			nc.SetDeadline(time.Now().Add(2 * time.Second))
			nc.Write(wire.AppendHello(nil, &h))
			ch, err := readChallenge(nc)
			nc.Close()
			if err != nil || ch.Status != wire.StatusNotLeader {
				t.Fatalf("HELLO to follower %s: %v %v", nd.id, ch.Status, err)
			}
		}
	}
	p.kill(l) // an election
	nl := p.leader(20 * time.Second)
	time.Sleep(500 * time.Millisecond) // the followers observe the new leader
	for _, nd := range p.nodes {
		if nd == l {
			continue
		}
		log := nd.logText()
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "handshake refused") && strings.Contains(line, "NOT_LEADER") && !strings.Contains(line, "level=DEBUG") {
				t.Errorf("%s: a routine NOT_LEADER logged above DEBUG: %s", nd.id, line)
			}
			if strings.Contains(line, "[ERROR]") || strings.Contains(line, "[WARN]") || strings.Count(line, "Z ") > 1 && strings.Contains(line, "raft") {
				t.Errorf("%s: a raft line wrapped whole: %s", nd.id, line)
			}
		}
		if !strings.Contains(log, `msg="cluster: leader changed" leader=`+nl.id) || !strings.Contains(log, " term=") {
			t.Errorf("%s does not log the leader change to %s with its term:\n%s", nd.id, nl.id, tailLines(log, 15))
		}
	}
}
