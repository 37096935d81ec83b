package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// The launch-command generator: `ticketing deploy` and POST /api/deploy (the admin page). From
// a few answers it writes, per node, the environment, a command line, a container command, a
// docker-compose file and a systemd unit, plus the files they read (token, cluster secret).
//
// It cannot drift from the server: every setting it writes is looked up by name in the
// server's own settings table (settingsTable), and before it answers, the settings of every
// node go through the server's own parser and validation (parseServerSettings) — only the
// files, which live on the target machine, are not read.

// deployRequest is the answers.
type deployRequest struct {
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

// deployPlan is what the generator writes.
type deployPlan struct {
	Nodes  []deployNode `json:"nodes"`
	Token  string       `json:"token,omitempty"`          // clients use it as TICKETING_TOKEN
	Secret string       `json:"cluster_secret,omitempty"` //
	Files  []deployFile `json:"files"`                    // create these on every node first
	Notes  []string     `json:"notes"`
}

// deployNode is one node's outputs. Settings are the plain (non-container) settings.
type deployNode struct {
	Name      string      `json:"name"`
	Host      string      `json:"host"`
	Settings  [][2]string `json:"settings"` // [flag name, value] in the settings table's order
	Env       string      `json:"env"`
	Command   string      `json:"command"`
	Container string      `json:"container"`
	Compose   string      `json:"compose"`
	Systemd   string      `json:"systemd"`
}

type deployFile struct {
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

func (r *deployRequest) defaults() {
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

// generateDeploy turns the answers into a plan, or says which answer the server would refuse.
func generateDeploy(r deployRequest) (*deployPlan, error) {
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
	plan := &deployPlan{Files: []deployFile{}}
	if r.Auth {
		if r.Token == "" {
			r.Token = randomSecret()
		}
		plan.Token = r.Token
		plan.Files = append(plan.Files, deployFile{Path: path.Join(r.ConfigDir, "token"), Mode: "0640", Content: r.Token + "\n",
			About: "the client token: every client sets TICKETING_TOKEN to it"})
	}
	cluster := r.Nodes > 1
	if cluster {
		if r.Secret == "" {
			r.Secret = randomSecret()
		}
		plan.Secret = r.Secret
		plan.Files = append(plan.Files, deployFile{Path: path.Join(r.ConfigDir, "cluster-secret"), Mode: "0640", Content: r.Secret + "\n",
			About: "node-to-node secret, the same on every node; never given to clients"})
	}
	var peers []string
	for i, h := range r.Hosts {
		peers = append(peers, fmt.Sprintf("n%d=%s", i+1, net.JoinHostPort(h, strconv.Itoa(r.RaftPort))))
	}
	table, order := settingsTable()
	for i, h := range r.Hosts {
		n := deployNode{Name: "ticketing", Host: h}
		if cluster {
			n.Name = fmt.Sprintf("n%d", i+1)
		}
		plain, inContainer := r.settings(i, h, strings.Join(peers, ","))
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

// settings returns node i's settings for a plain start (binary, systemd) and in a container.
func (r *deployRequest) settings(i int, host, peers string) (plain, inContainer []kv) {
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
func checkSettings(table map[string]setting, s []kv, cluster bool) error {
	env := map[string]string{}
	for _, x := range s {
		if _, ok := table[x.name]; !ok {
			return fmt.Errorf("generator bug: the server has no setting %q", x.name)
		}
		if !fileSettings[x.name] {
			env[envName(x.name)] = x.value
		}
	}
	if cluster {
		env["TICKETING_CLUSTER_SECRET"] = "checked-without-the-file"
	}
	if _, err := parseServerSettings(nil, func(k string) string { return env[k] }); err != nil {
		return fmt.Errorf("the server would refuse this: %w", err)
	}
	return nil
}

func sortSettings(s []kv, order []string) {
	pos := map[string]int{}
	for i, n := range order {
		pos[n] = i
	}
	sort.SliceStable(s, func(i, j int) bool { return pos[s[i].name] < pos[s[j].name] })
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./\-]+$`)

// shellQuote quotes v for a POSIX shell when it needs it.
func shellQuote(v string) string {
	if v != "" && shellSafe.MatchString(v) {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

func envLines(s []kv) string {
	var b strings.Builder
	for _, x := range s {
		fmt.Fprintf(&b, "%s=%s\n", envName(x.name), shellQuote(x.value))
	}
	return b.String()
}

func commandLine(bin string, s []kv) string {
	var b strings.Builder
	b.WriteString(shellQuote(bin) + " server")
	for _, x := range s {
		fmt.Fprintf(&b, " \\\n  --%s %s", x.name, shellQuote(x.value))
	}
	return b.String() + "\n"
}

// mounts are the host files a container needs: the config directory and the TLS files' folders.
func (r *deployRequest) mounts() []string {
	dirs := map[string]bool{}
	if r.Auth || r.Nodes > 1 {
		dirs[r.ConfigDir] = true
	}
	for _, f := range []string{r.TLSCert, r.TLSKey, r.TLSClientCA} {
		if f != "" {
			dirs[path.Dir(f)] = true
		}
	}
	var out []string
	for d := range dirs {
		out = append(out, d+":"+d+":ro")
	}
	sort.Strings(out)
	return out
}

func (r *deployRequest) ports(host string, cluster bool) []string {
	p := []string{fmt.Sprintf("%s:%d:%d", bracket(host), r.Port, r.Port)}
	if cluster {
		p = append(p, fmt.Sprintf("%s:%d:%d", bracket(host), r.RaftPort, r.RaftPort))
	}
	return p
}

func bracket(h string) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]"
	}
	return h
}

func (r *deployRequest) containerName(name string, cluster bool) string {
	if cluster {
		return "ticketing-" + name
	}
	return "ticketing"
}

func (r *deployRequest) containerCommand(name, host string, cluster bool, s []kv) string {
	var b strings.Builder
	fmt.Fprintf(&b, "docker run -d --name %s --restart unless-stopped", r.containerName(name, cluster))
	for _, p := range r.ports(host, cluster) {
		fmt.Fprintf(&b, " \\\n  -p %s", p)
	}
	fmt.Fprintf(&b, " \\\n  -v ticketing-data:%s", containerDataDir)
	for _, m := range r.mounts() {
		fmt.Fprintf(&b, " \\\n  -v %s", m)
	}
	for _, x := range s {
		fmt.Fprintf(&b, " \\\n  -e %s", shellQuote(envName(x.name)+"="+x.value))
	}
	fmt.Fprintf(&b, " \\\n  %s server\n", shellQuote(r.Image))
	return b.String()
}

func yamlQuote(v string) string { q, _ := json.Marshal(v); return string(q) }

func (r *deployRequest) composeFile(name, host string, cluster bool, s []kv) string {
	var b strings.Builder
	b.WriteString("services:\n  ticketing:\n")
	fmt.Fprintf(&b, "    image: %s\n    container_name: %s\n    command: [\"server\"]\n    restart: unless-stopped\n", yamlQuote(r.Image), r.containerName(name, cluster))
	b.WriteString("    ports:\n")
	for _, p := range r.ports(host, cluster) {
		fmt.Fprintf(&b, "      - %s\n", yamlQuote(p))
	}
	b.WriteString("    environment:\n")
	for _, x := range s {
		fmt.Fprintf(&b, "      %s: %s\n", envName(x.name), yamlQuote(x.value))
	}
	b.WriteString("    volumes:\n")
	fmt.Fprintf(&b, "      - %s\n", yamlQuote("ticketing-data:"+containerDataDir))
	for _, m := range r.mounts() {
		fmt.Fprintf(&b, "      - %s\n", yamlQuote(m))
	}
	b.WriteString("volumes:\n  ticketing-data: {}\n")
	return b.String()
}

// systemdUnit is a hardened unit: its own system user (so SIGHUP can reload the token and
// certificate files in place), the data directory as its StateDirectory, no privileges.
func (r *deployRequest) systemdUnit(name string, cluster bool, s []kv) string {
	var b strings.Builder
	desc := "Ticketing lock server"
	if cluster {
		desc += " (cluster node " + name + ")"
	}
	fmt.Fprintf(&b, "[Unit]\nDescription=%s\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nType=simple\n", desc)
	b.WriteString("User=ticketing\nGroup=ticketing\n")
	fmt.Fprintf(&b, "ExecStart=%s server\nExecReload=/bin/kill -HUP $MAINPID\n", r.Binary)
	for _, x := range s {
		fmt.Fprintf(&b, "Environment=%s\n", systemdQuote(envName(x.name)+"="+x.value))
	}
	if rel, ok := strings.CutPrefix(path.Clean(r.DataDir), "/var/lib/"); ok && rel != "" {
		fmt.Fprintf(&b, "StateDirectory=%s\nStateDirectoryMode=0700\n", rel)
	} else {
		fmt.Fprintf(&b, "ReadWritePaths=%s\n", r.DataDir)
	}
	b.WriteString(`Restart=on-failure
RestartSec=2s
TimeoutStopSec=20s
LimitNOFILE=65536
UMask=0077
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
CapabilityBoundingSet=
AmbientCapabilities=
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
`)
	return b.String()
}

// systemdQuote quotes an Environment= assignment when it holds spaces or quotes.
func systemdQuote(v string) string {
	if !strings.ContainsAny(v, " \t\"'\\%$") {
		return v
	}
	v = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "%", "%%", "$", "$$").Replace(v)
	return `"` + v + `"`
}

func (r *deployRequest) notes(p *deployPlan) []string {
	var n []string
	if len(p.Files) > 0 {
		n = append(n, fmt.Sprintf("Create the files above on every node first (plain or systemd: owner root, group ticketing, mode 0640; containers run as uid %s, which must be able to read them).", containerUID))
	}
	n = append(n, "systemd: create the user once with: useradd --system --no-create-home --shell /usr/sbin/nologin ticketing; put the unit in /etc/systemd/system/ticketing.service; systemctl enable --now ticketing. systemctl reload sends SIGHUP (token file and TLS reload).")
	if r.Nodes > 1 {
		n = append(n, fmt.Sprintf("Cluster: start every node with the same TICKETING_PEERS; they elect a leader within seconds. Clients list every node's client address (e.g. TICKETING_ADDR=%s).", strings.Join(p.nodeAddrs(r.Port), ",")))
	} else if ip := net.ParseIP(r.Hosts[0]); ip != nil && ip.IsLoopback() {
		n = append(n, "This node listens on loopback only: give another address to serve other machines (then turn auth and TLS on).")
	}
	if r.Auth && r.TLSCert == "" {
		n = append(n, "Without TLS the token is never sent, but the traffic is not encrypted: use TLS for traffic that leaves the host.")
	}
	if !r.Auth {
		n = append(n, "Auth is off: anyone who can reach the port can take and release locks.")
	}
	n = append(n, fmt.Sprintf("The admin listener (health, metrics, this page) stays on loopback at port %d; in a container it serves the image's health check.", r.Port+1))
	return n
}

func (p *deployPlan) nodeAddrs(port int) []string {
	var out []string
	for _, n := range p.Nodes {
		out = append(out, net.JoinHostPort(n.Host, strconv.Itoa(port)))
	}
	return out
}

func decodeJSON(r io.Reader, v any) error {
	d := json.NewDecoder(r)
	d.DisallowUnknownFields()
	return d.Decode(v)
}

func encodeJSON(w io.Writer, v any) {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	e.Encode(v)
}

// runDeploy is `ticketing deploy`: the generator on the command line.
func runDeploy(args []string) int {
	fs := flag.NewFlagSet("deploy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var r deployRequest
	var hosts, only, format string
	fs.IntVar(&r.Nodes, "nodes", 1, "1 (a single node), 3 or 5 (a cluster)")
	fs.StringVar(&hosts, "hosts", "", "comma-separated: one address per node, where it listens and is reached (default 127.0.0.1 for one node)")
	fs.IntVar(&r.Port, "port", 7070, "client port (the admin listener takes the next one)")
	fs.IntVar(&r.RaftPort, "raft-port", 7080, "cluster: node-to-node port")
	fs.BoolVar(&r.Auth, "auth", true, "require a token (one is generated)")
	fs.StringVar(&r.TLSCert, "tls-cert", "", "PEM certificate on the target machine: enables TLS (with --tls-key)")
	fs.StringVar(&r.TLSKey, "tls-key", "", "PEM key on the target machine")
	fs.StringVar(&r.TLSClientCA, "tls-client-ca", "", "PEM CA: require client certificates signed by it")
	fs.StringVar(&r.DataDir, "data-dir", "/var/lib/ticketing", "data directory on the target machine")
	fs.StringVar(&r.MinLease, "min-lease", "", "shortest lease (default: the server's)")
	fs.StringVar(&r.MaxLease, "max-lease", "", "longest lease (default: the server's)")
	fs.StringVar(&r.ConfigDir, "config-dir", "/etc/ticketing", "where the token and cluster secret files go")
	fs.StringVar(&r.Binary, "binary", "/usr/local/bin/ticketing", "path of the ticketing binary on the target machine")
	fs.StringVar(&r.Image, "image", "ticketing:latest", "container image (built from deploy/Dockerfile)")
	fs.StringVar(&only, "only", "", "print only this output of each node: env, command, container, compose or systemd")
	fs.StringVar(&format, "format", "text", "text, or json (everything, for scripts)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ticketing deploy [--nodes 1|3|5] [--hosts A,B,C] [--auth=false] [--tls-cert F --tls-key F] [--data-dir D] [--min-lease D] [--max-lease D] [--only KIND] [--format text|json]\n\nPrints how to start Ticketing: environment, command line, container, docker-compose and systemd, per node.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ticketing deploy: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if hosts != "" {
		r.Hosts = strings.Split(hosts, ",")
	}
	plan, err := generateDeploy(r)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing deploy:", err)
		return exitUsage
	}
	switch format {
	case "json":
		encodeJSON(stdout, plan)
		return exitOK
	case "text":
	default:
		fmt.Fprintf(stderr, "ticketing deploy: --format %q: want text or json\n", format)
		return exitUsage
	}
	kinds := []struct{ name, title string }{{"env", "environment"}, {"command", "command line"}, {"container", "container"},
		{"compose", "docker-compose.yml"}, {"systemd", "systemd unit (/etc/systemd/system/ticketing.service)"}}
	if only != "" {
		ok := false
		for _, k := range kinds {
			ok = ok || k.name == only
		}
		if !ok {
			fmt.Fprintf(stderr, "ticketing deploy: --only %q: want env, command, container, compose or systemd\n", only)
			return exitUsage
		}
	}
	out := stdout
	if only == "" {
		for _, f := range plan.Files {
			fmt.Fprintf(out, "### file %s (mode %s): %s\n%s\n", f.Path, f.Mode, f.About, f.Content)
		}
	}
	for _, n := range plan.Nodes {
		for _, k := range kinds {
			if only != "" && k.name != only {
				continue
			}
			v := map[string]string{"env": n.Env, "command": n.Command, "container": n.Container, "compose": n.Compose, "systemd": n.Systemd}[k.name]
			if only == "" || len(plan.Nodes) > 1 {
				fmt.Fprintf(out, "### %s: %s\n", n.Name, k.title)
			}
			fmt.Fprint(out, v)
			if only == "" || len(plan.Nodes) > 1 {
				fmt.Fprintln(out)
			}
		}
	}
	if only == "" {
		for _, note := range plan.Notes {
			fmt.Fprintln(out, "# "+note)
		}
	}
	return exitOK
}
