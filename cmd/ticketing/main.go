// Command ticketing is the Ticketing lock server and its command-line client in one binary.
//
//	ticketing server                 run the server (configured by TICKETING_* variables or flags)
//	ticketing acquire|release|extend|inspect|lock|ping ...   talk to a server (see `ticketing help`)
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	switch cmd := os.Args[1]; cmd {
	case "server", "serve":
		os.Exit(runServer(os.Args[2:]))
	case "cluster":
		os.Exit(runClusterCmd(os.Args[2:]))
	case "help", "-h", "--help":
		usage()
	default:
		os.Exit(runCLI(cmd, os.Args[2:]))
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: ticketing COMMAND [options]

Server:
  server        run the lock server (see docs/operations.md; every flag is also a TICKETING_* variable)
  cluster status|add|remove|transfer-leader   cluster membership and maintenance (docs/cluster.md)

Client (server address from --addr or TICKETING_ADDR, token from TICKETING_TOKEN):
  acquire KEY   take a lock and print its token
  release KEY TOKEN
  extend KEY TOKEN
  inspect KEY   show a key's holder token, lease left and queue length
  lock KEY -- COMMAND [ARGS...]   run COMMAND while holding KEY
  ping          check that a server answers

Run 'ticketing COMMAND --help' for a command's options.
`)
}
