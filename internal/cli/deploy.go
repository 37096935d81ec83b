package cli

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/ticketing/ticketing/internal/deploy"
)

// runDeploy is `ticketing deploy`: the launch-command generator (internal/deploy) on the
// command line.
func runDeploy(args []string) int {
	fs := flag.NewFlagSet("deploy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var r deploy.Request
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
			return ExitOK
		}
		return ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ticketing deploy: unexpected argument %q\n", fs.Arg(0))
		return ExitUsage
	}
	if hosts != "" {
		r.Hosts = strings.Split(hosts, ",")
	}
	plan, err := deploy.Generate(r)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing deploy:", err)
		return ExitUsage
	}
	switch format {
	case "json":
		plan.WriteJSON(stdout)
		return ExitOK
	case "text":
	default:
		fmt.Fprintf(stderr, "ticketing deploy: --format %q: want text or json\n", format)
		return ExitUsage
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
			return ExitUsage
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
	return ExitOK
}
