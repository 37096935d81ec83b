package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/ticketing/ticketing/internal/deploy"
)

// deployKinds are the outputs of each node, by --only name.
var deployKinds = []struct{ name, title string }{{"env", "environment"}, {"command", "command line"}, {"container", "container"},
	{"compose", "docker-compose.yml"}, {"systemd", "systemd unit"}}

func deployOutput(n deploy.Node, kind string) string {
	return map[string]string{"env": n.Env, "command": n.Command, "container": n.Container, "compose": n.Compose, "systemd": n.Systemd}[kind]
}

// readSecretFile is the first non-empty line of a token or cluster secret file (as the server
// reads its token file: a second line is the previous token of a rotation).
func readSecretFile(flagName, file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flagName, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			return line, nil
		}
	}
	return "", fmt.Errorf("--%s %s: empty", flagName, file)
}

// runDeploy is `ticketing deploy`: the launch-command generator (internal/deploy) on the
// command line. Exit status: 0 printed, 1 a file named by a flag cannot be read, 2 bad
// arguments (or answers the server would refuse).
func runDeploy(args []string) int {
	fs := flag.NewFlagSet("deploy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var r deploy.Request
	var hosts, only, format, tokenFile, secretFile string
	fs.IntVar(&r.Nodes, "nodes", 0, "1 (a single node), 3 or 5 (a cluster); with --add-node: the existing members (default: as many as --hosts)")
	fs.StringVar(&hosts, "hosts", "", "comma-separated: one address per node, host or host:port (IPv6: [addr]:port), where it listens and is reached (default 127.0.0.1 for one node)")
	fs.IntVar(&r.Port, "port", 7070, "client port of the hosts given without one (the admin listener takes the next one)")
	fs.IntVar(&r.RaftPort, "raft-port", 7080, "cluster: node-to-node port (nodes on one host take the next ones)")
	fs.BoolVar(&r.Auth, "auth", true, "require a token (one is generated unless --token-file)")
	fs.StringVar(&r.TLSCert, "tls-cert", "", "PEM certificate on the target machine: enables TLS for clients (with --tls-key)")
	fs.StringVar(&r.TLSKey, "tls-key", "", "PEM key on the target machine")
	fs.StringVar(&r.TLSClientCA, "tls-client-ca", "", "PEM CA: require client certificates signed by it")
	fs.StringVar(&r.RaftTLSCert, "raft-tls-cert", "", "cluster: PEM certificate of each node for node-to-node TLS (with --raft-tls-key and --raft-tls-ca)")
	fs.StringVar(&r.RaftTLSKey, "raft-tls-key", "", "cluster: PEM key for --raft-tls-cert")
	fs.StringVar(&r.RaftTLSCA, "raft-tls-ca", "", "cluster: PEM CA that signs every node's --raft-tls-cert")
	fs.StringVar(&r.DataDir, "data-dir", "/var/lib/ticketing", "data directory on the target machine (nodes sharing a machine: DIR/<node id>)")
	fs.StringVar(&r.MinLease, "min-lease", "", "shortest lease (default: the server's)")
	fs.StringVar(&r.MaxLease, "max-lease", "", "longest lease (default: the server's)")
	fs.StringVar(&r.ConfigDir, "config-dir", "/etc/ticketing", "where the token and cluster secret files go")
	fs.StringVar(&r.Binary, "binary", "/usr/local/bin/ticketing", "path of the ticketing binary on the target machine")
	fs.StringVar(&r.Image, "image", "ticketing:latest", "container image (built from deploy/Dockerfile)")
	fs.StringVar(&tokenFile, "token-file", "", "keep the existing token: read it from this file (here) instead of generating one")
	fs.StringVar(&secretFile, "cluster-secret-file", "", "keep the existing cluster secret: read it from this file (here) instead of generating one")
	fs.StringVar(&r.AddNode, "add-node", "", "host or host:port of one more node for the existing cluster of --hosts: print its outputs (it joins) and the 'ticketing cluster add' command; needs --cluster-secret-file, and --token-file unless --auth=false")
	fs.StringVar(&r.AddNodeID, "add-node-id", "", "the added node's id (default n<members+1>)")
	fs.StringVar(&only, "only", "", "print only this output of each node: env, command, container, compose or systemd")
	fs.StringVar(&format, "format", "text", "text, or json (for scripts; with --only, that output of each node)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ticketing deploy [--nodes 1|3|5] [--hosts A,B,C] [--auth=false] [--tls-cert F --tls-key F] [--raft-tls-cert F --raft-tls-key F --raft-tls-ca F] [--data-dir D] [--min-lease D] [--max-lease D] [--token-file F] [--cluster-secret-file F] [--add-node HOST] [--only KIND] [--format text|json]\n\nPrints how to start Ticketing: environment, command line, container, docker-compose and systemd, per node.\nExit status: 0 printed, 1 a file named by a flag cannot be read, 2 bad arguments.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ticketing deploy: unexpected argument %q\n", fs.Arg(0))
		return ExitUsage
	}
	// 0 would be the generator's default (7070): given on the command line it is a mistake.
	for _, p := range []struct {
		name string
		v    int
	}{{"port", r.Port}, {"raft-port", r.RaftPort}} {
		if p.v == 0 {
			fmt.Fprintf(stderr, "ticketing deploy: --%s 0: give the port the node listens on (1..65534); the others must know it in advance\n", p.name)
			return ExitUsage
		}
	}
	if hosts != "" {
		r.Hosts = strings.Split(hosts, ",")
	}
	switch format {
	case "text", "json":
	default:
		fmt.Fprintf(stderr, "ticketing deploy: --format %q: want text or json\n", format)
		return ExitUsage
	}
	if only != "" {
		ok := false
		for _, k := range deployKinds {
			ok = ok || k.name == only
		}
		if !ok {
			fmt.Fprintf(stderr, "ticketing deploy: --only %q: want env, command, container, compose or systemd\n", only)
			return ExitUsage
		}
	}
	var err error
	if tokenFile != "" {
		if r.Token, err = readSecretFile("token-file", tokenFile); err != nil {
			fmt.Fprintln(stderr, "ticketing deploy:", err)
			return ExitNo
		}
	}
	if secretFile != "" {
		if r.Secret, err = readSecretFile("cluster-secret-file", secretFile); err != nil {
			fmt.Fprintln(stderr, "ticketing deploy:", err)
			return ExitNo
		}
	}
	plan, err := deploy.Generate(r)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing deploy:", err)
		return ExitUsage
	}
	// Warnings go to stderr whatever the format (stdout may go to a file or a script), and in
	// the output itself: the notes (text), "warnings" (JSON).
	for _, w := range plan.Warnings {
		fmt.Fprintln(stderr, "ticketing deploy:", w)
	}
	if only != "" && plan.ClusterAdd != "" {
		fmt.Fprintf(stderr, "ticketing deploy: once %s runs: %s\n", plan.Nodes[0].Name, plan.ClusterAdd)
	}
	out := stdout
	if format == "json" {
		if only == "" {
			plan.WriteJSON(out)
			return ExitOK
		}
		type onlyNode struct {
			Name   string `json:"name"`
			Host   string `json:"host"`
			Port   int    `json:"port"`
			Unit   string `json:"unit,omitempty"`
			Output string `json:"output"`
		}
		v := struct {
			Only       string     `json:"only"`
			Nodes      []onlyNode `json:"nodes"`
			Warnings   []string   `json:"warnings"`
			ClusterAdd string     `json:"cluster_add,omitempty"`
		}{Only: only, Warnings: plan.Warnings, ClusterAdd: plan.ClusterAdd}
		for _, n := range plan.Nodes {
			on := onlyNode{Name: n.Name, Host: n.Host, Port: n.Port, Output: deployOutput(n, only)}
			if only == "systemd" {
				on.Unit = n.Unit
			}
			v.Nodes = append(v.Nodes, on)
		}
		e := json.NewEncoder(out)
		e.SetIndent("", "  ")
		e.Encode(v)
		return ExitOK
	}
	if only == "" {
		for _, f := range plan.Files {
			fmt.Fprintf(out, "### file %s (mode %s): %s\n%s\n", f.Path, f.Mode, f.About, f.Content)
		}
	}
	for _, n := range plan.Nodes {
		for _, k := range deployKinds {
			if only != "" && k.name != only {
				continue
			}
			title := k.title
			if k.name == "systemd" {
				title += " (/etc/systemd/system/" + n.Unit + ")"
			}
			if only == "" || len(plan.Nodes) > 1 {
				fmt.Fprintf(out, "### %s: %s\n", n.Name, title)
			}
			fmt.Fprint(out, deployOutput(n, k.name))
			if only == "" || len(plan.Nodes) > 1 {
				fmt.Fprintln(out)
			}
		}
	}
	if only == "" {
		if plan.ClusterAdd != "" {
			fmt.Fprintf(out, "### then, where `ticketing cluster` reaches the cluster's admin listeners\n%s\n\n", plan.ClusterAdd)
		}
		for _, note := range plan.Notes {
			fmt.Fprintln(out, "# "+note)
		}
	}
	return ExitOK
}
