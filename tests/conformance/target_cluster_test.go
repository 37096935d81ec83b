package conformance

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
)

// The cluster target ("cluster3"): three real server processes, node i on its own loopback
// address (clusterHosts), each with a client port, a Raft port and an admin port. Clients get
// all three client addresses, the leader last, so that every connect starts at a follower and
// follows its CHALLENGE NOT_LEADER leader hint. Stop, Kill and Restart act on the leader (a
// failover, graceful or not); Freeze and Thaw on every node (nothing answers at all).

// clusterHosts are the nodes' loopback addresses (the test server certificate names them too).
var clusterHosts = testserver.ClusterHosts

// clusterTiming is TICKETING_RAFT_TIMING of the conformance cluster: heartbeat = election
// timeout = 150 ms, a failover of about 0.3-0.6 s, and a minimum lease of 300 ms.
const clusterTiming = "0.3"

// clusterMinLease is the shortest lease the cluster accepts at clusterTiming (2 x 500 ms x
// timing): a lease shorter than a failover could end during one. Scenarios that use a shorter
// lease on one node use this one on a cluster.
const clusterMinLease = 300 * time.Millisecond

// clusterReady bounds a cluster start (or a restart) until a leader serves and every running
// node knows it (so that a follower's hint is never empty).
const clusterReady = 20 * time.Second

type clusterNode struct {
	id, host          string
	addr, raft, admin string // client, Raft and admin listen addresses
	dir               string
	srv               *testserver.Server
	mu                sync.Mutex
	down              bool // stopped or killed by Stop/Kill and not restarted
}

type clusterTarget struct {
	cfg   targetConfig
	bin   string
	certs *testserver.TLSFiles
	nodes []*clusterNode
	order []string // Endpoints

	mu               sync.Mutex
	exited           <-chan struct{} // of the node stopped by the last Stop or Kill
	planned          int             // elections the runner caused: the first, and one per Stop or Kill
	plannedStepdowns int             // step-downs the runner caused: a frozen leader that wakes (FreezeLeader)
}

// clusterStats counts, over a run, the clusters started, the leader changes the runner did not
// cause (a leader that lost its quorum for a leader lease, 75 ms at clusterTiming: a loaded
// machine), and the scenarios run a second time because they failed during one (runOne), for
// the summary.
var clusterStats struct{ started, unplanned, reruns atomic.Int64 }

// newClusterFactory makes 3-node cluster targets running bin.
func newClusterFactory(bin string, certs *testserver.TLSFiles) targetFactory {
	return func(cfg targetConfig) (Target, error) {
		var last error
		for attempt := 0; attempt < 3; attempt++ { // a free port may be taken before a node binds it
			t, err := startCluster(bin, certs, cfg)
			if err == nil {
				return t, nil
			}
			last = err
		}
		return nil, last
	}
}

func startCluster(bin string, certs *testserver.TLSFiles, cfg targetConfig) (*clusterTarget, error) {
	t := &clusterTarget{cfg: cfg, bin: bin, certs: certs}
	var peers []string
	for i, host := range clusterHosts {
		dir, err := os.MkdirTemp("", "ticketing-conformance-cluster-")
		if err != nil {
			t.Close()
			return nil, err
		}
		n := &clusterNode{id: fmt.Sprintf("n%d", i+1), host: host, dir: dir}
		t.nodes = append(t.nodes, n)
		ports, err := testserver.FreeAddrs(host, 3)
		if err != nil {
			t.Close()
			return nil, err
		}
		n.addr, n.raft, n.admin = ports[0], ports[1], ports[2]
		peers = append(peers, n.id+"="+n.raft)
	}
	errs := make([]error, len(t.nodes))
	var wg sync.WaitGroup
	for i, n := range t.nodes {
		sc := testserver.Config{Bin: bin, Addr: n.addr, DataDir: n.dir, Token: cfg.Token,
			Env: append(append(append([]string(nil), defaultServerEnv...),
				"TICKETING_NODE_ID="+n.id, "TICKETING_PEERS="+strings.Join(peers, ","),
				"TICKETING_CLUSTER_SECRET=conformance-cluster-secret", "TICKETING_RAFT_TIMING="+clusterTiming,
				"TICKETING_ADMIN_ADDR="+n.admin), cfg.Env...)}
		if cfg.TLS {
			sc.TLSCert, sc.TLSKey = certs.ServerCert, certs.ServerKey
			if cfg.ClientCA {
				sc.TLSClientCA = certs.ClientCA
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.srv, errs[i] = testserver.StartProcess(sc)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Close()
		return nil, err
	}
	leader, err := t.waitLeader(clusterReady)
	if err != nil {
		err = fmt.Errorf("%v\n%s", err, t.Log())
		t.Close()
		return nil, err
	}
	// The leader last: every connect starts at a follower and follows its hint.
	for _, n := range t.nodes {
		if n != leader {
			t.order = append(t.order, n.addr)
		}
	}
	t.order = append(t.order, leader.addr)
	t.planned = 1
	clusterStats.started.Add(1)
	return t, nil
}

// nodeStatus is the part of the admin listener's GET /cluster/status the target reads.
type nodeStatus struct {
	Node         string `json:"node"`
	Role         string `json:"role"`
	Serving      bool   `json:"serving"`
	Leader       string `json:"leader"`
	LeaderAddr   string `json:"leader_addr"`
	AppliedIndex uint64 `json:"applied_index"`
	StateID      string `json:"state_id"`
	StateHash    string `json:"state_hash"`
}

var adminHTTP = &http.Client{Timeout: time.Second}

func (n *clusterNode) status() (nodeStatus, error) {
	var st nodeStatus
	resp, err := adminHTTP.Get("http://" + n.admin + "/cluster/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("%s: GET /cluster/status: %s", n.id, resp.Status)
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st)
	return st, err
}

// running reports whether the node's process runs (it may be frozen).
func (n *clusterNode) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv == nil || n.down {
		return false
	}
	select {
	case <-n.srv.Exited():
		return false
	default:
		return true
	}
}

// waitLeader polls the running nodes' status until one serves as leader and every running
// node names it (so that a follower's hint is its address), and returns it.
func (t *clusterTarget) waitLeader(within time.Duration) (*clusterNode, error) {
	deadline := time.Now().Add(within)
	var last string
	for {
		var leader *clusterNode
		agree := true
		var states []string
		for _, n := range t.nodes {
			if !n.running() {
				continue
			}
			st, err := n.status()
			if err != nil {
				agree = false
				states = append(states, err.Error())
				continue
			}
			states = append(states, fmt.Sprintf("%s:%s serving=%v leader=%s@%s", n.id, st.Role, st.Serving, st.Leader, st.LeaderAddr))
			if st.Serving && st.Role == "leader" {
				leader = n
			}
		}
		if leader != nil {
			for _, n := range t.nodes {
				if !n.running() || n == leader {
					continue
				}
				if st, err := n.status(); err != nil || st.LeaderAddr != leader.addr {
					agree = false
				}
			}
			if agree {
				return leader, nil
			}
		}
		last = strings.Join(states, "; ")
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("cluster: no leader known to every running node within %v (last: %s)", within, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (t *clusterTarget) Kind() string            { return "cluster3" }
func (t *clusterTarget) Endpoints() []string     { return append([]string(nil), t.order...) }
func (t *clusterTarget) MinLease() time.Duration { return clusterMinLease }

// Leader is the client address of the node that serves now (waiting for an election).
func (t *clusterTarget) Leader() (string, error) {
	n, err := t.waitLeader(clusterReady)
	if err != nil {
		return "", err
	}
	return n.addr, nil
}

// stopLeader finds the leader and stops it with stop (SIGTERM or SIGKILL, waiting for the exit).
func (t *clusterTarget) stopLeader(stop func(*testserver.Server) error) error {
	n, err := t.waitLeader(clusterReady)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.down = true
	srv := n.srv
	n.mu.Unlock()
	t.mu.Lock()
	t.exited = srv.Exited()
	t.planned++
	t.mu.Unlock()
	return stop(srv)
}

// UnplannedElections counts the leader changes the runner did not cause: a leader that stepped
// down because it lost contact with a quorum for a leader lease (75 ms at clusterTiming: a
// process starved on a loaded machine), and elections beyond the first and one per Stop or
// Kill of the leader.
func (t *clusterTarget) UnplannedElections() int {
	elections, stepdowns := 0, 0
	for _, nd := range t.nodes {
		if nd.srv != nil {
			log := nd.srv.Log()
			elections += strings.Count(log, `msg="cluster: this node leads and serves clients"`)
			stepdowns += strings.Count(log, "failed to contact quorum of nodes, stepping down")
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	stepdowns = max(0, stepdowns-t.plannedStepdowns)
	return stepdowns + max(0, elections-t.planned-stepdowns)
}

// Stop stops the leader gracefully (SIGTERM: it hands leadership over, sends GOAWAY with the
// new leader's address, and exits) and waits for it to exit.
func (t *clusterTarget) Stop() error {
	return t.stopLeader(func(s *testserver.Server) error { return s.Stop() })
}

// Kill kills the leader (SIGKILL: a crash) and waits for it to exit.
func (t *clusterTarget) Kill() error {
	return t.stopLeader(func(s *testserver.Server) error { s.Kill(); return nil })
}

// Restart starts the stopped or killed nodes again on their addresses and data directories,
// and waits until a leader serves and every node knows it.
func (t *clusterTarget) Restart() error {
	for _, n := range t.nodes {
		n.mu.Lock()
		down := n.down
		n.mu.Unlock()
		if !down {
			continue
		}
		if err := n.srv.Respawn(); err != nil {
			return fmt.Errorf("%s: %v", n.id, err)
		}
		n.mu.Lock()
		n.down = false
		n.mu.Unlock()
	}
	_, err := t.waitLeader(clusterReady)
	return err
}

// FreezeLeader stops the leader with SIGSTOP (the others elect another one; the frozen node's
// kernel still accepts connections) and returns the function that resumes it. The election it
// causes is planned.
func (t *clusterTarget) FreezeLeader() (thaw func() error, err error) {
	n, err := t.waitLeader(clusterReady)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.planned++          // the election it causes
	t.plannedStepdowns++ // and the frozen leader's step-down when it wakes (it lost its quorum)
	t.mu.Unlock()
	if err := n.srv.Freeze(); err != nil {
		return nil, err
	}
	return n.srv.Thaw, nil
}

// Freeze stops every node with SIGSTOP (a cluster that answers nothing); Thaw resumes them.
func (t *clusterTarget) Freeze() error {
	for _, n := range t.nodes {
		if n.running() {
			if err := n.srv.Freeze(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (t *clusterTarget) Thaw() error {
	var errs []error
	for _, n := range t.nodes {
		if n.running() {
			errs = append(errs, n.srv.Thaw())
		}
	}
	return errors.Join(errs...)
}

// Exited is closed when the node stopped by the last Stop or Kill has exited.
func (t *clusterTarget) Exited() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exited == nil {
		ch := make(chan struct{})
		return ch
	}
	return t.exited
}

// Log is every node's log, node by node.
func (t *clusterTarget) Log() string {
	var b strings.Builder
	for _, n := range t.nodes {
		fmt.Fprintf(&b, "--- %s client %s raft %s admin %s:\n", n.id, n.addr, n.raft, n.admin)
		if n.srv != nil {
			b.WriteString(n.srv.Log())
		}
	}
	return b.String()
}

// Converged waits until every running node reports the same state id and state hash at the
// same applied index, twice in a row.
func (t *clusterTarget) Converged(within time.Duration) error {
	deadline := time.Now().Add(within)
	var prev, last string
	for {
		var round []string
		ok := true
		for _, n := range t.nodes {
			if !n.running() {
				continue
			}
			st, err := n.status()
			if err != nil {
				ok, last = false, err.Error()
				break
			}
			round = append(round, fmt.Sprintf("applied=%d hash=%s state=%s", st.AppliedIndex, st.StateHash, st.StateID))
		}
		if ok {
			same := true
			for _, r := range round {
				same = same && r == round[0]
			}
			if same && len(round) > 0 && round[0] == prev {
				return nil
			}
			last = strings.Join(round, "; ")
			prev = ""
			if same && len(round) > 0 {
				prev = round[0]
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster: nodes did not converge within %v (last: %s)", within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close kills every node (nothing of the cluster outlives the scenario, so a graceful stop
// would only cost time) and removes the data directories.
func (t *clusterTarget) Close() {
	if t.planned > 0 {
		clusterStats.unplanned.Add(int64(t.UnplannedElections()))
	}
	var wg sync.WaitGroup
	for _, n := range t.nodes {
		if n.srv != nil {
			wg.Add(1)
			go func() { defer wg.Done(); n.srv.Thaw(); n.srv.Kill() }()
		}
	}
	wg.Wait()
	for _, n := range t.nodes {
		if n.dir != "" {
			os.RemoveAll(n.dir)
		}
	}
}
