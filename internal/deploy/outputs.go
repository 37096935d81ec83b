package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ticketing/ticketing/internal/settings"
)

// The outputs of a plan: environment lines, a command line, a container command, a
// docker-compose file, a systemd unit, and the notes.

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
		fmt.Fprintf(&b, "%s=%s\n", settings.EnvName(x.name), shellQuote(x.value))
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
func (r *Request) mounts() []string {
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

func (r *Request) ports(host string, cluster bool) []string {
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

func (r *Request) containerName(name string, cluster bool) string {
	if cluster {
		return "ticketing-" + name
	}
	return "ticketing"
}

func (r *Request) containerCommand(name, host string, cluster bool, s []kv) string {
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
		fmt.Fprintf(&b, " \\\n  -e %s", shellQuote(settings.EnvName(x.name)+"="+x.value))
	}
	fmt.Fprintf(&b, " \\\n  %s server\n", shellQuote(r.Image))
	return b.String()
}

func yamlQuote(v string) string { q, _ := json.Marshal(v); return string(q) }

func (r *Request) composeFile(name, host string, cluster bool, s []kv) string {
	var b strings.Builder
	b.WriteString("services:\n  ticketing:\n")
	fmt.Fprintf(&b, "    image: %s\n    container_name: %s\n    command: [\"server\"]\n    restart: unless-stopped\n", yamlQuote(r.Image), r.containerName(name, cluster))
	b.WriteString("    ports:\n")
	for _, p := range r.ports(host, cluster) {
		fmt.Fprintf(&b, "      - %s\n", yamlQuote(p))
	}
	b.WriteString("    environment:\n")
	for _, x := range s {
		fmt.Fprintf(&b, "      %s: %s\n", settings.EnvName(x.name), yamlQuote(x.value))
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
func (r *Request) systemdUnit(name string, cluster bool, s []kv) string {
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

func (r *Request) notes(p *Plan) []string {
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

func (p *Plan) nodeAddrs(port int) []string {
	var out []string
	for _, n := range p.Nodes {
		out = append(out, net.JoinHostPort(n.Host, strconv.Itoa(port)))
	}
	return out
}
