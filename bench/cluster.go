package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Clusters on loopback: n Ticketing nodes (Raft), or n etcd members, started and stopped by the
// harness, each process by its PID. A cluster can kill one member (SIGKILL), restart it on its
// own data directory, and say which member leads.

// cluster is a running n-member cluster of one system.
type cluster interface {
	system() string
	// clientAddr is what the drivers connect to: Ticketing's leader, or etcd's endpoints.
	clientAddr() (string, error)
	// leader is the index of the member that leads now.
	leader(timeout time.Duration) (int, error)
	target(leader int) target
	member(i int) *server
	kill(i int) // SIGKILL, and wait for the process to exit
	restart(i int) error
	// settled waits until member i (restarted) follows the leader again.
	settled(i int, timeout time.Duration) error
	stop()
}

// --- Ticketing -------------------------------------------------------------------------------

type tkNode struct {
	id, host, addr, raftAddr, dir string
	env                           []string
	srv                           *server
	starts                        int
}

type tkCluster struct {
	bin   string
	nodes []*tkNode
}

// startTicketingCluster starts n nodes that bootstrap one cluster (node-to-node secret, no
// client auth, admin listener off), and waits until one of them leads. Node i listens on
// hosts[i] when given (a loopback address of its own: a fault can then cut it off by address),
// else on 127.0.0.1.
func startTicketingCluster(bin, dir string, n int, timing, store string, extraEnv []string, hosts ...string) (*tkCluster, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		c := &tkCluster{bin: bin}
		var peers []string
		for i := 0; i < n; i++ {
			host := "127.0.0.1"
			if i < len(hosts) {
				host = hosts[i]
			}
			cp, err := freePortOn(host)
			if err != nil {
				return nil, err
			}
			rp, err := freePortOn(host)
			if err != nil {
				return nil, err
			}
			nd := &tkNode{id: fmt.Sprintf("n%d", i+1), host: host, addr: net.JoinHostPort(host, fmt.Sprint(cp)),
				raftAddr: net.JoinHostPort(host, fmt.Sprint(rp)), dir: filepath.Join(dir, fmt.Sprintf("a%d-n%d", attempt, i+1))}
			if err := os.MkdirAll(nd.dir, 0o755); err != nil {
				return nil, err
			}
			peers = append(peers, nd.id+"="+nd.raftAddr)
			c.nodes = append(c.nodes, nd)
		}
		for _, nd := range c.nodes {
			nd.env = append([]string{
				"TICKETING_NODE_ID=" + nd.id, "TICKETING_PEERS=" + strings.Join(peers, ","),
				"TICKETING_CLUSTER_SECRET=bench-cluster-secret", "TICKETING_ADDR=" + nd.addr,
				"TICKETING_DATA_DIR=" + filepath.Join(nd.dir, "data"), "TICKETING_ADMIN_ADDR=off",
				"TICKETING_RAFT_TIMING=" + timing,
			}, extraEnv...)
			if store != "" {
				nd.env = append(nd.env, "TICKETING_RAFT_STORE="+store)
			}
		}
		lastErr = nil
		for i := range c.nodes {
			if err := c.restart(i); err != nil {
				lastErr = err
				break
			}
		}
		if lastErr == nil {
			if _, lastErr = c.leader(30 * time.Second); lastErr == nil {
				return c, nil
			}
		}
		c.stop()
	}
	return nil, lastErr
}

func (c *tkCluster) system() string { return "ticketing" }

func (c *tkCluster) member(i int) *server { return c.nodes[i].srv }

func (c *tkCluster) restart(i int) error {
	nd := c.nodes[i]
	nd.starts++
	srv, err := spawn(fmt.Sprintf("ticketing-%s-%d", nd.id, nd.starts), nd.dir, nd.env, true, c.bin, "server")
	if err != nil {
		return fmt.Errorf("node %s: %w", nd.id, err)
	}
	nd.srv = srv
	return nil
}

// leader finds the leader the way a client does: connect, and follow CHALLENGE NOT_LEADER's
// hint. The leader is the node that completes a handshake.
func (c *tkCluster) leader(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		for i, nd := range c.nodes {
			if nd.srv == nil || !nd.srv.alive() {
				continue
			}
			nc, _, err := dialSession(nd.addr, newSession().id, 2*time.Second)
			if err == nil {
				nc.Close()
				return i, nil
			}
			lastErr = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1, fmt.Errorf("no Ticketing node led within %v: %v", timeout, lastErr)
}

func (c *tkCluster) clientAddr() (string, error) {
	i, err := c.leader(30 * time.Second)
	if err != nil {
		return "", err
	}
	return c.nodes[i].addr, nil
}

func (c *tkCluster) endpoints() []string {
	var eps []string
	for _, nd := range c.nodes {
		eps = append(eps, nd.addr)
	}
	return eps
}

func (c *tkCluster) target(leader int) target {
	return clusterTarget("ticketing", c, len(c.nodes), leader)
}

func (c *tkCluster) kill(i int) { killServer(c.nodes[i].srv) }

// settled: node i answers a new connection with NOT_LEADER and the leader's address (it has
// heard from the leader), or leads itself.
func (c *tkCluster) settled(i int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		nc, _, err := dialSession(c.nodes[i].addr, newSession().id, 2*time.Second)
		if err == nil {
			nc.Close()
			return nil
		}
		var nl *notLeaderError
		if errors.As(err, &nl) && nl.hint != "" {
			return nil
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("node %s did not rejoin within %v: %v", c.nodes[i].id, timeout, lastErr)
}

func (c *tkCluster) stop() {
	for _, nd := range c.nodes {
		if nd.srv != nil {
			nd.srv.stop()
		}
	}
}

// --- etcd ------------------------------------------------------------------------------------

type etcdMember struct {
	name, client, peer, dir string // client and peer: host:port
	args                    []string
	srv                     *server
	starts                  int
}

type etcdCluster struct {
	members []*etcdMember
}

// startEtcdCluster starts n etcd members (default settings: fsync on, heartbeat 100 ms,
// election timeout 1 s) forming one new cluster, and waits until it accepts a write.
func startEtcdCluster(dir string, n int) (*etcdCluster, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		c := &etcdCluster{}
		var initial []string
		for i := 0; i < n; i++ {
			cp, err := freePort()
			if err != nil {
				return nil, err
			}
			pp, err := freePort()
			if err != nil {
				return nil, err
			}
			m := &etcdMember{name: fmt.Sprintf("m%d", i+1), client: fmt.Sprintf("127.0.0.1:%d", cp),
				peer: fmt.Sprintf("127.0.0.1:%d", pp), dir: filepath.Join(dir, fmt.Sprintf("etcd-a%d-m%d", attempt, i+1))}
			if err := os.MkdirAll(m.dir, 0o755); err != nil {
				return nil, err
			}
			initial = append(initial, m.name+"=http://"+m.peer)
			c.members = append(c.members, m)
		}
		for _, m := range c.members {
			curl, purl := "http://"+m.client, "http://"+m.peer
			m.args = []string{"--name", m.name, "--data-dir", filepath.Join(m.dir, "data"),
				"--listen-client-urls", curl, "--advertise-client-urls", curl,
				"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
				"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
				"--initial-cluster-token", "bench-" + strconv.Itoa(attempt),
				"--log-level", "warn", "--logger", "zap", "--quota-backend-bytes", strconv.Itoa(4 << 30)}
		}
		lastErr = nil
		for i := range c.members {
			if err := c.restart(i); err != nil {
				lastErr = err
				break
			}
		}
		if lastErr == nil {
			if lastErr = c.waitWrite(30 * time.Second); lastErr == nil {
				return c, nil
			}
		}
		c.stop()
	}
	return nil, lastErr
}

func (c *etcdCluster) system() string { return "etcd" }

func (c *etcdCluster) member(i int) *server { return c.members[i].srv }

func (c *etcdCluster) restart(i int) error {
	m := c.members[i]
	m.starts++
	srv, err := spawn(fmt.Sprintf("etcd-%s-%d", m.name, m.starts), m.dir, nil, false, "etcd", m.args...)
	if err != nil {
		return err
	}
	srv.addr = m.client
	m.srv = srv
	return nil
}

func (c *etcdCluster) endpoints() string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.client)
	}
	return strings.Join(eps, ",")
}

func (c *etcdCluster) clientAddr() (string, error) { return c.endpoints(), nil }

func (c *etcdCluster) waitWrite(timeout time.Duration) error {
	cli, err := newEtcdClient(c.endpoints())
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, m := range c.members {
			if !m.srv.alive() {
				return fmt.Errorf("etcd member %s exited; see %s", m.name, m.srv.log.Name())
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Put(ctx, "/bench/ready", "1")
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("the etcd cluster did not accept a write within the time")
}

// status asks member i for its view: its own id and the leader's.
func (c *etcdCluster) status(cli *clientv3.Client, i int) (self, leader uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := cli.Status(ctx, c.members[i].client)
	if err != nil {
		return 0, 0, err
	}
	return st.Header.MemberId, st.Leader, nil
}

func (c *etcdCluster) leader(timeout time.Duration) (int, error) {
	cli, err := newEtcdClient(c.endpoints())
	if err != nil {
		return -1, err
	}
	defer cli.Close()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		for i, m := range c.members {
			if m.srv == nil || !m.srv.alive() {
				continue
			}
			self, lead, err := c.status(cli, i)
			if err == nil && lead != 0 && self == lead {
				return i, nil
			}
			lastErr = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1, fmt.Errorf("no etcd member led within %v: %v", timeout, lastErr)
}

func (c *etcdCluster) target(leader int) target {
	return clusterTarget("etcd", c, len(c.members), leader)
}

func (c *etcdCluster) kill(i int) { killServer(c.members[i].srv) }

// settled: member i reports a leader other than none.
func (c *etcdCluster) settled(i int, timeout time.Duration) error {
	cli, err := newEtcdClient(c.endpoints())
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		_, lead, err := c.status(cli, i)
		if err == nil && lead != 0 {
			return nil
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("etcd member %s did not rejoin within %v: %v", c.members[i].name, timeout, lastErr)
}

func (c *etcdCluster) stop() {
	for _, m := range c.members {
		if m.srv != nil {
			m.srv.stop()
		}
	}
}

// --- shared ------------------------------------------------------------------------------------

// clusterTarget measures a cluster: the leader's RSS, every member's CPU.
func clusterTarget(name string, c cluster, n, leader int) target {
	t := target{name: name + "-cluster", pids: []int{c.member(leader).pid()}}
	for i := 0; i < n; i++ {
		if i != leader {
			t.pids = append(t.pids, c.member(i).pid())
		}
	}
	t.alive = func() bool {
		for i := 0; i < n; i++ {
			if !c.member(i).alive() {
				return false
			}
		}
		return true
	}
	return t
}

// killServer sends SIGKILL to s's PID and waits (bounded) until the process has exited.
func killServer(s *server) {
	if s == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
	s.log.Close()
}
