// Command ticketing is the Ticketing lock server and its command-line client in one binary.
//
//	ticketing server                 run the server (configured by TICKETING_* variables or flags)
//	ticketing [FLAGS] acquire|release|extend|inspect|lock|ping ...   talk to a server (see `ticketing help`)
//
// It only dispatches: the server is started here (server.go) from the settings that
// internal/settings parses; every other command is internal/cli's.
package main

import (
	"fmt"
	"os"

	"github.com/ticketing/ticketing/internal/cli"
	"github.com/ticketing/ticketing/internal/version"
)

func main() {
	if len(os.Args) < 2 {
		usageText(os.Stderr)
		os.Exit(cli.ExitUsage)
	}
	switch cmd := os.Args[1]; cmd {
	case "server", "serve": // server.go
		os.Exit(runServer(os.Args[2:]))
	case "cluster": // membership through a node's admin listener
		os.Exit(cli.RunCluster(os.Args[2:]))
	case "deploy", "top", "healthcheck": // operations commands
		os.Exit(cli.RunOps(cmd, os.Args[2:]))
	case "help", "-h", "-help", "--help":
		usageText(os.Stdout)
	case "version", "--version", "-version":
		fmt.Println("ticketing", version.Get())
	case cli.SuperviseCommand:
		// The watchdog that `ticketing lock` starts; not for users.
		os.Exit(cli.RunSupervisor())
	default:
		global, cmd, rest, err := cli.SplitGlobal(os.Args[1:])
		if err != nil {
			fmt.Fprintf(os.Stderr, "ticketing: %v (run 'ticketing help')\n", err)
			os.Exit(cli.ExitUsage)
		}
		if cmd == "server" || cmd == "serve" || cmd == cli.SuperviseCommand {
			fmt.Fprintln(os.Stderr, "ticketing: the flags before the command are for the client commands; give the server's flags after 'server'")
			os.Exit(cli.ExitUsage)
		}
		// Global flags are the command's own flags, given first: the command's later ones win.
		os.Exit(cli.Run(cmd, append(global, rest...)))
	}
}

func usageText(w *os.File) {
	fmt.Fprint(w, `usage: ticketing COMMAND [options]
       ticketing [--addr A] [--timeout D] [--tls] [--tls-ca F] [--tls-cert F --tls-key F] COMMAND [options]

Server:
  server        run the lock server (see docs/operations.md; every flag is also a TICKETING_* variable)
  cluster       status|add|remove|transfer: a cluster's members, through a node's admin listener
  deploy        print launch commands (flags, environment, systemd, container) for a node or a cluster
  top           the most contended keys, live, from the admin listener
  healthcheck   exit 0 when the admin listener's /healthz answers (for container health checks)
  version       this binary's release, commit and Go version (also --version)

Client (server address from --addr or TICKETING_ADDR, token from TICKETING_TOKEN or TICKETING_TOKEN_FILE):
  acquire KEY   take a lock and print its fencing token
  release KEY TOKEN
  extend KEY TOKEN
  inspect KEY   show whether a key is held, the lease left and how many wait
  lock KEY -- COMMAND [ARGS...]   run COMMAND while holding KEY
  ping          check that a server answers

The client flags may come before or after the command name. Exit status: 0 ok, 1 not acquired or
not held, 2 bad arguments, 3 cannot reach or talk to the server, 4 authentication failed, 5 TLS
error, 75 lock lost while COMMAND ran (lock), 128+N killed by signal N.
Run 'ticketing COMMAND --help' for a command's options (docs/cli.md has the details).
`)
}
