package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ticketing/ticketing/internal/deploy/deploytest"
	"github.com/ticketing/ticketing/internal/server"
	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/internal/version"
	"github.com/ticketing/ticketing/wire"
)

// Operating a cluster (issue 30): `ticketing cluster status` as one row per member from each
// member's own view, `cluster wait-ready`, membership changes sent to a follower, the cluster's
// timing metrics, and a follower's inspection API (defect 7). Real binaries on 127.0.0.1, each
// node's admin listener on its client port + 1 (the derived address), its Raft port next.

type clusterNode struct {
	id, addr, admin, raft string
	cmd                   *exec.Cmd
	n                     *deploytest.Node
}

// startCluster3 starts a 3-node cluster and returns its nodes, in id order.
func startCluster3(t *testing.T) []*clusterNode {
	t.Helper()
	bin := deploytest.Binary(t)
	var nodes []*clusterNode
	var peers []string
	var taken []int
	for i := 1; i <= 3; i++ {
		p := freePortRun3(t)
		for tries := 0; overlaps(taken, p) && tries < 20; tries++ {
			p = freePortRun3(t) // the runs are not reserved until the nodes start: keep them apart
		}
		taken = append(taken, p)
		nd := &clusterNode{id: "n" + strconv.Itoa(i), addr: "127.0.0.1:" + strconv.Itoa(p),
			admin: "127.0.0.1:" + strconv.Itoa(p+1), raft: "127.0.0.1:" + strconv.Itoa(p+2)}
		nodes = append(nodes, nd)
		peers = append(peers, nd.id+"="+nd.raft)
	}
	for _, nd := range nodes {
		nd.cmd = exec.Command(bin, "server", "--addr", nd.addr, "--node-id", nd.id, "--peers", strings.Join(peers, ","),
			"--data-dir", t.TempDir())
		nd.cmd.Env = append(nd.cmd.Environ(), "TICKETING_CLUSTER_SECRET=page-test-secret", "TICKETING_RAFT_TIMING=2", "TICKETING_ADMIN_ADDR=", "TICKETING_TOKEN=", "TICKETING_TOKEN_FILE=")
		nd.n = deploytest.StartNode(t, nd.cmd)
		if nd.n.Admin != nd.admin {
			t.Fatalf("%s: admin listener on %s, want the derived %s", nd.id, nd.n.Admin, nd.admin)
		}
	}
	return nodes
}

// freePortRun3 is a port p with p+1 and p+2 free too (client, admin, Raft).
func freePortRun3(t *testing.T) int {
	t.Helper()
	p, err := testserver.FreePortRun([]string{"127.0.0.1"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func overlaps(taken []int, p int) bool {
	for _, q := range taken {
		if p > q-3 && p < q+3 {
			return true
		}
	}
	return false
}

func clusterAddrs(nodes []*clusterNode) string {
	var a []string
	for _, nd := range nodes {
		a = append(a, nd.addr)
	}
	return strings.Join(a, ",")
}

// runCLI runs the binary with args (TICKETING_* cleared but for env) and returns stdout, stderr
// and the exit code.
func runCLI(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(deploytest.Binary(t), args...)
	cmd.Env = append(cmd.Environ(), "TICKETING_ADDR=", "TICKETING_ADMIN_ADDR=", "TICKETING_ADMIN_TOKEN=", "TICKETING_ADMIN_TOKEN_FILE=")
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	}
	t.Fatalf("%v: %v", args, err)
	return "", "", 0
}

// waitClusterReady runs `cluster wait-ready` against nodes (bounded by its own --timeout).
func waitClusterReady(t *testing.T, nodes []*clusterNode) {
	t.Helper()
	out, errOut, code := runCLI(t, nil, "cluster", "wait-ready", "--addr", clusterAddrs(nodes), "--timeout", "40s")
	if code != 0 || !strings.HasPrefix(out, "ready: leader n") {
		t.Fatalf("cluster wait-ready: exit %d\n%s%s", code, out, errOut)
	}
}

func statusJSON(t *testing.T, nodes []*clusterNode) *ClusterView {
	t.Helper()
	out, errOut, code := runCLI(t, nil, "cluster", "status", "--json", "--addr", clusterAddrs(nodes))
	var v ClusterView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("cluster status --json: exit %d\n%s%s", code, out, errOut)
	}
	return &v
}

func leaderOf(t *testing.T, nodes []*clusterNode, v *ClusterView) (leader *clusterNode, followers []*clusterNode) {
	t.Helper()
	for _, nd := range nodes {
		if nd.id == v.Leader {
			leader = nd
		} else {
			followers = append(followers, nd)
		}
	}
	if leader == nil {
		t.Fatalf("no leader in %+v", v)
	}
	return leader, followers
}

func httpGet(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestClusterStatusTableAndWaitReady: `cluster wait-ready` exits 0 once the cluster has a
// leader and every member is ready and caught up; `cluster status` prints one row per member
// from that member's own view (role, term, commit and applied index, last contact, version,
// ready, the admin listener that answered) and --json the same; with one member stopped, status
// marks it as not answering and names the address that did not answer, and wait-ready exits 1
// after its --timeout naming the member.
func TestClusterStatusTableAndWaitReady(t *testing.T) {
	nodes := startCluster3(t)
	waitClusterReady(t, nodes)

	out, errOut, code := runCLI(t, nil, "cluster", "status", "--addr", clusterAddrs(nodes))
	if code != 0 {
		t.Fatalf("cluster status: exit %d\n%s%s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 5 || !regexp.MustCompile(`^leader n[123] \(client address 127\.0\.0\.1:\d+\), term \d+$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^MEMBER +RAFT ADDR +VOTER +ROLE +TERM +COMMIT +APPLIED +LAST CONTACT +VERSION +READY +ADMIN$`).MatchString(lines[1]) {
		t.Fatalf("cluster status:\n%s", out)
	}
	roles := map[string]int{}
	for i, nd := range nodes {
		row := regexp.MustCompile(`^` + nd.id + ` +` + regexp.QuoteMeta(nd.raft) + ` +yes +(leader|follower) +\d+ +\d+ +\d+ +(-|\d+(\.\d+)?[µm]?s) +` +
			regexp.QuoteMeta(version.Version) + ` +yes +` + regexp.QuoteMeta(nd.admin) + `$`).FindStringSubmatch(lines[2+i])
		if row == nil {
			t.Fatalf("row of %s:\n%s", nd.id, out)
		}
		roles[row[1]]++
	}
	if roles["leader"] != 1 || roles["follower"] != 2 {
		t.Fatalf("roles %v:\n%s", roles, out)
	}

	v := statusJSON(t, nodes)
	if len(v.Members) != 3 || v.Leader == "" || len(v.Unreachable) != 0 {
		t.Fatalf("status --json: %+v", v)
	}
	for _, m := range v.Members {
		if m.Status == nil || m.Status.Node != m.ID || !m.Status.Ready || m.Status.Version != version.Version || !m.Member || !m.Voter {
			t.Fatalf("status --json member %+v", m)
		}
	}
	leader, followers := leaderOf(t, nodes, v)
	_ = leader

	// One follower stops: it shows as not answering; wait-ready times out naming it.
	gone := followers[0]
	gone.cmd.Process.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, _, code := runCLI(t, nil, "healthcheck", "--admin-addr", gone.admin, "--timeout", "1s"); code != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still answers after SIGTERM", gone.id)
		}
	}
	out, errOut, code = runCLI(t, nil, "cluster", "status", "--addr", clusterAddrs(nodes))
	if code != 0 || !regexp.MustCompile(`(?m)^`+gone.id+` +`+regexp.QuoteMeta(gone.raft)+` +yes +\? +- +- +- +- +- +no answer +-$`).MatchString(out) ||
		!strings.Contains(out, gone.admin+": unreachable: ") || !strings.Contains(out, gone.id+": none of the admin addresses asked answered") {
		t.Fatalf("cluster status with %s stopped: exit %d\n%s%s", gone.id, code, out, errOut)
	}
	start := time.Now()
	out, errOut, code = runCLI(t, nil, "cluster", "wait-ready", "--addr", clusterAddrs(nodes), "--timeout", "1s")
	if code != ExitNo || !strings.Contains(errOut, "not ready within 1s: "+gone.id+": no answer") || time.Since(start) > 15*time.Second {
		t.Fatalf("cluster wait-ready with %s stopped: exit %d after %v\n%s%s", gone.id, code, time.Since(start), out, errOut)
	}
}

// TestClusterChangesFollowTheLeader (issue 30, defect 2's last part): a membership change sent to
// a follower is refused with 409 naming the leader (id, client address, admin listener: headers
// and message), and `ticketing cluster` asks the leader next: with addresses derived from the
// follower's client address alone, a transfer goes through and a bad removal gets the leader's
// own refusal.
func TestClusterChangesFollowTheLeader(t *testing.T) {
	nodes := startCluster3(t)
	waitClusterReady(t, nodes)
	leader, followers := leaderOf(t, nodes, statusJSON(t, nodes))
	f := followers[0]

	// The server's end: the follower refuses, naming the leader.
	resp, err := http.Post("http://"+f.admin+"/cluster/remove", "application/json", strings.NewReader(`{"id":"n9"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 409 || resp.Header.Get("X-Ticketing-Leader") != leader.id || resp.Header.Get("X-Ticketing-Leader-Addr") != leader.addr ||
		resp.Header.Get("X-Ticketing-Leader-Admin") != leader.admin ||
		!strings.Contains(string(body), "not the leader: the leader is "+leader.id+" (client address "+leader.addr+"); send membership changes to its admin listener "+leader.admin) {
		t.Fatalf("POST /cluster/remove on follower %s: %d %v\n%s", f.id, resp.StatusCode, resp.Header, body)
	}

	// The CLI's end: only the follower given; the leader's refusal comes back.
	out, errOut, code := runCLI(t, nil, "cluster", "remove", "n9", "--addr", f.addr)
	if code != ExitNo || !strings.Contains(errOut, f.admin+" is not the leader; asking the leader "+leader.id+" at "+leader.admin) ||
		!strings.Contains(errOut, "no member n9") {
		t.Fatalf("cluster remove n9 via follower %s: exit %d\n%s%s", f.id, code, out, errOut)
	}
	// With --admin-addr naming the follower only, the follower's answer leads there too.
	out, errOut, code = runCLI(t, nil, "cluster", "transfer-leader", f.id, "--admin-addr", f.admin)
	if code != 0 || !strings.Contains(errOut, "asking the leader "+leader.id+" at "+leader.admin) || !strings.HasPrefix(out, "done by "+leader.id+" (admin "+leader.admin+")\n") {
		t.Fatalf("cluster transfer-leader %s via the follower: exit %d\n%s%s", f.id, code, out, errOut)
	}
	waitClusterReady(t, nodes)
	if v := statusJSON(t, nodes); v.Leader != f.id {
		t.Fatalf("leader after the transfer: %s, want %s", v.Leader, f.id)
	}
}

// TestClusterMetricsAndFollowerInspection: /metrics of a cluster node has the leader-change
// counter, the commit and log-fsync latency histograms and the apply lag, and parses as the
// Prometheus text format; a follower's /api/stats names the leader (and its admin listener) and
// counts the cluster's grants, and its /api/locks shows a holder connected to the leader as
// attached, not detached (defect 7).
func TestClusterMetricsAndFollowerInspection(t *testing.T) {
	nodes := startCluster3(t)
	waitClusterReady(t, nodes)
	leader, followers := leaderOf(t, nodes, statusJSON(t, nodes))
	c, st, err := deploytest.Dial(leader.addr, "")
	if err != nil || st != wire.StatusOK {
		t.Fatalf("dial the leader: %v %v", st, err)
	}
	defer c.NC.Close()
	for i := 0; i < 5; i++ {
		c.Acquire(t, fmt.Sprintf("m:%d", i), 0)
	}
	waitClusterReady(t, nodes) // every follower has applied the grants

	for _, nd := range []*clusterNode{leader, followers[0]} {
		code, _, text := httpGet(t, "http://"+nd.admin+"/metrics")
		if code != 200 {
			t.Fatalf("%s /metrics: %d", nd.id, code)
		}
		parser := expfmt.NewTextParser(model.LegacyValidation) // promtool's rules: legacy metric names
		fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatalf("%s /metrics does not parse: %v", nd.id, err)
		}
		for _, want := range []string{"ticketing_raft_leader_changes_total", "ticketing_raft_log_fsync_seconds", "ticketing_raft_commit_seconds", "ticketing_raft_apply_lag"} {
			if fams[want] == nil || fams[want].GetHelp() == "" {
				t.Fatalf("%s /metrics lacks %s (with its HELP)", nd.id, want)
			}
		}
		if v := fams["ticketing_raft_leader_changes_total"].Metric[0].GetCounter().GetValue(); v < 1 {
			t.Errorf("%s: leader changes %v, want at least the first", nd.id, v)
		}
		if h := fams["ticketing_raft_log_fsync_seconds"].Metric[0].GetHistogram(); h.GetSampleCount() == 0 || h.GetSampleSum() <= 0 {
			t.Errorf("%s: log fsync histogram empty: %v", nd.id, h)
		}
		if nd == leader {
			if h := fams["ticketing_raft_commit_seconds"].Metric[0].GetHistogram(); h.GetSampleCount() == 0 {
				t.Errorf("leader: commit histogram empty")
			}
		}
	}

	f := followers[0]
	_, _, body := httpGet(t, "http://"+f.admin+"/api/stats")
	var stats server.Stats
	if err := json.Unmarshal([]byte(body), &stats); err != nil {
		t.Fatal(err)
	}
	if stats.Role != "follower" || stats.Serving || stats.Node != f.id || stats.Leader != leader.id || stats.LeaderAddr != leader.addr ||
		stats.LeaderAdmin != leader.admin || stats.Grants < 5 || stats.HeldNow < 5 {
		t.Fatalf("follower /api/stats: %s", body)
	}
	_, _, body = httpGet(t, "http://"+f.admin+"/api/locks")
	var locks server.LockList
	if err := json.Unmarshal([]byte(body), &locks); err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, k := range locks.Locks {
		if strings.HasPrefix(k.Key, "m:") {
			held++
			if k.Holder == nil || !k.Holder.Attached || k.Holder.Remote != "" {
				t.Fatalf("follower /api/locks: %s's holder %+v, want attached (through the leader)", k.Key, k.Holder)
			}
		}
	}
	if held != 5 {
		t.Fatalf("follower /api/locks: %d of the 5 locks\n%s", held, body)
	}
	// And `ticketing top` on the follower says what it is.
	out, errOut, code := runCLI(t, nil, "top", "--once", "--admin-addr", f.admin)
	if code != 0 || !strings.Contains(out, "a follower: clients are served by the leader, "+leader.id+" (client address "+leader.addr+")") {
		t.Fatalf("top on a follower: exit %d\n%s%s", code, out, errOut)
	}
}
