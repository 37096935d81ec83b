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

	"github.com/ticketing/ticketing/internal/settings"
)

// Request is the answers.
type Request struct {
	Nodes       int      `json:"nodes"`         // 1 (single node), 3 or 5 (cluster)
	Hosts       []string `json:"hosts"`         // one per node: where it listens and is reached (default 127.0.0.1 for one node)
	Port        int      `json:"port"`          // client port (default 7070); the admin listener is the next port
	RaftPort    int      `json:"raft_port"`     // cluster: node-to-node port (default 7080)
	Auth        bool     `json:"auth"`          // require a token (generated)
	TLSCert     string   `json:"tls_cert"`      // PEM files on the target machine (both or neither)
	TLSKey      string   `json:"tls_key"`       //
	TLSClientCA string   `json:"tls_client_ca"` // require client certificates signed by this CA
	DataDir     string   `json:"data_dir"`      // default /var/lib/ticketing
	MinLease    string   `json:"min_lease"`     // durations; empty: the server's default
	MaxLease    string   `json:"max_lease"`     //
	ConfigDir   string   `json:"config_dir"`    // where the token and secret files go; default /etc/ticketing
	Binary      string   `json:"binary"`        // default /usr/local/bin/ticketing
	Image       string   `json:"image"`         // container image; default ticketing:latest
	Token       string   `json:"token"`         // default: generated (32 random bytes, hex)
	Secret      string   `json:"cluster_secret"`
}

// Plan is what the generator writes.
type Plan struct {
	Nodes  []Node   `json:"nodes"`
	Token  string   `json:"token,omitempty"`          // clients use it as TICKETING_TOKEN
	Secret string   `json:"cluster_secret,omitempty"` //
	Files  []File   `json:"files"`                    // create these on every node first
	Notes  []string `json:"notes"`
}

// Node is one node's outputs. Settings are the plain (non-container) settings.
type Node struct {
	Name      string      `json:"name"`
	Host      string      `json:"host"`
	Settings  [][2]string `json:"settings"` // [flag name, value] in the settings table's order
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

func (r *Request) defaults() {
	if r.Nodes == 0 {
		r.Nodes = 1
	}
	if len(r.Hosts) == 0 && r.Nodes == 1 {
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

var hostRE = regexp.MustCompile(`^[A-Za-z0-9.\-:\[\]%]+$`)

// Generate turns the answers into a plan, or says which answer the server would refuse.
func Generate(r Request) (*Plan, error) {
	r.defaults()
	switch {
	case r.Nodes != 1 && r.Nodes != 3 && r.Nodes != 5:
		return nil, fmt.Errorf("nodes: %d; want 1 (a single node), 3 or 5 (a cluster)", r.Nodes)
	case len(r.Hosts) != r.Nodes:
		return nil, fmt.Errorf("hosts: %d given for %d nodes; give one address per node", len(r.Hosts), r.Nodes)
	case r.Port < 1 || r.Port > 65534:
		return nil, fmt.Errorf("port %d: want 1..65534 (the admin listener takes the next one)", r.Port)
	case r.Nodes > 1 && (r.RaftPort < 1 || r.RaftPort > 65535 || r.RaftPort == r.Port || r.RaftPort == r.Port+1):
		return nil, fmt.Errorf("raft port %d: want 1..65535, other than the client port and the admin port", r.RaftPort)
	case (r.TLSCert == "") != (r.TLSKey == ""):
		return nil, errors.New("TLS: give both the certificate and the key, or neither")
	case r.TLSClientCA != "" && r.TLSCert == "":
		return nil, errors.New("TLS client CA: needs the server's certificate and key too")
	}
	seen := map[string]bool{}
	for i, h := range r.Hosts {
		h = strings.Trim(strings.TrimSpace(h), "[]")
		if h == "" || !hostRE.MatchString(h) {
			return nil, fmt.Errorf("host %d: %q is not an address or a host name", i+1, r.Hosts[i])
		}
		if seen[h] {
			return nil, fmt.Errorf("host %s is given twice: every node needs its own address", h)
		}
		seen[h] = true
		r.Hosts[i] = h
	}
	for _, p := range []struct{ what, v string }{{"data directory", r.DataDir}, {"config directory", r.ConfigDir}, {"binary", r.Binary},
		{"TLS certificate", r.TLSCert}, {"TLS key", r.TLSKey}, {"TLS client CA", r.TLSClientCA}} {
		if p.v != "" && (!path.IsAbs(p.v) || strings.ContainsAny(p.v, "\n\"'`$\\ ")) {
			return nil, fmt.Errorf("%s %q: want an absolute path without spaces or quotes", p.what, p.v)
		}
	}
	plan := &Plan{Files: []File{}}
	if r.Auth {
		if r.Token == "" {
			r.Token = randomSecret()
		}
		plan.Token = r.Token
		plan.Files = append(plan.Files, File{Path: path.Join(r.ConfigDir, "token"), Mode: "0640", Content: r.Token + "\n",
			About: "the client token: every client sets TICKETING_TOKEN to it"})
	}
	cluster := r.Nodes > 1
	if cluster {
		if r.Secret == "" {
			r.Secret = randomSecret()
		}
		plan.Secret = r.Secret
		plan.Files = append(plan.Files, File{Path: path.Join(r.ConfigDir, "cluster-secret"), Mode: "0640", Content: r.Secret + "\n",
			About: "node-to-node secret, the same on every node; never given to clients"})
	}
	var peers []string
	for i, h := range r.Hosts {
		peers = append(peers, fmt.Sprintf("n%d=%s", i+1, net.JoinHostPort(h, strconv.Itoa(r.RaftPort))))
	}
	table, order := settingsTable()
	for i, h := range r.Hosts {
		n := Node{Name: "ticketing", Host: h}
		if cluster {
			n.Name = fmt.Sprintf("n%d", i+1)
		}
		plain, inContainer := r.nodeSettings(i, h, strings.Join(peers, ","))
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
		n.Container = r.containerCommand(n.Name, h, cluster, inContainer)
		n.Compose = r.composeFile(n.Name, h, cluster, inContainer)
		n.Systemd = r.systemdUnit(n.Name, cluster, plain)
		plan.Nodes = append(plan.Nodes, n)
	}
	plan.Notes = r.notes(plan)
	return plan, nil
}

// nodeSettings returns node i's settings for a plain start (binary, systemd) and in a container.
func (r *Request) nodeSettings(i int, host, peers string) (plain, inContainer []kv) {
	port := strconv.Itoa(r.Port)
	admin := net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port+1))
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		admin = net.JoinHostPort(host, strconv.Itoa(r.Port+1)) // nodes that share a machine get one admin port each
	}
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
	if r.Nodes > 1 {
		common = append(common, kv{"node-id", fmt.Sprintf("n%d", i+1)}, kv{"peers", peers},
			kv{"cluster-secret-file", path.Join(r.ConfigDir, "cluster-secret")})
	}
	plain = append([]kv{{"addr", net.JoinHostPort(host, port)}, {"admin-addr", admin}, {"data-dir", r.DataDir}}, common...)
	inContainer = append([]kv{{"addr", net.JoinHostPort("0.0.0.0", port)}, {"admin-addr", net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port+1))},
		{"data-dir", containerDataDir}}, common...)
	if r.Nodes > 1 {
		inContainer = append(inContainer, kv{"advertise", net.JoinHostPort(host, port)},
			kv{"raft-addr", net.JoinHostPort("0.0.0.0", strconv.Itoa(r.RaftPort))})
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
