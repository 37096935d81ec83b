// Package deploy is the launch-command generator: from a few answers (Request) it writes, per
// node, the environment, a command line, a container command, a docker-compose file and a
// systemd unit, plus the files they read (token, cluster secret) (Plan).
//
// `ticketing deploy` (internal/cli) prints a plan; the server's admin listener serves the
// generator to the admin page as POST /api/deploy (ServeDeploy, registered by cmd/ticketing).
//
// It cannot drift from the server: every setting it writes is looked up by name in the
// server's own settings table (settings.Table), and before it answers, the settings of every
// node go through the server's own parser and validation (settings.Parse) — only the files,
// which live on the target machine, are not read.
package deploy

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/ticketing/ticketing/internal/settings"
)

// Request is the answers.
type Request struct {
	Nodes       int      `json:"nodes"`         // 1 (single node), 3 or 5 (cluster); with AddNode: the existing members (default len(Hosts))
	Hosts       []string `json:"hosts"`         // one per node: host or host:port (IPv6 in brackets when with a port) where it listens and is reached (default 127.0.0.1 for one node)
	Port        int      `json:"port"`          // client port of hosts given without one (0: 7070); the admin listener is the next port
	RaftPort    int      `json:"raft_port"`     // cluster: node-to-node port (0: 7080); nodes on one host take the next ones
	Auth        bool     `json:"auth"`          // require a token (generated unless Token is given)
	TLSCert     string   `json:"tls_cert"`      // PEM files on the target machine (both or neither)
	TLSKey      string   `json:"tls_key"`       //
	TLSClientCA string   `json:"tls_client_ca"` // require client certificates signed by this CA
	RaftTLSCert string   `json:"raft_tls_cert"` // cluster: node-to-node TLS, this node's certificate and key and
	RaftTLSKey  string   `json:"raft_tls_key"`  // the CA that signs every node's (all three or none)
	RaftTLSCA   string   `json:"raft_tls_ca"`   //
	DataDir     string   `json:"data_dir"`      // default /var/lib/ticketing; nodes that share a machine get DataDir/<node id>
	MinLease    string   `json:"min_lease"`     // durations; empty: the server's default
	MaxLease    string   `json:"max_lease"`     //
	ConfigDir   string   `json:"config_dir"`    // where the token and secret files go; default /etc/ticketing
	Binary      string   `json:"binary"`        // default /usr/local/bin/ticketing
	Image       string   `json:"image"`         // container image; default ticketing:latest
	Token       string   `json:"token"`         // default: generated (32 random bytes, hex); give the existing one to keep it
	Secret      string   `json:"cluster_secret"`
	// AddNode is one more node for the existing cluster of Hosts (host or host:port): the plan
	// is that node's alone, joining (TICKETING_JOIN), and the command that adds it. It needs the
	// cluster's Secret, and its Token when Auth is on.
	AddNode   string `json:"add_node"`
	AddNodeID string `json:"add_node_id"` // default n<members+1>
}

// Plan is what the generator writes.
type Plan struct {
	Nodes  []Node `json:"nodes"`
	Token  string `json:"token,omitempty"`          // clients use it as TICKETING_TOKEN
	Secret string `json:"cluster_secret,omitempty"` //
	Files  []File `json:"files"`                    // create these on every node first
	// Warnings: what the operator must not miss (also the first notes).
	Warnings []string `json:"warnings"`
	Notes    []string `json:"notes"`
	// ClusterAdd (AddNode only): the command that adds the node, once it runs.
	ClusterAdd string `json:"cluster_add,omitempty"`
}

// Node is one node's outputs. Settings are the plain (non-container) settings.
type Node struct {
	Name      string      `json:"name"`
	Host      string      `json:"host"`                // without the port
	Port      int         `json:"port"`                // client port (the admin listener's is the next)
	RaftPort  int         `json:"raft_port,omitempty"` // cluster
	Unit      string      `json:"unit"`                // the systemd unit's file name
	Settings  [][2]string `json:"settings"`            // [flag name, value] in the settings table's order
	Env       string      `json:"env"`
	Command   string      `json:"command"`
	Container string      `json:"container"`
	Compose   string      `json:"compose"`
	Systemd   string      `json:"systemd"`
}

// File is a file the nodes read (the token, the cluster secret): create it on every node first.
type File struct {
	Path    string `json:"path"`
	Mode    string `json:"mode"`
	Content string `json:"content"`
	About   string `json:"about"`
}

// Fixed places inside the container image (deploy/Dockerfile).
const (
	containerDataDir = "/var/lib/ticketing"
	containerUID     = "65532"
)

// kv is one setting by flag name.
type kv struct{ name, value string }

// member is one node's place: its addresses and what it must not share with another node on
// the same machine (data directory, systemd unit, container volume).
type member struct {
	name, host     string
	port, raftPort int
	admin          string // admin listen address (plain start)
	dataDir        string
	unit, volume   string
	join           bool
}

func (r *Request) defaults() {
	if r.Nodes == 0 {
		r.Nodes = 1
		if r.AddNode != "" {
			r.Nodes = len(r.Hosts)
		}
	}
	if len(r.Hosts) == 0 && r.Nodes == 1 && r.AddNode == "" {
		r.Hosts = []string{"127.0.0.1"}
	}
	if r.Port == 0 {
		r.Port = 7070
	}
	if r.RaftPort == 0 {
		r.RaftPort = 7080
	}
	if r.DataDir == "" {
		r.DataDir = "/var/lib/ticketing"
	}
	if r.ConfigDir == "" {
		r.ConfigDir = "/etc/ticketing"
	}
	if r.Binary == "" {
		r.Binary = "/usr/local/bin/ticketing"
	}
	if r.Image == "" {
		r.Image = "ticketing:latest"
	}
}

func randomSecret() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported systems
	}
	return hex.EncodeToString(b[:])
}

// The patterns compile on first use, not at start: every server start would otherwise compile
// them (67 KB allocated and the regexp compiler's pages mapped in, part of a just-started
// node's resident memory) for commands that only `ticketing deploy` runs.
var (
	hostRE   = lazyRegexp(`^[A-Za-z0-9][A-Za-z0-9.\-]*$`)
	nodeIDRE = lazyRegexp(`^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$`)
	secretRE = lazyRegexp(`^[\x21-\x7e]+$`)
)

// lazyRegexp returns a function that compiles expr once, when first called.
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// splitHost reads one --hosts entry: a host name or address, with or without a port
// (host:port, [IPv6]:port; a bare IPv6 address has no port). Without one, the node takes def.
func splitHost(s string, def int) (string, int, error) {
	s = strings.TrimSpace(s)
	host, port := s, def
	switch {
	case strings.HasPrefix(s, "["):
		h, p, err := net.SplitHostPort(s)
		if err != nil && strings.HasSuffix(s, "]") {
			h, p, err = strings.TrimSuffix(s[1:], "]"), "", nil
		}
		if err != nil || !strings.Contains(h, ":") {
			return "", 0, fmt.Errorf("%q: want [IPv6] or [IPv6]:port", s)
		}
		host = h
		if p != "" {
			n, err := strconv.Atoi(p)
			if err != nil {
				return "", 0, fmt.Errorf("%q: port %q is not a number", s, p)
			}
			port = n
		}
	case strings.Count(s, ":") == 1:
		h, p, _ := strings.Cut(s, ":")
		n, err := strconv.Atoi(p)
		if err != nil {
			return "", 0, fmt.Errorf("%q: port %q is not a number", s, p)
		}
		host, port = h, n
	}
	if strings.Contains(host, ":") {
		if net.ParseIP(strings.SplitN(host, "%", 2)[0]) == nil {
			return "", 0, fmt.Errorf("%q is not an IPv6 address", s)
		}
	} else if !hostRE().MatchString(host) {
		return "", 0, fmt.Errorf("%q is not an address or a host name", s)
	}
	if port < 1 || port > 65534 {
		return "", 0, fmt.Errorf("%q: port %d: want 1..65534 (the admin listener takes the next one)", s, port)
	}
	return host, port, nil
}

// isLoopback: a loopback address or localhost: every such node runs on this one machine.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.SplitN(host, "%", 2)[0])
	return ip != nil && ip.IsLoopback()
}

// machine names the machine a host is on, as far as the answers tell.
func machine(host string) string {
	if isLoopback(host) {
		return "loopback"
	}
	return strings.ToLower(host)
}

// bindHost is what a listener on host binds, for telling collisions apart.
func bindHost(host string) string {
	if strings.EqualFold(host, "localhost") {
		return "127.0.0.1"
	}
	return strings.ToLower(host)
}

// Generate turns the answers into a plan, or says which answer the server would refuse.
func Generate(r Request) (*Plan, error) {
	r.defaults()
	joining := strings.TrimSpace(r.AddNode) != ""
	cluster := r.Nodes > 1 || joining
	switch {
	case !joining && r.Nodes != 1 && r.Nodes != 3 && r.Nodes != 5:
		return nil, fmt.Errorf("nodes: %d; want 1 (a single node), 3 or 5 (a cluster)", r.Nodes)
	case joining && (r.Nodes < 1 || r.Nodes > 6):
		return nil, fmt.Errorf("add node: give the existing members' addresses in hosts (1 to 6; %d given)", r.Nodes)
	case len(r.Hosts) != r.Nodes:
		return nil, fmt.Errorf("hosts: %d given for %d nodes; give one address per node", len(r.Hosts), r.Nodes)
	case r.Port < 1 || r.Port > 65534:
		return nil, fmt.Errorf("port %d: want 1..65534 (the admin listener takes the next one)", r.Port)
	case cluster && (r.RaftPort < 1 || r.RaftPort > 65535 || r.RaftPort == r.Port || r.RaftPort == r.Port+1):
		return nil, fmt.Errorf("raft port %d: want 1..65535, other than the client port and the admin port", r.RaftPort)
	case (r.TLSCert == "") != (r.TLSKey == ""):
		return nil, errors.New("TLS: give both the certificate and the key, or neither")
	case r.TLSClientCA != "" && r.TLSCert == "":
		return nil, errors.New("TLS client CA: needs the server's certificate and key too")
	case (r.RaftTLSCert == "") != (r.RaftTLSKey == "") || (r.RaftTLSCert == "") != (r.RaftTLSCA == ""):
		return nil, errors.New("raft TLS: give the node's certificate, its key and the CA together, or none")
	case r.RaftTLSCert != "" && !cluster:
		return nil, errors.New("raft TLS: a single node has no node-to-node traffic")
	case joining && r.Secret == "":
		return nil, errors.New("add node: give the cluster's secret (--cluster-secret-file): a node with another one cannot join")
	case joining && r.Auth && r.Token == "":
		return nil, errors.New("add node: give the cluster's token (--token-file), or --auth=false if the cluster has none: a new token would lock the clients out of the new node")
	}
	for _, s := range []struct{ what, v string }{{"token", r.Token}, {"cluster secret", r.Secret}} {
		if s.v != "" && !secretRE().MatchString(s.v) {
			return nil, fmt.Errorf("%s: want printable characters without spaces", s.what)
		}
	}
	if r.Token != "" && r.Token == r.Secret {
		return nil, errors.New("the cluster secret must differ from the clients' token")
	}
	for _, p := range []struct{ what, v string }{{"data directory", r.DataDir}, {"config directory", r.ConfigDir}, {"binary", r.Binary},
		{"TLS certificate", r.TLSCert}, {"TLS key", r.TLSKey}, {"TLS client CA", r.TLSClientCA},
		{"raft TLS certificate", r.RaftTLSCert}, {"raft TLS key", r.RaftTLSKey}, {"raft TLS CA", r.RaftTLSCA}} {
		if p.v != "" && (!path.IsAbs(p.v) || strings.ContainsAny(p.v, "\n\"'`$\\ ")) {
			return nil, fmt.Errorf("%s %q: want an absolute path without spaces or quotes", p.what, p.v)
		}
	}
	members, err := r.members(joining)
	if err != nil {
		return nil, err
	}
	plan := &Plan{Files: []File{}, Warnings: []string{}}
	if r.Auth {
		if r.Token == "" {
			r.Token = randomSecret()
		}
		plan.Token = r.Token
		plan.Files = append(plan.Files, File{Path: path.Join(r.ConfigDir, "token"), Mode: "0640", Content: r.Token + "\n",
			About: "the client token: every client sets TICKETING_TOKEN to it"})
	}
	if cluster {
		if r.Secret == "" {
			r.Secret = randomSecret()
		}
		plan.Secret = r.Secret
		plan.Files = append(plan.Files, File{Path: path.Join(r.ConfigDir, "cluster-secret"), Mode: "0640", Content: r.Secret + "\n",
			About: "node-to-node secret, the same on every node; never given to clients"})
	}
	var peers []string
	for _, m := range members {
		peers = append(peers, m.name+"="+net.JoinHostPort(m.host, strconv.Itoa(m.raftPort)))
	}
	table, order := settingsTable()
	for _, m := range members {
		if joining && !m.join {
			continue
		}
		n := Node{Name: m.name, Host: m.host, Port: m.port, Unit: m.unit}
		if cluster {
			n.RaftPort = m.raftPort
		}
		plain, inContainer := r.nodeSettings(m, cluster, strings.Join(peers, ","))
		for _, s := range [][]kv{plain, inContainer} {
			if err := checkSettings(table, s, cluster); err != nil {
				return nil, err
			}
			sortSettings(s, order)
		}
		for _, s := range plain {
			n.Settings = append(n.Settings, [2]string{s.name, s.value})
		}
		n.Env = envLines(plain)
		n.Command = commandLine(r.Binary, plain)
		n.Container = r.containerCommand(m, cluster, inContainer)
		n.Compose = r.composeFile(m, cluster, inContainer)
		n.Systemd = r.systemdUnit(m, cluster, plain)
		plan.Nodes = append(plan.Nodes, n)
	}
	if joining {
		m := members[len(members)-1]
		plan.ClusterAdd = fmt.Sprintf("ticketing cluster add %s %s", m.name, net.JoinHostPort(m.host, strconv.Itoa(m.raftPort)))
	}
	if cluster && r.TLSCert != "" && r.RaftTLSCert == "" {
		plan.Warnings = append(plan.Warnings, "WARNING: node-to-node (Raft) traffic is NOT encrypted: the TLS certificate covers the client port only. "+
			"The cluster secret authenticates the nodes, but keys, tokens and the log cross the network in plain text. "+
			"Give the Raft TLS certificate, key and CA (--raft-tls-cert, --raft-tls-key, --raft-tls-ca), or keep the Raft ports on a private network.")
	}
	plan.Notes = append(append([]string{}, plan.Warnings...), r.notes(plan, members, joining)...)
	return plan, nil
}

// members places every node (with AddNode, the existing ones and then the new one): its
// addresses, and on a machine shared with another node (loopback addresses, or one host given
// with several ports) its own data directory, systemd unit and Raft port. It refuses two
// listeners on one address.
func (r *Request) members(joining bool) ([]member, error) {
	hosts := append([]string{}, r.Hosts...)
	if joining {
		hosts = append(hosts, r.AddNode)
	}
	var ms []member
	perMachine := map[string]int{}
	perHost := map[string]int{}
	seen := map[string]string{}
	for i, h := range hosts {
		host, port, err := splitHost(h, r.Port)
		if err != nil {
			return nil, fmt.Errorf("host %d: %v", i+1, err)
		}
		id := net.JoinHostPort(bindHost(host), strconv.Itoa(port))
		if _, dup := seen[id]; dup {
			return nil, fmt.Errorf("host %s is given twice: every node needs its own address, or its own port (host:port)", net.JoinHostPort(host, strconv.Itoa(port)))
		}
		seen[id] = ""
		m := member{name: fmt.Sprintf("n%d", i+1), host: host, port: port, raftPort: r.RaftPort + perHost[bindHost(host)]}
		if joining && i == len(hosts)-1 {
			m.join = true
			if r.AddNodeID != "" {
				if !nodeIDRE().MatchString(r.AddNodeID) {
					return nil, fmt.Errorf("add node id %q: want letters, digits, '.', '_' or '-'", r.AddNodeID)
				}
				for _, o := range ms {
					if o.name == r.AddNodeID {
						return nil, fmt.Errorf("add node id %s: the member at %s has it (the members of hosts are n1, n2, ... in their order)", r.AddNodeID, o.host)
					}
				}
				m.name = r.AddNodeID
			}
		}
		perHost[bindHost(host)]++
		perMachine[machine(host)]++
		m.admin = net.JoinHostPort("127.0.0.1", strconv.Itoa(port+1))
		if isLoopback(host) && host != "localhost" {
			m.admin = net.JoinHostPort(host, strconv.Itoa(port+1)) // nodes that share a machine get one admin port each
		}
		ms = append(ms, m)
	}
	shared := false
	for _, n := range perMachine {
		shared = shared || n > 1
	}
	// Every listener of every node: on one machine no two may bind one address.
	bound := map[string]string{}
	for i := range ms {
		m := &ms[i]
		m.dataDir, m.unit, m.volume = r.DataDir, "ticketing.service", "ticketing-data"
		if shared {
			m.dataDir, m.unit = path.Join(r.DataDir, m.name), "ticketing-"+m.name+".service"
		}
		if len(ms) > 1 {
			m.volume = "ticketing-data-" + m.name
		}
		adminHost, adminPort, _ := net.SplitHostPort(m.admin)
		listeners := [][2]string{{"client", net.JoinHostPort(bindHost(m.host), strconv.Itoa(m.port))}, {"admin", net.JoinHostPort(adminHost, adminPort)}}
		if len(ms) > 1 {
			if m.raftPort > 65535 {
				return nil, fmt.Errorf("raft port %d of %s: above 65535", m.raftPort, m.name)
			}
			listeners = append(listeners, [2]string{"raft", net.JoinHostPort(bindHost(m.host), strconv.Itoa(m.raftPort))})
		}
		for _, l := range listeners {
			key := machine(m.host) + " " + l[1]
			if other, taken := bound[key]; taken {
				return nil, fmt.Errorf("%s's %s address %s is also %s: on one machine every node needs ports of its own (give host:port with room between them)", m.name, l[0], l[1], other)
			}
			bound[key] = m.name + "'s " + l[0] + " address"
		}
	}
	return ms, nil
}

// nodeSettings returns a node's settings for a plain start (binary, systemd) and in a container.
func (r *Request) nodeSettings(m member, cluster bool, peers string) (plain, inContainer []kv) {
	port := strconv.Itoa(m.port)
	common := []kv{}
	if r.Auth {
		common = append(common, kv{"token-file", path.Join(r.ConfigDir, "token")})
	}
	if r.TLSCert != "" {
		common = append(common, kv{"tls-cert", r.TLSCert}, kv{"tls-key", r.TLSKey})
	}
	if r.TLSClientCA != "" {
		common = append(common, kv{"tls-client-ca", r.TLSClientCA})
	}
	if r.MinLease != "" {
		common = append(common, kv{"min-lease", r.MinLease})
	}
	if r.MaxLease != "" {
		common = append(common, kv{"max-lease", r.MaxLease})
	}
	if cluster {
		common = append(common, kv{"node-id", m.name}, kv{"peers", peers},
			kv{"cluster-secret-file", path.Join(r.ConfigDir, "cluster-secret")})
		if r.RaftTLSCert != "" {
			common = append(common, kv{"raft-tls-cert", r.RaftTLSCert}, kv{"raft-tls-key", r.RaftTLSKey}, kv{"raft-tls-ca", r.RaftTLSCA})
		}
		if m.join {
			common = append(common, kv{"join", "true"})
		}
	}
	plain = append([]kv{{"addr", net.JoinHostPort(m.host, port)}, {"admin-addr", m.admin}, {"data-dir", m.dataDir}}, common...)
	inContainer = append([]kv{{"addr", net.JoinHostPort("0.0.0.0", port)}, {"admin-addr", net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port+1))},
		{"data-dir", containerDataDir}}, common...)
	if cluster {
		inContainer = append(inContainer, kv{"advertise", net.JoinHostPort(m.host, port)},
			kv{"raft-addr", net.JoinHostPort("0.0.0.0", strconv.Itoa(m.raftPort))})
	}
	return plain, inContainer
}

// fileSettings name files on the target machine: checkSettings does not read them.
var fileSettings = map[string]bool{"token-file": true, "tls-cert": true, "tls-key": true, "tls-client-ca": true,
	"cluster-secret-file": true, "admin-token-file": true, "admin-tls-cert": true, "admin-tls-key": true,
	"raft-tls-cert": true, "raft-tls-key": true, "raft-tls-ca": true}

// checkSettings: every name is in the server's table, and the server's own parser and
// validation accept the values (the files aside, which live on the target machine).
func checkSettings(table map[string]settings.Setting, s []kv, cluster bool) error {
	env := map[string]string{}
	for _, x := range s {
		if _, ok := table[x.name]; !ok {
			return fmt.Errorf("generator bug: the server has no setting %q", x.name)
		}
		if !fileSettings[x.name] {
			env[settings.EnvName(x.name)] = x.value
		}
	}
	if cluster {
		env["TICKETING_CLUSTER_SECRET"] = "checked-without-the-file"
	}
	if _, err := settings.Parse(nil, func(k string) string { return env[k] }); err != nil {
		return fmt.Errorf("the server would refuse this: %w", err)
	}
	return nil
}

// settingsTable is the server's settings table (settings.Table) by flag name, and the names in
// its order: the generator writes only names found here, in this order.
func settingsTable() (map[string]settings.Setting, []string) {
	byName := map[string]settings.Setting{}
	var order []string
	for _, st := range settings.Table() {
		byName[st.Name] = st
		order = append(order, st.Name)
	}
	return byName, order
}

func sortSettings(s []kv, order []string) {
	pos := map[string]int{}
	for i, n := range order {
		pos[n] = i
	}
	sort.SliceStable(s, func(i, j int) bool { return pos[s[i].name] < pos[s[j].name] })
}
