package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ticketing/ticketing/internal/adminhttp"
	"github.com/ticketing/ticketing/internal/server"
)

const clusterUsage = `usage: ticketing cluster [--admin host:port[,host:port...]] COMMAND

Talks to the admin listener of one or more nodes (TICKETING_ADMIN_ADDR; admin credential from
TICKETING_ADMIN_TOKEN; --admin-ca for an admin listener with TLS).

  status                 this node's role, the leader, term, indexes and members
  add ID RAFT-ADDR       add a voting member (sent to whichever listed node leads)
  remove ID              remove a member
  transfer-leader [ID]   hand leadership to ID (or to any other member)
`

// RunCluster runs `ticketing cluster ...` and returns the exit code.
func RunCluster(args []string) int {
	fs := flag.NewFlagSet("ticketing cluster", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), clusterUsage) }
	admin := fs.String("admin", envOr("TICKETING_ADMIN_ADDR", "127.0.0.1:7071"), "admin listener address(es), comma-separated")
	ca := fs.String("admin-ca", os.Getenv("TICKETING_ADMIN_CA"), "PEM CA of the admin listener's certificate (uses https)")
	timeout := fs.Duration("timeout", 15*time.Second, "bound on each request")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	hc := &adminhttp.Client{Timeout: *timeout}
	scheme := "http"
	if *ca != "" {
		pem, err := os.ReadFile(*ca)
		if err != nil {
			fmt.Fprintln(os.Stderr, "ticketing cluster:", err)
			return 2
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		hc.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		scheme = "https"
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	var method, path string
	var body any
	switch {
	case cmd == "status" && len(rest) == 0:
		method, path = "GET", "/cluster/status"
	case cmd == "add" && len(rest) == 2:
		method, path, body = "POST", "/cluster/add", map[string]string{"id": rest[0], "raft_addr": rest[1]}
	case cmd == "remove" && len(rest) == 1:
		method, path, body = "POST", "/cluster/remove", map[string]string{"id": rest[0]}
	case cmd == "transfer-leader" && len(rest) <= 1:
		method, path = "POST", "/cluster/transfer"
		if len(rest) == 1 {
			body = map[string]string{"id": rest[0]}
		}
	default:
		fmt.Fprintf(os.Stderr, "ticketing cluster: bad command %q\n%s", strings.Join(fs.Args(), " "), clusterUsage)
		return 2
	}
	var lastErr error
	for _, a := range strings.Split(*admin, ",") {
		st, err := adminRequest(hc, method, scheme+"://"+strings.TrimSpace(a)+path, body)
		if err != nil {
			lastErr = err
			if errors.Is(err, errNotLeader) || errors.Is(err, errUnreachable) {
				continue // another listed node may lead
			}
			break
		}
		printStatus(st)
		return 0
	}
	fmt.Fprintln(os.Stderr, "ticketing cluster "+cmd+":", lastErr)
	return 3
}

var (
	errNotLeader   = errors.New("not the leader")
	errUnreachable = errors.New("unreachable")
)

func adminRequest(hc *adminhttp.Client, method, url string, body any) (*server.ClusterStatus, error) {
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	header := map[string]string{}
	if t := os.Getenv("TICKETING_ADMIN_TOKEN"); t != "" {
		header["Authorization"] = "Bearer " + t
	}
	if b != nil {
		header["Content-Type"] = "application/json"
	}
	resp, err := hc.Do(context.Background(), method, url, header, b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUnreachable, err)
	}
	switch {
	case resp.StatusCode == 409:
		return nil, fmt.Errorf("%w (%s): the leader is %s", errNotLeader, url, resp.Header.Get("X-Ticketing-Leader"))
	case resp.StatusCode != 200:
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(resp.Body)))
	}
	var st server.ClusterStatus
	if err := json.Unmarshal(resp.Body, &st); err != nil {
		return nil, fmt.Errorf("bad answer from %s: %v", url, err)
	}
	return &st, nil
}

func printStatus(st *server.ClusterStatus) {
	fmt.Printf("node=%s role=%s serving=%v leader=%s leader_addr=%s term=%d commit=%d applied=%d state_id=%s\n",
		st.Node, st.Role, st.Serving, st.Leader, st.LeaderAddr, st.Term, st.CommitIndex, st.AppliedIndex, st.StateID)
	for _, m := range st.Members {
		fmt.Printf("member id=%s raft_addr=%s voter=%v\n", m.ID, m.RaftAddr, m.Voter)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
