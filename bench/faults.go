package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Failover by fault kind, with the official clients (issue: "a frozen leader is left as fast
// as a dead one"). One 3-node Ticketing cluster; a client program (bench/goclient -loop, or
// bench/pyloop.py on the Python client) with default options on every endpoint acquires a new
// key (wait up to 10 s) and releases it in a loop, printing the time of every success. Per
// fault kind and client, trials times: the harness finds the leader, applies the fault, and
// measures the time from the fault to the client's first successful acquire after it:
//
//	kill   SIGKILL of the leader (restarted on its directory after the trial)
//	stop   SIGSTOP of the leader, held faultFreeze (its kernel still accepts connections and
//	       never answers), then SIGCONT: it wakes as a follower
//	cut    the leader cut off from everything for faultFreeze: every packet from or to its
//	       loopback address dropped (an nftables table of the harness's own, removed after;
//	       needs root and nft, else skipped), then reconnected: it rejoins as a follower
//
// The nodes listen on loopback addresses of their own (faultHosts), and send their Raft
// traffic from them too, so one node can be cut off by address.

const (
	faultFreeze = 5 * time.Second
	faultBound  = 20 * time.Second
)

var faultHosts = []string{"127.0.0.31", "127.0.0.32", "127.0.0.33"}

// nftCut drops every packet from or to host in an nftables table of its own; the returned func
// removes the table (and with it the cut).
func nftCut(host string) (undo func(), err error) {
	table := fmt.Sprintf("ticketing_bench_%d", os.Getpid())
	rules := fmt.Sprintf("table inet %s {\n\tchain out {\n\t\ttype filter hook output priority 0; policy accept;\n\t\tip saddr %s drop\n\t\tip daddr %s drop\n\t}\n}\n", table, host, host)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nft: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return func() { exec.Command("nft", "delete", "table", "inet", table).Run() }, nil
}

// cutAvailable says why the cut fault cannot run here ("" when it can).
func cutAvailable() string {
	if os.Geteuid() != 0 {
		return "needs root (nftables)"
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return "needs nft (Debian package nftables; make setup installs it)"
	}
	undo, err := nftCut("127.0.0.39")
	if err != nil {
		return err.Error()
	}
	undo()
	return ""
}

// loopClient is a running looping client program.
type loopClient struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	oks   []loopOK
	errs  []string
	exit  error // the program's exit, once done is closed
	done  chan struct{}
}

// loopOK is one successful acquire: when the call started and when it returned.
type loopOK struct{ start, end time.Time }

func startLoopClient(name string, argv []string) (*loopClient, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &loopClient{name: name, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.SplitN(sc.Text(), " ", 3)
			if len(f) < 2 {
				continue
			}
			ns, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				continue
			}
			c.mu.Lock()
			switch f[0] {
			case "ok":
				if len(f) == 3 {
					if end, err := strconv.ParseInt(f[2], 10, 64); err == nil {
						c.oks = append(c.oks, loopOK{time.Unix(0, ns), time.Unix(0, end)})
					}
				}
			case "err":
				if len(c.errs) < 1000 && len(f) == 3 {
					c.errs = append(c.errs, f[2])
				}
			}
			c.mu.Unlock()
		}
		err := cmd.Wait()
		c.mu.Lock()
		c.exit = err
		c.mu.Unlock()
	}()
	return c, nil
}

func (c *loopClient) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.oks)
}

// firstOKAfter is the end of the first successful acquire started after t (zero if none yet):
// an acquire answered just after the fault but decided before it does not count.
func (c *loopClient) firstOKAfter(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ok := range c.oks {
		if ok.start.After(t) {
			return ok.end
		}
	}
	return time.Time{}
}

// waitOKs waits for n more successes (bounded).
func (c *loopClient) waitOKs(n int, bound time.Duration) error {
	target := c.count() + n
	deadline := time.Now().Add(bound)
	for c.count() < target {
		select {
		case <-c.done:
			c.mu.Lock()
			defer c.mu.Unlock()
			last := ""
			if len(c.errs) > 0 {
				last = "; its last error: " + c.errs[len(c.errs)-1]
			}
			return fmt.Errorf("the %s client exited (%v)%s", c.name, c.exit, last)
		default:
		}
		if time.Now().After(deadline) {
			c.mu.Lock()
			last := ""
			if len(c.errs) > 0 {
				last = ": last error " + c.errs[len(c.errs)-1]
			}
			c.mu.Unlock()
			return fmt.Errorf("the %s client made no progress within %v%s", c.name, bound, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

func (c *loopClient) stop() {
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
}

// faultClients lists the looping client programs this run can start: name -> argv (without
// the endpoints and seconds), or the reason it is skipped.
func (b *bench) faultClients() (argv map[string][]string, skipped map[string]string) {
	argv, skipped = map[string][]string{}, map[string]string{}
	bin := filepath.Join(b.tmp, "goclient-loop")
	if err := runTool("goclient", 5*time.Minute, nil, "go", "build", "-o", bin, "."); err != nil {
		skipped["go"] = "build failed: " + err.Error()
	} else {
		argv["go"] = []string{bin, "-seconds", "600", "-loop"} // then the endpoints
	}
	root, _ := filepath.Abs("..")
	py := filepath.Join(root, "clients", "python", ".venv", "bin", "python")
	if _, err := os.Stat(py); err != nil {
		skipped["python"] = "clients/python/.venv is missing: run clients/python/test.sh first"
	} else {
		script, _ := filepath.Abs("pyloop.py")
		argv["python"] = []string{py, script} // then the endpoints, then the seconds
	}
	return argv, skipped
}

func (b *bench) workloadFaults() error {
	o := b.o
	argv, skipped := b.faultClients()
	noCut := cutAvailable()
	b.mu.Lock()
	b.seq++
	dir := filepath.Join(b.tmp, fmt.Sprintf("faults-cluster-%d", b.seq))
	b.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tk, err := startTicketingCluster(o.tkBin, dir, len(faultHosts), o.raftTiming, o.raftStore, o.tkEnv, faultHosts...)
	if err != nil {
		return fmt.Errorf("failover by fault: starting the cluster: %w", err)
	}
	b.mu.Lock()
	b.clusters = append(b.clusters, tk)
	b.mu.Unlock()
	defer b.stopCluster(tk)
	eps := strings.Join(tk.endpoints(), ",")
	for _, name := range []string{"go", "python"} {
		for _, fault := range []string{"kill", "stop", "cut"} {
			r := &Record{System: "ticketing", Workload: "failover_fault", Client: name, Fault: fault, Connections: 1, Pipeline: 1, Nodes: len(faultHosts)}
			b.records = append(b.records, r)
			why, skip := skipped[name]
			if fault == "cut" && noCut != "" {
				why, skip = noCut, true
			}
			if skip {
				r.Skipped = why
				logf("failover by fault %s/%s: skipped: %s", fault, name, why)
				continue
			}
			args := append(append([]string(nil), argv[name]...), eps)
			if name == "python" {
				args = append(args, "600")
			}
			trials, err := runFaultTrials(tk, name, args, fault, o.failoverTrials)
			r.FailoverMs, r.FailoverMedianMs, r.FailoverMinMs, r.FailoverMaxMs, r.FailoverFailed = failoverStats(trials)
			r.Runs, r.RunsMetric = r.FailoverMs, "failover_ms"
			r.OpsCounting = "ms from the fault to the client's first successful acquire after it"
			if err != nil {
				r.Note = "stopped early: " + err.Error()
				logf("failover by fault %s/%s: %v (after %d trials)", fault, name, err, len(trials))
			}
			logf("failover by fault %-4s %-6s median %.0f ms (min %.0f, max %.0f) over %d trials, %d without a success",
				fault, name, r.FailoverMedianMs, r.FailoverMinMs, r.FailoverMaxMs, len(trials), r.FailoverFailed)
		}
	}
	return nil
}

// runFaultTrials starts the client, then per trial: 20 successes, the fault on the leader, the
// time to the first success after it, the leader restored (restarted, or woken) and settled.
func runFaultTrials(tk *tkCluster, name string, argv []string, fault string, trials int) ([]failoverTrial, error) {
	c, err := startLoopClient(name, argv)
	if err != nil {
		return nil, err
	}
	defer c.stop()
	var out []failoverTrial
	for t := 0; t < trials; t++ {
		if err := c.waitOKs(20, faultBound); err != nil {
			return out, err
		}
		lead, err := tk.leader(faultBound)
		if err != nil {
			return out, err
		}
		srv := tk.member(lead)
		tr := failoverTrial{killed: lead, newLeader: -1, ms: -1}
		var uncut func()
		t0 := time.Now()
		switch fault {
		case "kill":
			tk.kill(lead)
		case "stop":
			srv.cmd.Process.Signal(syscall.SIGSTOP)
		case "cut":
			undo, err := nftCut(tk.nodes[lead].host)
			if err != nil {
				return out, err
			}
			defer undo() // on an early return; the trial itself undoes it below (twice is harmless)
			uncut = undo
			t0 = time.Now() // the cut is in force from here (nft takes a few ms to start)
		}
		for deadline := t0.Add(faultBound); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if ok := c.firstOKAfter(t0); !ok.IsZero() {
				tr.ms = round1(float64(ok.Sub(t0).Microseconds()) / 1000)
				break
			}
		}
		switch fault {
		case "kill":
			if err := tk.restart(lead); err != nil {
				return append(out, tr), err
			}
		case "stop":
			time.Sleep(time.Until(t0.Add(faultFreeze)))
			srv.cmd.Process.Signal(syscall.SIGCONT)
		case "cut":
			time.Sleep(time.Until(t0.Add(faultFreeze)))
			uncut()
		}
		if nl, err := tk.leader(faultBound); err == nil {
			tr.newLeader = nl
		}
		out = append(out, tr)
		if err := tk.settled(lead, 30*time.Second); err != nil {
			return out, err
		}
		time.Sleep(500 * time.Millisecond)
	}
	return out, nil
}
