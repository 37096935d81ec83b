package cli

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/adminhttp"
	"github.com/ticketing/ticketing/internal/deploy/deploytest"
	"github.com/ticketing/ticketing/internal/server"
)

// TestTopAndHealthcheck: `ticketing top` shows the contended key with its waiters, live
// (--count 2 adds the per-interval column), the admin client shows a key's waiters in queue
// order, and `ticketing healthcheck` answers 0 against a live admin listener and 1 against
// nothing.
func TestTopAndHealthcheck(t *testing.T) {
	bin := deploytest.Binary(t)
	n := deploytest.StartNode(t, exec.Command(bin, "server", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir", t.TempDir()))
	holder, _, err := deploytest.Dial(n.Addr, "")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.NC.Close()
	// Warm up: a fresh node's first grant may wait for the durable restart horizon (the table
	// queues it, so it would count as contention); later ones within seconds do not.
	holder.Acquire(t, "warm", 0)
	holder.Acquire(t, "hot:1", 0)
	var waiters []*deploytest.Conn
	target := &adminTarget{bases: []string{"http://" + n.Admin}, client: &adminhttp.Client{Timeout: 5 * time.Second}}
	for i := 0; i < 2; i++ {
		c, _, err := deploytest.Dial(n.Addr, "")
		if err != nil {
			t.Fatal(err)
		}
		defer c.NC.Close()
		c.Acquire(t, "hot:1", 0xFFFFFFFF) // waits without limit
		waiters = append(waiters, c)
		waitQueued(t, target, "hot:1", i+1) // in this order
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		k, err := fetchKeyInfo(context.Background(), target, "hot:1", 10)
		if err != nil {
			t.Fatal(err)
		}
		if k.WaiterCount == 2 {
			if !k.Held || k.Token == 0 || len(k.Waiters) != 2 || k.Waiters[0].Remote != waiters[0].NC.LocalAddr().String() ||
				k.Waiters[1].Remote != waiters[1].NC.LocalAddr().String() {
				t.Fatalf("key: %+v", k)
			}
			var b bytes.Buffer
			printWaiters(&b, k)
			if !regexp.MustCompile(`(?m)^1 +\S+#\d+ +` + regexp.QuoteMeta(waiters[0].NC.LocalAddr().String()) + ` .* no limit +30s$`).MatchString(b.String()) {
				t.Fatalf("waiters table:\n%s", b.String())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiters never queued: %+v", k)
		}
		time.Sleep(20 * time.Millisecond)
	}

	out, err := exec.Command(bin, "top", "--once", "--admin-addr", n.Admin).CombinedOutput()
	if err != nil {
		t.Fatalf("top --once: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^KEY +QUEUED +WAITING +HELD +HAND-OFFS +MEAN WAIT +TIMEOUTS\nhot:1 +2 +2 +yes +0 +- +0\n`).MatchString(string(out)) {
		t.Fatalf("top --once:\n%s", out)
	}
	if !strings.Contains(string(out), "held 2  waiting 2  connections 3") {
		t.Fatalf("top header:\n%s", out)
	}
	out, err = exec.Command(bin, "top", "--count", "2", "--interval", "200ms", "--admin-addr", n.Admin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "QUEUED/INTERVAL") || !regexp.MustCompile(`(?m)^hot:1 +0 +2 +2 +yes`).MatchString(string(out)) {
		t.Fatalf("top --count 2: %v\n%q", err, out)
	}

	// `ticketing inspect --waiters` adds the queue, from the admin listener.
	out, err = exec.Command(bin, "inspect", "hot:1", "--addr", n.Addr, "--waiters", "--admin-addr", n.Admin).CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?s)^key="hot:1" held=true .*waiters=2 .*\n#\s+SESSION\s+REMOTE\s+WAITED\s+WAIT LEFT\s+LEASE\n1 .*no limit.*\n2 .*no limit.*\n$`).MatchString(string(out)) {
		t.Fatalf("inspect --waiters: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "inspect", "hot:1", "--addr", n.Addr, "--waiters", "--json", "--admin-addr", n.Admin).CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || len(lines) != 2 || !strings.Contains(lines[1], `"waiter_count":2`) || !strings.Contains(lines[1], `"position":2`) {
		t.Fatalf("inspect --waiters --json: %v\n%s", err, out)
	}

	hc := exec.Command(bin, "healthcheck", "--ready", "--admin-addr", n.Admin)
	if b, err := hc.CombinedOutput(); err != nil || strings.TrimSpace(string(b)) != "ok "+n.Admin {
		t.Fatalf("healthcheck: %v %s", err, b)
	}
	port := deploytest.FreePort(t, "127.0.0.1")
	err = exec.Command(bin, "healthcheck", "--admin-addr", "127.0.0.1:"+strconv.Itoa(port), "--timeout", "2s").Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != ExitNo {
		t.Fatalf("healthcheck against nothing: %v", err)
	}
}

// waitQueued polls the admin listener until key has n waiters (10 s at most).
func waitQueued(t *testing.T, target *adminTarget, key string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		k, err := fetchKeyInfo(context.Background(), target, key, 0)
		if err != nil {
			t.Fatal(err)
		}
		if k.WaiterCount == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d waiters, want %d", key, k.WaiterCount, n)
		}
	}
}

// TestOperatorCommandsAskTheRightNode (issue 30, defect 1): with the client address a list (as
// deploy recommends) and no admin address, the operator commands derive each node's admin
// listener (client port + 1) and say which one answered, instead of falling back to
// 127.0.0.1:7071 (another server there answered for the cluster); a command about one node
// refuses a list; `cluster status` honours TICKETING_ADDR.
func TestOperatorCommandsAskTheRightNode(t *testing.T) {
	bin := deploytest.Binary(t)
	port := deploytest.FreePort(t, "127.0.0.1") // port+1 is free too: the derived admin listener
	addr := "127.0.0.1:" + strconv.Itoa(port)
	admin := "127.0.0.1:" + strconv.Itoa(port+1)
	deploytest.StartNode(t, exec.Command(bin, "server", "--addr", addr, "--data-dir", t.TempDir()))
	dead := deploytest.FreePort(t, "127.0.0.1") // nothing listens there, nor on the next port
	list := "127.0.0.1:" + strconv.Itoa(dead) + "," + addr
	env := func(cmd *exec.Cmd, kv ...string) *exec.Cmd {
		cmd.Env = append(cmd.Environ(), "TICKETING_ADMIN_ADDR=", "TICKETING_ADDR="+list)
		cmd.Env = append(cmd.Env, kv...)
		return cmd
	}
	out, err := env(exec.Command(bin, "inspect", "k", "--waiters", "--json")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"admin":"`+admin+`"`) {
		t.Fatalf("inspect --waiters --json with TICKETING_ADDR=%s: %v\n%s", list, err, out)
	}
	out, err = env(exec.Command(bin, "healthcheck")).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != ExitUsage || !strings.Contains(string(out), "checks one node") {
		t.Fatalf("healthcheck with a list of addresses: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "healthcheck")
	cmd.Env = append(cmd.Environ(), "TICKETING_ADMIN_ADDR=", "TICKETING_ADDR="+addr)
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok "+admin {
		t.Fatalf("healthcheck with TICKETING_ADDR=%s: %v\n%s", addr, err, out)
	}
	cmd = exec.Command(bin, "cluster", "status", "--json")
	cmd.Env = append(cmd.Environ(), "TICKETING_ADMIN_ADDR=", "TICKETING_ADDR="+addr)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), `"admin":"`+admin+`"`) || !strings.Contains(string(out), `"role":"single"`) {
		t.Fatalf("cluster status --json with TICKETING_ADDR=%s: %v\n%s", addr, err, out)
	}
}

func TestAdminAddrs(t *testing.T) {
	for _, c := range []struct {
		admin, client string
		want          string // comma-joined, or "error"
	}{
		{"", "", "127.0.0.1:7071"},
		{"", "10.0.0.5:9000", "10.0.0.5:9001"},
		{"", "0.0.0.0:7070", "127.0.0.1:7071"},
		{"", "a:7070, b:7070", "a:7071,b:7071"},
		{"", "[::1]:7070", "[::1]:7071"},
		{"x:1,y:2", "a:7070", "x:1,y:2"},
		{"", "nohost", "error"},
		{"", "a:65535", "error"},
		{"bogus", "", "error"},
		{"off", "", "error"},
	} {
		got, err := adminAddrs(c.admin, c.client)
		if c.want == "error" {
			if err == nil {
				t.Errorf("adminAddrs(%q, %q) = %v, want an error", c.admin, c.client, got)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != c.want {
			t.Errorf("adminAddrs(%q, %q) = %v, %v; want %s", c.admin, c.client, got, err, c.want)
		}
	}
}

// TestTopShowsEstimatesAsEstimates (issue 30, defect 8): once more keys have queued than the
// contention sketch tracks (64), a key that replaced another carries that key's count as its
// error bound. `ticketing top` (and /api/top) show such a count as an estimate, "~N", never
// "N ±E" as if N were counted, and leave out the keys whose count is mostly error, saying how
// many; /api/top?all=1 has them, with the guaranteed lower bound.
func TestTopShowsEstimatesAsEstimates(t *testing.T) {
	bin := deploytest.Binary(t)
	n := deploytest.StartNode(t, exec.Command(bin, "server", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir", t.TempDir()))
	target := &adminTarget{bases: []string{"http://" + n.Admin}, client: &adminhttp.Client{Timeout: 5 * time.Second}}
	dial := func() *deploytest.Conn {
		c, _, err := deploytest.Dial(n.Addr, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.NC.Close() })
		return c
	}
	holder, waiter := dial(), dial()
	holder.Acquire(t, "warm", 0)
	const keys = 70 // 6 more than the sketch tracks
	for i := 0; i < keys; i++ {
		holder.Acquire(t, fmt.Sprintf("s:%02d", i), 0)
	}
	for i := 0; i < keys; i++ {
		waiter.Acquire(t, fmt.Sprintf("s:%02d", i), 0xFFFFFFFF) // queues on every key, in order
	}
	hot := fmt.Sprintf("s:%02d", keys-1) // entered the sketch last, inheriting a count of 1
	waitQueued(t, target, hot, 1)
	for i := 0; i < 4; i++ {
		dial().Acquire(t, hot, 0xFFFFFFFF)
		waitQueued(t, target, hot, 2+i)
	}

	var all server.TopList
	if err := target.get(context.Background(), "/api/top?n=64&all=1", &all); err != nil {
		t.Fatal(err)
	}
	uncertain := 0
	for _, k := range all.Keys {
		if k.QueuedMin != k.Queued-k.Error || k.Uncertain != (k.Error > 0 && 2*k.Error >= k.Queued) {
			t.Fatalf("/api/top?all=1 key %+v", k)
		}
		if k.Uncertain {
			uncertain++
		}
		if k.Key == hot && (k.Error == 0 || k.Queued < 5 || k.Uncertain) {
			t.Fatalf("%s: %+v, want an estimate with an error bound, not uncertain", hot, k)
		}
	}
	if uncertain < 5 {
		t.Fatalf("/api/top?all=1: %d uncertain keys, want at least the 5 others that entered late: %+v", uncertain, all)
	}

	out, err := exec.Command(bin, "top", "--once", "--n", "64", "--admin-addr", n.Admin).CombinedOutput()
	if err != nil {
		t.Fatalf("top --once: %v\n%s", err, out)
	}
	s := string(out)
	if strings.Contains(s, "±") || !regexp.MustCompile(`(?m)^`+hot+` +~\d+ +5 +yes `).MatchString(s) ||
		!regexp.MustCompile(`(?m)^s:10 +1 +1 +yes `).MatchString(s) ||
		!strings.Contains(s, fmt.Sprintf("(%d more keys queued too few times to count", uncertain)) || !strings.Contains(s, "~N: an estimate") {
		t.Fatalf("top --once:\n%s", s)
	}
	for _, k := range all.Keys {
		if k.Uncertain && regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(k.Key)+` `).MatchString(s) {
			t.Fatalf("top shows %s, whose count is mostly error (%+v):\n%s", k.Key, k, s)
		}
	}
}
