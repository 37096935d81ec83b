package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/ticketing/ticketing/internal/server"
)

const clusterUsage = `usage: ticketing cluster COMMAND [ARGS] [--admin-addr host:port[,host:port...]] [--json]

Talks to the admin listener of one or more nodes: --admin-addr or TICKETING_ADMIN_ADDR, else each
client address's port + 1 (--addr or TICKETING_ADDR, a list for a cluster), else 127.0.0.1:7071.
Admin credential from --admin-token-file or TICKETING_ADMIN_TOKEN; --admin-ca for HTTPS. Flags may
come before or after the command.

  status                 every member's own view, one row each: role, term, commit and applied
                         index, last contact with the leader, version, ready (asks every address
                         given; a member none of them answers for is shown as such)
  wait-ready             wait until the cluster has a leader and every member is ready and has
                         applied what the leader had committed (--timeout D, default 60s)
  add ID RAFT-ADDR       add a voting member (it must be running with TICKETING_JOIN=true)
  remove ID              remove a member
  transfer-leader [ID]   hand leadership to ID (or to any other member); "transfer" also works

A change goes to the leader: a follower refuses it naming the leader, and the command asks the
leader's admin listener next (the one the follower names, or, with addresses derived from client
addresses, the leader's client port + 1).

Exit status: 0 done (wait-ready: ready), 1 refused (the answer says why; wait-ready: not ready
within --timeout), 2 bad arguments, 3 no listed node reachable or none leads.
`

// RunCluster runs `ticketing cluster ...` and returns the exit code.
func RunCluster(args []string) int {
	fs := flag.NewFlagSet("ticketing cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), clusterUsage) }
	timeout := fs.Duration("timeout", 15*time.Second, "bound on each request (wait-ready: on the whole wait, default 60s)")
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
	cmd, rest := pos[0], pos[1:]
	var wait time.Duration
	if cmd == "wait-ready" {
		wait = 60 * time.Second
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "timeout" {
				wait = *timeout
			}
		})
		*timeout = min(2*time.Second, wait) // each poll
	}
	t, err := target()
	if err != nil {
		fmt.Fprintln(stderr, "ticketing cluster:", err)
		return ExitUsage
	}
	var method, path string
	var body any
	switch {
	case cmd == "status" && len(rest) == 0:
		return clusterStatus(t, *asJSON)
	case cmd == "wait-ready" && len(rest) == 0:
		return clusterWaitReady(t, wait, *asJSON)
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
	// Rounds over the listed nodes (and the leaders they name). While every node that answers
	// says it does not lead (an election in progress), nothing was changed: ask again, for at
	// most --timeout.
	until := time.Now().Add(*timeout)
	for {
		code, retry, why := clusterChange(t, cmd, method, path, body, *asJSON)
		if !retry || !time.Now().Add(250*time.Millisecond).Before(until) {
			if why != "" {
				fmt.Fprintln(stderr, "ticketing cluster "+cmd+": "+why)
			}
			return code
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// clusterChange sends a membership change to the listed nodes until one (the leader) takes it.
// retry: every node that answered refused as not the leader, and one knew no leader.
func clusterChange(t *adminTarget, cmd, method, path string, body any, asJSON bool) (code int, retry bool, why string) {
	var errs []string
	electing, others := false, false
	bases := append([]string(nil), t.bases...)
	for i := 0; i < len(bases); i++ {
		base := bases[i]
		st, err := adminRequest(t, method, base+path, body)
		if err != nil {
			errs = append(errs, err.Error())
			var refused *refusedError
			if errors.As(err, &refused) {
				return ExitNo, false, err.Error()
			}
			// Not the leader: ask the leader next, where the follower (or the rule the
			// addresses were derived by) says its admin listener is.
			var nl *notLeaderError
			if !errors.As(err, &nl) {
				others = true
			} else if nl.leader == "" {
				electing = true
			} else {
				if next := t.leaderAdmin(nl); next != "" && !contains(bases, next) {
					fmt.Fprintf(stderr, "ticketing cluster %s: %s is not the leader; asking the leader %s at %s\n", cmd, hostOf(base), nl.leader, hostOf(next))
					bases = append(bases, next)
				}
			}
			continue // unreachable, or not the leader: another listed node may answer
		}
		if asJSON {
			b, _ := json.Marshal(struct {
				Admin string `json:"admin"`
				*server.ClusterStatus
			}{hostOf(base), st})
			fmt.Fprintln(stdout, string(b))
		} else {
			fmt.Fprintf(stdout, "done by %s (admin %s)\n", st.Node, hostOf(base))
			printChangeStatus(st)
		}
		return ExitOK, false, ""
	}
	return ExitUnavailable, electing && !others, strings.Join(errs, "; ")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func hostOf(base string) string {
	return strings.TrimPrefix(strings.TrimPrefix(base, "https://"), "http://")
}

// leaderAdmin is where to ask the leader a follower named: the admin listener the follower
// gave, else (admin addresses derived from client addresses) the leader's client address by the
// same rule; "" when neither is known.
func (t *adminTarget) leaderAdmin(nl *notLeaderError) string {
	if nl.admin != "" {
		return t.scheme + nl.admin
	}
	if t.derived && nl.addr != "" {
		if a, err := adminAddrs("", nl.addr); err == nil && len(a) == 1 {
			return t.scheme + a[0]
		}
	}
	return ""
}

// refusedError is a node's refusal of a request (a 4xx other than "not the leader"): asking
// another node would not help.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

// notLeaderError is a follower's refusal of a change, naming the leader: its id, its client
// address and its admin listener (each "" when the follower does not know it).
type notLeaderError struct {
	url, msg            string
	leader, addr, admin string
}

func (e *notLeaderError) Error() string { return e.url + ": " + e.msg }

var errUnreachable = errors.New("unreachable")

func adminRequest(t *adminTarget, method, url string, body any) (*server.ClusterStatus, error) {
	return adminRequestCtx(context.Background(), t, method, url, body)
}

func adminRequestCtx(ctx context.Context, t *adminTarget, method, url string, body any) (*server.ClusterStatus, error) {
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
	resp, err := t.client.Do(ctx, method, url, header, b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUnreachable, err)
	}
	msg := strings.TrimSpace(string(resp.Body))
	switch {
	case resp.StatusCode == 409 && (resp.Header.Get("X-Ticketing-Leader") != "" || strings.Contains(msg, "not the leader")):
		return nil, &notLeaderError{url: url, msg: msg, leader: resp.Header.Get("X-Ticketing-Leader"),
			addr: resp.Header.Get("X-Ticketing-Leader-Addr"), admin: resp.Header.Get("X-Ticketing-Leader-Admin")}
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return nil, &refusedError{fmt.Sprintf("%s refused: %s", url, msg)}
	case resp.StatusCode != 200:
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, msg)
	}
	var st server.ClusterStatus
	if err := json.Unmarshal(resp.Body, &st); err != nil {
		return nil, fmt.Errorf("bad answer from %s: %v", url, err)
	}
	return &st, nil
}

// printChangeStatus prints what the node that made a change answers: its view and the
// configuration.
func printChangeStatus(st *server.ClusterStatus) {
	fmt.Fprintf(stdout, "node=%s role=%s serving=%v leader=%s leader_addr=%s term=%d commit=%d applied=%d last_contact_ms=%d state_id=%s\n",
		st.Node, st.Role, st.Serving, st.Leader, st.LeaderAddr, st.Term, st.CommitIndex, st.AppliedIndex, st.LastContactMs, st.StateID)
	for _, m := range st.Members {
		fmt.Fprintf(stdout, "member id=%s raft_addr=%s voter=%v\n", m.ID, m.RaftAddr, m.Voter)
	}
}

// nodeAnswer is one admin listener's answer to GET /cluster/status (or why there is none).
type nodeAnswer struct {
	admin string
	st    *server.ClusterStatus
	err   error
}

// askAll asks every listed admin listener for its status, at once.
func askAll(ctx context.Context, t *adminTarget) []nodeAnswer {
	out := make([]nodeAnswer, len(t.bases))
	var wg sync.WaitGroup
	for i, base := range t.bases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := adminRequestCtx(ctx, t, "GET", base+"/cluster/status", nil)
			out[i] = nodeAnswer{admin: hostOf(base), st: st, err: err}
		}()
	}
	wg.Wait()
	return out
}

// MemberView is one row of `cluster status`: a member of the configuration (or a node that
// answered without being one), and its own status when its admin listener answered.
type MemberView struct {
	ID       string                `json:"id"`
	RaftAddr string                `json:"raft_addr,omitempty"`
	Voter    bool                  `json:"voter"`
	Member   bool                  `json:"member"` // in the configuration
	Admin    string                `json:"admin,omitempty"`
	Status   *server.ClusterStatus `json:"status"` // null: no admin address given answered as this member
}

// ClusterView is `cluster status --json`.
type ClusterView struct {
	Leader      string       `json:"leader"` // "" when none is known
	LeaderAddr  string       `json:"leader_addr,omitempty"`
	Term        uint64       `json:"term"`
	ConfigFrom  string       `json:"config_from,omitempty"` // the node whose configuration lists the members
	Members     []MemberView `json:"members"`
	Unreachable []struct {
		Admin string `json:"admin"`
		Error string `json:"error"`
	} `json:"unreachable"`
}

// view joins the answers into one row per member: the configuration of the leader (or, when
// none answered, of the answer with the highest term) with each member's own answer.
func view(answers []nodeAnswer) *ClusterView {
	v := &ClusterView{Members: []MemberView{}}
	v.Unreachable = v.Unreachable[:0]
	var cfg *nodeAnswer
	for i := range answers {
		a := &answers[i]
		if a.st == nil {
			v.Unreachable = append(v.Unreachable, struct {
				Admin string `json:"admin"`
				Error string `json:"error"`
			}{a.admin, a.err.Error()})
			continue
		}
		if a.st.Role == "leader" || cfg == nil || (cfg.st.Role != "leader" && a.st.Term > cfg.st.Term) {
			cfg = a
		}
	}
	if cfg == nil {
		return v
	}
	v.Leader, v.LeaderAddr, v.Term, v.ConfigFrom = cfg.st.Leader, cfg.st.LeaderAddr, cfg.st.Term, cfg.st.Node
	byID := map[string]*nodeAnswer{}
	for i := range answers {
		if a := &answers[i]; a.st != nil {
			byID[a.st.Node] = a
		}
	}
	seen := map[string]bool{}
	for _, m := range cfg.st.Members {
		mv := MemberView{ID: m.ID, RaftAddr: m.RaftAddr, Voter: m.Voter, Member: true}
		if a := byID[m.ID]; a != nil {
			mv.Admin, mv.Status = a.admin, a.st
		}
		seen[m.ID] = true
		v.Members = append(v.Members, mv)
	}
	// Rows in id order: the configuration's order is the order members were added in, which
	// differs from node to node's bootstrap and reads as noise between two runs.
	slices.SortFunc(v.Members, func(a, b MemberView) int { return strings.Compare(a.ID, b.ID) })
	for _, a := range answers { // nodes that answered without being members (joining, removed, single)
		if a.st != nil && !seen[a.st.Node] {
			seen[a.st.Node] = true
			v.Members = append(v.Members, MemberView{ID: a.st.Node, Admin: a.admin, Status: a.st})
		}
	}
	return v
}

func clusterStatus(t *adminTarget, asJSON bool) int {
	answers := askAll(context.Background(), t)
	v := view(answers)
	if asJSON {
		b, _ := json.Marshal(v)
		fmt.Fprintln(stdout, string(b))
	} else {
		printView(stdout, v)
	}
	for _, a := range answers {
		if a.st != nil {
			return ExitOK
		}
	}
	return ExitUnavailable
}

// printView writes v as a table, one row per member, then the addresses that did not answer.
func printView(w io.Writer, v *ClusterView) {
	switch {
	case len(v.Members) == 1 && v.Members[0].Status != nil && v.Members[0].Status.Role == "single":
		fmt.Fprintln(w, "single node (no cluster)")
	case v.Leader != "":
		fmt.Fprintf(w, "leader %s (client address %s), term %d\n", v.Leader, v.LeaderAddr, v.Term)
	case v.ConfigFrom != "":
		fmt.Fprintf(w, "no leader known (term %d)\n", v.Term)
	}
	if len(v.Members) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MEMBER\tRAFT ADDR\tVOTER\tROLE\tTERM\tCOMMIT\tAPPLIED\tLAST CONTACT\tVERSION\tREADY\tADMIN")
		for _, m := range v.Members {
			voter := "no"
			switch {
			case !m.Member:
				voter = "not a member"
			case m.Voter:
				voter = "yes"
			}
			id, raftAddr := m.ID, m.RaftAddr
			if id == "" {
				id = "-"
			}
			if raftAddr == "" {
				raftAddr = "-"
			}
			st := m.Status
			if st == nil {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t-\t-\t-\t-\t%s\t-\n", id, raftAddr, voter, "?", "no answer")
				continue
			}
			contact := "-" // the leader, a single node
			switch {
			case st.Role == "leader" || st.Role == "single":
			case st.LastContactMs < 0:
				contact = "never"
			default:
				contact = (time.Duration(st.LastContactMs) * time.Millisecond).String()
			}
			ready := "yes"
			if !st.Ready {
				ready = "no: " + st.NotReady
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", id, raftAddr, voter, st.Role, st.Term,
				st.CommitIndex, st.AppliedIndex, contact, orDash(st.Version), ready, m.Admin)
		}
		tw.Flush()
	}
	for _, u := range v.Unreachable {
		fmt.Fprintf(w, "%s: unreachable: %s\n", u.Admin, u.Error)
	}
	for _, m := range v.Members {
		if m.Status == nil {
			fmt.Fprintf(w, "%s: none of the admin addresses asked answered as this member (unreachable, or its admin address was not given)\n", m.ID)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// readiness says whether v is a cluster with a leader whose members are all ready and have
// applied at least mark (the leader's commit index at an earlier check); why not otherwise. A
// single node is ready when it says so.
func (v *ClusterView) readiness(mark uint64) (bool, string) {
	if len(v.Members) == 0 {
		return false, "no admin address given answered"
	}
	if len(v.Members) == 1 && v.Members[0].Status != nil && v.Members[0].Status.Role == "single" {
		if st := v.Members[0].Status; !st.Ready {
			return false, "not ready: " + st.NotReady
		}
		return true, ""
	}
	var leader *server.ClusterStatus
	for _, m := range v.Members {
		if m.Status != nil && m.Status.Role == "leader" && m.Status.Serving {
			leader = m.Status
		}
	}
	if leader == nil {
		return false, "no leader serving among the nodes that answered"
	}
	var why []string
	for _, m := range v.Members {
		switch st := m.Status; {
		case !m.Member:
		case st == nil:
			why = append(why, m.ID+": no answer")
		case !st.Ready:
			why = append(why, m.ID+": not ready: "+st.NotReady)
		case st.AppliedIndex < mark:
			why = append(why, fmt.Sprintf("%s: applied %d, behind the leader's commit %d", m.ID, st.AppliedIndex, mark))
		}
	}
	sort.Strings(why)
	return len(why) == 0, strings.Join(why, "; ")
}

// clusterWaitReady is `cluster wait-ready`: it polls every listed admin listener until the
// cluster has a serving leader and every member of its configuration is ready and has applied
// what the leader had committed at the previous poll (so a steady stream of writes does not
// keep it waiting), or until wait has passed.
func clusterWaitReady(t *adminTarget, wait time.Duration, asJSON bool) int {
	deadline := time.Now().Add(wait)
	var mark uint64 // the leader's commit index at the previous poll
	first := true
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		v := view(askAll(ctx, t))
		cancel()
		var commit uint64
		for _, m := range v.Members {
			if m.Status != nil && m.Status.Role == "leader" && m.Status.Serving {
				commit = m.Status.CommitIndex
			}
		}
		if first {
			mark, first = commit, false
		}
		ok, why := v.readiness(mark)
		if ok {
			if asJSON {
				b, _ := json.Marshal(v)
				fmt.Fprintln(stdout, string(b))
			} else {
				n := 0
				for _, m := range v.Members {
					if m.Member {
						n++
					}
				}
				if v.Leader != "" {
					fmt.Fprintf(stdout, "ready: leader %s, %d members ready, each applied at least index %d\n", v.Leader, n, mark)
				} else {
					fmt.Fprintln(stdout, "ready")
				}
			}
			return ExitOK
		}
		if !time.Now().Add(200 * time.Millisecond).Before(deadline) {
			fmt.Fprintf(stderr, "ticketing cluster wait-ready: not ready within %v: %s\n", wait, why)
			printView(stderr, v)
			return ExitNo
		}
		time.Sleep(200 * time.Millisecond)
		if commit > 0 {
			mark = commit
		}
	}
}
