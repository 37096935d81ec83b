package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ticketing/ticketing/internal/server"
)

const clusterUsage = `usage: ticketing cluster COMMAND [ARGS] [--admin-addr host:port[,host:port...]] [--json]

Talks to the admin listener of one or more nodes: --admin-addr or TICKETING_ADMIN_ADDR, else each
client address's port + 1 (--addr or TICKETING_ADDR, a list for a cluster), else 127.0.0.1:7071.
Admin credential from --admin-token-file or TICKETING_ADMIN_TOKEN; --admin-ca for HTTPS. Flags may
come before or after the command. A change goes to whichever listed node leads.

  status                 the asked node's role, the leader, term, indexes, last contact, members
  add ID RAFT-ADDR       add a voting member (it must be running with TICKETING_JOIN=true)
  remove ID              remove a member
  transfer-leader [ID]   hand leadership to ID (or to any other member); "transfer" also works

Exit status: 0 done, 1 refused (the answer says why), 2 bad arguments, 3 no listed node reachable
or none leads.
`

// RunCluster runs `ticketing cluster ...` and returns the exit code.
func RunCluster(args []string) int {
	fs := flag.NewFlagSet("ticketing cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), clusterUsage) }
	timeout := fs.Duration("timeout", 15*time.Second, "bound on each request")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	var client string
	fs.StringVar(&client, "addr", os.Getenv("TICKETING_ADDR"), "client address(es) the admin addresses are derived from (port + 1) when --admin-addr is not given")
	target := adminFlagsTimeout(fs, timeout, func() string { return client })
	// --admin was this command's name for --admin-addr: still accepted.
	fs.Func("admin", "same as --admin-addr", func(v string) error { return fs.Set("admin-addr", v) })
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		return ExitOK
	}
	if err != nil {
		return ExitUsage
	}
	if len(pos) == 0 {
		fs.Usage()
		return ExitUsage
	}
	t, err := target()
	if err != nil {
		fmt.Fprintln(stderr, "ticketing cluster:", err)
		return ExitUsage
	}
	cmd, rest := pos[0], pos[1:]
	var method, path string
	var body any
	switch {
	case cmd == "status" && len(rest) == 0:
		method, path = "GET", "/cluster/status"
	case cmd == "add" && len(rest) == 2:
		method, path, body = "POST", "/cluster/add", map[string]string{"id": rest[0], "raft_addr": rest[1]}
	case cmd == "remove" && len(rest) == 1:
		method, path, body = "POST", "/cluster/remove", map[string]string{"id": rest[0]}
	case (cmd == "transfer-leader" || cmd == "transfer") && len(rest) <= 1:
		method, path = "POST", "/cluster/transfer"
		if len(rest) == 1 {
			body = map[string]string{"id": rest[0]}
		}
	default:
		fmt.Fprintf(stderr, "ticketing cluster: bad command %q\n%s", strings.Join(pos, " "), clusterUsage)
		return ExitUsage
	}
	var errs []string
	for _, base := range t.bases {
		st, err := adminRequest(t, method, base+path, body)
		if err != nil {
			errs = append(errs, err.Error())
			var refused *refusedError
			if errors.As(err, &refused) {
				fmt.Fprintln(stderr, "ticketing cluster "+cmd+":", err)
				return ExitNo
			}
			continue // unreachable, or not the leader: another listed node may answer
		}
		if *asJSON {
			b, _ := json.Marshal(struct {
				Admin string `json:"admin"`
				*server.ClusterStatus
			}{strings.TrimPrefix(strings.TrimPrefix(base, "https://"), "http://"), st})
			fmt.Fprintln(stdout, string(b))
		} else {
			printStatus(st)
		}
		return ExitOK
	}
	fmt.Fprintln(stderr, "ticketing cluster "+cmd+": "+strings.Join(errs, "; "))
	return ExitUnavailable
}

// refusedError is a node's refusal of a request (a 4xx other than "not the leader"): asking
// another node would not help.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

var (
	errNotLeader   = errors.New("not the leader")
	errUnreachable = errors.New("unreachable")
)

func adminRequest(t *adminTarget, method, url string, body any) (*server.ClusterStatus, error) {
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	header := map[string]string{}
	if t.token != "" {
		header["Authorization"] = "Bearer " + t.token
	}
	if b != nil {
		header["Content-Type"] = "application/json"
	}
	resp, err := t.client.Do(context.Background(), method, url, header, b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUnreachable, err)
	}
	switch {
	case resp.StatusCode == 409 && resp.Header.Get("X-Ticketing-Leader") != "":
		return nil, fmt.Errorf("%w (%s): the leader is %s; list its admin address too", errNotLeader, url, resp.Header.Get("X-Ticketing-Leader"))
	case resp.StatusCode == 409 && strings.Contains(string(resp.Body), "leader"):
		return nil, fmt.Errorf("%w (%s): %s", errNotLeader, url, strings.TrimSpace(string(resp.Body)))
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return nil, &refusedError{fmt.Sprintf("%s refused: %s", url, strings.TrimSpace(string(resp.Body)))}
	case resp.StatusCode != 200:
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(resp.Body)))
	}
	var st server.ClusterStatus
	if err := json.Unmarshal(resp.Body, &st); err != nil {
		return nil, fmt.Errorf("bad answer from %s: %v", url, err)
	}
	return &st, nil
}

func printStatus(st *server.ClusterStatus) {
	fmt.Fprintf(stdout, "node=%s role=%s serving=%v leader=%s leader_addr=%s term=%d commit=%d applied=%d last_contact_ms=%d state_id=%s\n",
		st.Node, st.Role, st.Serving, st.Leader, st.LeaderAddr, st.Term, st.CommitIndex, st.AppliedIndex, st.LastContactMs, st.StateID)
	for _, m := range st.Members {
		fmt.Fprintf(stdout, "member id=%s raft_addr=%s voter=%v\n", m.ID, m.RaftAddr, m.Voter)
	}
}
