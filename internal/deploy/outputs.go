package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/ticketing/ticketing/internal/settings"
)

// The outputs of a plan: environment lines, a command line, a container command, a
// docker-compose file, a systemd unit, and the notes.

var shellSafe = lazyRegexp(`^[A-Za-z0-9_@%+=:,./\-]+$`)

// shellQuote quotes v for a POSIX shell when it needs it.
func shellQuote(v string) string {
	if v != "" && shellSafe().MatchString(v) {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

func envLines(s []kv) string {
	var b strings.Builder
	for _, x := range s {
		fmt.Fprintf(&b, "%s=%s\n", settings.EnvName(x.name), shellQuote(x.value))
	}
	return b.String()
}

func commandLine(bin string, s []kv) string {
	var b strings.Builder
	b.WriteString(shellQuote(bin) + " server")
	for _, x := range s {
		if x.value == "true" || x.value == "false" {
			// A boolean setting (--join) takes its value after "=": alone, the next word is not its value.
			fmt.Fprintf(&b, " \\\n  --%s=%s", x.name, x.value)
			continue
		}
		fmt.Fprintf(&b, " \\\n  --%s %s", x.name, shellQuote(x.value))
	}
	return b.String() + "\n"
}

// mounts are the host files a container needs: the config directory and the TLS files' folders.
func (r *Request) mounts() []string {
	dirs := map[string]bool{}
	if r.Auth || r.Nodes > 1 || r.AddNode != "" {
		dirs[r.ConfigDir] = true
	}
	for _, f := range []string{r.TLSCert, r.TLSKey, r.TLSClientCA, r.RaftTLSCert, r.RaftTLSKey, r.RaftTLSCA} {
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

func ports(m member, cluster bool) []string {
	p := []string{fmt.Sprintf("%s:%d:%d", bracket(m.host), m.port, m.port)}
	if cluster {
		p = append(p, fmt.Sprintf("%s:%d:%d", bracket(m.host), m.raftPort, m.raftPort))
	}
	return p
}

func bracket(h string) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]"
	}
	return h
}

func (r *Request) containerName(name string, cluster bool) string {
	if cluster {
		return "ticketing-" + name
	}
	return "ticketing"
}

func (r *Request) containerCommand(m member, cluster bool, s []kv) string {
	var b strings.Builder
	fmt.Fprintf(&b, "docker run -d --name %s --restart unless-stopped", r.containerName(m.name, cluster))
	for _, p := range ports(m, cluster) {
		fmt.Fprintf(&b, " \\\n  -p %s", p)
	}
	fmt.Fprintf(&b, " \\\n  -v %s:%s", m.volume, containerDataDir)
	for _, m := range r.mounts() {
		fmt.Fprintf(&b, " \\\n  -v %s", m)
	}
	for _, x := range s {
		fmt.Fprintf(&b, " \\\n  -e %s", shellQuote(settings.EnvName(x.name)+"="+x.value))
	}
	fmt.Fprintf(&b, " \\\n  %s server\n", shellQuote(r.Image))
	return b.String()
}

func yamlQuote(v string) string { q, _ := json.Marshal(v); return string(q) }

func (r *Request) composeFile(m member, cluster bool, s []kv) string {
	var b strings.Builder
	b.WriteString("services:\n  ticketing:\n")
	fmt.Fprintf(&b, "    image: %s\n    container_name: %s\n    command: [\"server\"]\n    restart: unless-stopped\n", yamlQuote(r.Image), r.containerName(m.name, cluster))
	b.WriteString("    ports:\n")
	for _, p := range ports(m, cluster) {
		fmt.Fprintf(&b, "      - %s\n", yamlQuote(p))
	}
	b.WriteString("    environment:\n")
	for _, x := range s {
		fmt.Fprintf(&b, "      %s: %s\n", settings.EnvName(x.name), yamlQuote(x.value))
	}
	b.WriteString("    volumes:\n")
	fmt.Fprintf(&b, "      - %s\n", yamlQuote(m.volume+":"+containerDataDir))
	for _, d := range r.mounts() {
		fmt.Fprintf(&b, "      - %s\n", yamlQuote(d))
	}
	fmt.Fprintf(&b, "volumes:\n  %s: {}\n", m.volume)
	return b.String()
}

// systemdUnit is a hardened unit: its own system user (so SIGHUP can reload the token and
// certificate files in place), the data directory as its StateDirectory (under /var/lib) or
// created by ExecStartPre (elsewhere), no privileges.
func (r *Request) systemdUnit(m member, cluster bool, s []kv) string {
	name := m.name
	var b strings.Builder
	desc := "Ticketing lock server"
	if cluster {
		desc += " (cluster node " + name + ")"
	}
	fmt.Fprintf(&b, "[Unit]\nDescription=%s\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nType=simple\n", desc)
	b.WriteString("User=ticketing\nGroup=ticketing\n")
	fmt.Fprintf(&b, "ExecStart=%s server\nExecReload=/bin/kill -HUP $MAINPID\n", r.Binary)
	for _, x := range s {
		fmt.Fprintf(&b, "Environment=%s\n", systemdQuote(settings.EnvName(x.name)+"="+x.value))
	}
	if rel, ok := strings.CutPrefix(path.Clean(m.dataDir), "/var/lib/"); ok && rel != "" {
		fmt.Fprintf(&b, "StateDirectory=%s\nStateDirectoryMode=0700\n", rel)
	} else {
		// StateDirectory= only makes directories under /var/lib: create this one before the
		// start ("+": outside the sandbox, as root), owned by the service's user.
		fmt.Fprintf(&b, "ExecStartPre=+/usr/bin/install -d -o ticketing -g ticketing -m 0700 %s\n", m.dataDir)
		fmt.Fprintf(&b, "ReadWritePaths=%s\n", m.dataDir)
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

func (r *Request) notes(p *Plan, members []member, joining bool) []string {
	var n []string
	if len(p.Files) > 0 {
		what := "Create the files above on every node first"
		if joining {
			what = "Create the files above on the new node first (the cluster's own: the same content as on its other nodes)"
		}
		n = append(n, fmt.Sprintf("%s (plain or systemd: owner root, group ticketing, mode 0640; containers run as uid %s, which must be able to read them).", what, containerUID))
	}
	unit := "/etc/systemd/system/ticketing.service; systemctl enable --now ticketing"
	if len(p.Nodes) > 0 && p.Nodes[0].Unit != "ticketing.service" {
		unit = "/etc/systemd/system/ under the name given with each (one unit per node: they share a machine); systemctl enable --now each"
	}
	n = append(n, "systemd: create the user once with: useradd --system --no-create-home --shell /usr/sbin/nologin ticketing; put the unit in "+unit+". systemctl reload sends SIGHUP (token file and TLS reload).")
	if len(members) > 1 && members[0].dataDir != r.DataDir {
		n = append(n, fmt.Sprintf("Nodes on one machine: each has its own data directory (%s/<node id>), admin and Raft ports.", r.DataDir))
	}
	var addrs []string
	for _, m := range members {
		addrs = append(addrs, net.JoinHostPort(m.host, strconv.Itoa(m.port)))
	}
	switch {
	case joining:
		m := members[len(members)-1]
		n = append(n, fmt.Sprintf("Start the new node (it joins: it never bootstraps and is not ready until added), then, where `ticketing cluster` reaches the cluster's admin listeners: %s. Wait for its /readyz 200, then add %s to the clients' endpoint lists (TICKETING_ADDR=%s).",
			p.ClusterAdd, net.JoinHostPort(m.host, strconv.Itoa(m.port)), strings.Join(addrs, ",")))
		if len(members)%2 == 0 {
			n = append(n, fmt.Sprintf("The cluster will have %d voters: an even number survives no more failures than one fewer does. To replace a node, remove the old one first (ticketing cluster remove ID).", len(members)))
		}
	case len(members) > 1:
		n = append(n, fmt.Sprintf("Cluster: start every node with the same TICKETING_PEERS; they elect a leader within seconds. Clients list every node's client address (e.g. TICKETING_ADDR=%s).", strings.Join(addrs, ",")))
	case isLoopback(members[0].host):
		n = append(n, "This node listens on loopback only: give another address to serve other machines (then turn auth and TLS on).")
	}
	if r.Auth && r.TLSCert == "" {
		n = append(n, "Without TLS the token is never sent, but the traffic is not encrypted: use TLS for traffic that leaves the host.")
	}
	if !r.Auth {
		n = append(n, "Auth is off: anyone who can reach the port can take and release locks.")
	}
	var admins []string
	for _, node := range p.Nodes {
		admins = append(admins, strconv.Itoa(node.Port+1))
	}
	n = append(n, fmt.Sprintf("The admin listener (health, metrics, this page) stays on loopback at the client port + 1 (%s); in a container it serves the image's health check.", strings.Join(uniq(admins), ", ")))
	return n
}

func uniq(s []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
