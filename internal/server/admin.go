package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ticketing/ticketing/internal/adminhttp"
	"github.com/ticketing/ticketing/internal/version"
)

// The admin listener: a separate HTTP/1.1 port (internal/adminhttp) for operators, on loopback
// by default. Off loopback it requires TLS and its own admin credential (a bearer token, never
// the client token), so neither the credential nor what the pages show crosses a network in
// clear. At most Config.AdminMaxConnections connections are open at once, so that a flood of
// them cannot take the descriptors the client port needs.
//
//	GET  /healthz            200 while the node runs
//	GET  /readyz             200 when it can serve clients now (single node: past its start-up
//	                         wait with storage working; cluster: a leader is known and a quorum
//	                         reachable), else 503 with the reason
//	GET  /cluster/status     JSON: this node's role, the leader, term, indexes, members
//	POST /cluster/add        {"id": "n4", "raft_addr": "host:port"}: add a voter (on the leader)
//	POST /cluster/remove     {"id": "n2"}: remove a member (on the leader)
//	POST /cluster/transfer   {"id": "n2"} or {}: hand leadership to a node (or any)
//
// A membership change sent to a follower is refused (409) with the leader named in the message
// and in headers: X-Ticketing-Leader (its id), X-Ticketing-Leader-Addr (its client address) and,
// when this node can tell, X-Ticketing-Leader-Admin (its admin listener); `ticketing cluster`
// retries there. The follower does not forward the change itself: it knows the leader's client
// address from the log, but not where the leader's admin listener is reachable from (on loopback
// by default, where only a process on the leader's host reaches it).
//
// Further handlers (metrics, inspection, the page) register on AdminMux.

// AdminMux is the admin listener's handler; other files add routes to it before Serve.
func (s *Server) AdminMux() *adminhttp.Mux { return s.adminMux }

func (s *Server) initAdmin() {
	mux := &adminhttp.Mux{}
	mux.Handle("GET /healthz", func(w *adminhttp.Response, r *adminhttp.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /readyz", func(w *adminhttp.Response, r *adminhttp.Request) {
		if ok, why := s.readiness(); !ok {
			w.Error(503, why)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /cluster/status", s.clusterStatus)
	mux.Handle("POST /cluster/add", s.clusterChange)
	mux.Handle("POST /cluster/remove", s.clusterChange)
	mux.Handle("POST /cluster/transfer", s.clusterChange)
	s.metrics = s.initOps(mux) // inspect.go: /metrics, /api/*, the admin page
	s.adminMux = mux
}

// readiness reports whether the node can serve clients now, and why not.
func (s *Server) readiness() (bool, string) {
	if s.isStopping() {
		return false, "stopping"
	}
	if c := s.cluster; c != nil {
		if c.leads() {
			return true, ""
		}
		if _, ok := c.member(c.cfg.NodeID); !ok {
			return false, "not a member of the cluster's configuration (not added yet, or removed)"
		}
		_, id := c.raft.LeaderWithID()
		if id == "" {
			return false, "no leader known"
		}
		if last := c.raft.LastContact(); time.Since(last) > 4*time.Duration(float64(baseHeartbeat)*c.cfg.timing()) {
			return false, fmt.Sprintf("no contact with the leader %s for %v", id, time.Since(last).Round(time.Millisecond))
		}
		return true, ""
	}
	s.mu.Lock()
	_, _, failing := s.table.Bounds()
	waiting := s.table.Now() < s.startWait
	s.mu.Unlock()
	switch {
	case failing:
		return false, "storage failing: grants wait for the data directory"
	case waiting:
		return false, "start-up wait: leases from before this start may still run"
	}
	return true, ""
}

// adminAuth wraps the mux: off loopback, every request needs the admin bearer token.
func (s *Server) adminAuth(h adminhttp.Handler, needToken bool) adminhttp.Handler {
	want := []byte("Bearer " + s.cfg.AdminToken)
	return func(w *adminhttp.Response, r *adminhttp.Request) {
		if needToken && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Set("WWW-Authenticate", `Bearer realm="ticketing admin"`)
			w.Error(401, "admin credential required")
			return
		}
		h(w, r)
	}
}

// ServeAdmin runs the admin listener on ln until Shutdown.
func (s *Server) ServeAdmin(ln net.Listener) error {
	needToken := !isLoopback(ln.Addr())
	srv := &adminhttp.Server{Handler: s.adminAuth(s.adminMux.Serve, needToken), HeaderTimeout: 5 * time.Second,
		MaxConns: s.cfg.AdminMaxConnections}
	if needToken {
		if s.cfg.AdminToken == "" || s.cfg.AdminTLS == nil {
			return errors.New("TICKETING_ADMIN_ADDR off loopback needs TICKETING_ADMIN_TOKEN and TLS (TICKETING_ADMIN_TLS_CERT/KEY)")
		}
		ln = tls.NewListener(ln, s.cfg.AdminTLS)
	}
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-s.done:
			srv.Close(time.Second)
		case <-stopped:
		}
	}()
	return srv.Serve(ln)
}

func isLoopback(a net.Addr) bool {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.IsLoopback()
	}
	return false
}

// ClusterStatus is the JSON of GET /cluster/status.
type ClusterStatus struct {
	Node          string          `json:"node"`
	Role          string          `json:"role"` // leader, follower, candidate, single
	Serving       bool            `json:"serving"`
	Leader        string          `json:"leader"`
	LeaderAddr    string          `json:"leader_addr"` // the leader's client address
	Term          uint64          `json:"term"`
	CommitIndex   uint64          `json:"commit_index"`
	AppliedIndex  uint64          `json:"applied_index"`
	LastContact   string          `json:"last_contact"`           // as Raft says it: "115.3ms", "0" (the leader), "never"
	LastContactMs int64           `json:"last_contact_ms"`        // the same in milliseconds; 0 on the leader and a single node, -1 never
	LeaderAdmin   string          `json:"leader_admin,omitempty"` // the leader's admin listener, when this node can tell (leaderAdminAddr)
	StateID       string          `json:"state_id"`
	StateHash     string          `json:"state_hash"`
	Version       string          `json:"version"`             // this node's release
	Ready         bool            `json:"ready"`               // what GET /readyz answers: 200
	NotReady      string          `json:"not_ready,omitempty"` // and why not
	Members       []ClusterMember `json:"members"`
}

// ClusterMember is one server of the Raft configuration.
type ClusterMember struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	Voter    bool   `json:"voter"`
}

func (s *Server) clusterStatus(w *adminhttp.Response, r *adminhttp.Request) {
	st := ClusterStatus{Role: "single", Serving: true, Version: version.Version}
	st.Ready, st.NotReady = s.readiness()
	s.mu.Lock()
	id := s.sm.stateID()
	snap := s.table.Snapshot() // serialised under the lock, hashed outside it (locktable.Table.StateHash)
	s.mu.Unlock()
	hash := sha256.Sum256(snap)
	st.StateID, st.StateHash = hex.EncodeToString(id[:]), hex.EncodeToString(hash[:])
	if c := s.cluster; c != nil {
		st.Node = c.cfg.NodeID
		st.Role = strings.ToLower(c.raft.State().String())
		st.Serving = c.leads()
		_, lid := c.raft.LeaderWithID()
		st.Leader = string(lid)
		st.LeaderAddr = c.leaderHint()
		if st.Leader == c.cfg.NodeID {
			st.LeaderAddr = c.advertise()
		}
		st.LeaderAdmin = s.leaderAdminAddr(st.LeaderAddr)
		stats := c.raft.Stats()
		fmt.Sscan(stats["term"], &st.Term)
		fmt.Sscan(stats["commit_index"], &st.CommitIndex)
		st.AppliedIndex = c.raft.AppliedIndex()
		st.LastContact = stats["last_contact"]
		switch lc := st.LastContact; lc {
		case "0", "":
		case "never":
			st.LastContactMs = -1
		default:
			if d, err := time.ParseDuration(lc); err == nil {
				st.LastContactMs = d.Milliseconds()
			}
		}
		if f := c.raft.GetConfiguration(); f.Error() == nil {
			for _, m := range f.Configuration().Servers {
				st.Members = append(st.Members, ClusterMember{ID: string(m.ID), RaftAddr: string(m.Address), Voter: m.Suffrage == raft.Voter})
			}
		}
	}
	w.Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(st)
}

func (s *Server) clusterChange(w *adminhttp.Response, r *adminhttp.Request) {
	c := s.cluster
	if c == nil {
		w.Error(400, "not a cluster node")
		return
	}
	var req struct {
		ID       string `json:"id"`
		RaftAddr string `json:"raft_addr"`
	}
	if len(r.Body) > 4096 {
		w.Error(413, "body over 4096 bytes")
		return
	}
	if len(r.Body) != 0 {
		if err := json.Unmarshal(r.Body, &req); err != nil {
			w.Error(400, "bad JSON: "+err.Error())
			return
		}
	}
	if c.raft.State() != raft.Leader {
		s.notLeader(w)
		return
	}
	var f raft.Future
	switch r.Path {
	case "/cluster/add":
		if req.ID == "" || req.RaftAddr == "" {
			w.Error(400, `want {"id": ..., "raft_addr": "host:port"}`)
			return
		}
		if code, msg := c.checkAdd(req.ID, req.RaftAddr); code != 0 {
			w.Error(code, msg)
			return
		}
		f = c.raft.AddVoter(raft.ServerID(req.ID), raft.ServerAddress(req.RaftAddr), 0, 10*time.Second)
	case "/cluster/remove":
		if req.ID == "" {
			w.Error(400, `want {"id": ...}`)
			return
		}
		if _, ok := c.member(req.ID); !ok {
			w.Error(404, "no member "+req.ID)
			return
		}
		f = c.raft.RemoveServer(raft.ServerID(req.ID), 0, 10*time.Second)
	case "/cluster/transfer":
		if req.ID == "" {
			f = c.raft.LeadershipTransfer()
		} else {
			cfg := c.raft.GetConfiguration()
			if err := cfg.Error(); err != nil {
				w.Error(500, err.Error())
				return
			}
			var addr raft.ServerAddress
			for _, m := range cfg.Configuration().Servers {
				if string(m.ID) == req.ID {
					addr = m.Address
				}
			}
			if addr == "" {
				w.Error(404, "no member "+req.ID)
				return
			}
			f = c.raft.LeadershipTransferToServer(raft.ServerID(req.ID), addr)
		}
	}
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			s.notLeader(w)
			return
		}
		w.Error(500, err.Error())
		return
	}
	switch r.Path {
	case "/cluster/add", "/cluster/remove":
		n := c.voters()
		if r.Path == "/cluster/add" {
			s.log.Info("cluster: member added", "id", req.ID, "raft_addr", req.RaftAddr, "voters", n)
		} else {
			s.log.Info("cluster: member removed", "id", req.ID, "voters", n)
		}
		if n%2 == 0 {
			s.log.Warn("cluster: an even number of voters tolerates no more failures than one fewer (a majority of 4 is 3): add or remove one more", "voters", n)
		}
	}
	s.clusterStatus(w, r)
}

// member returns the Raft address of member id.
func (c *cluster) member(id string) (raft.ServerAddress, bool) {
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return "", false
	}
	for _, m := range f.Configuration().Servers {
		if string(m.ID) == id {
			return m.Address, true
		}
	}
	return "", false
}

// voters counts the voters of the current configuration.
func (c *cluster) voters() int {
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	n := 0
	for _, m := range f.Configuration().Servers {
		if m.Suffrage == raft.Voter {
			n++
		}
	}
	return n
}

// checkAdd refuses an add that would weaken the cluster: a malformed address, an id already a
// member at another address, or a node that does not answer as a peer (down, a wrong address or
// port, another cluster secret). An unreachable voter counts against the majority at once: with
// 3 voters plus a dead fourth, one more failure stops the cluster. The answer is an HTTP code
// and message (0: go ahead).
func (c *cluster) checkAdd(id, addr string) (int, string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return 400, fmt.Sprintf("raft_addr %q: want host:port", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return 400, fmt.Sprintf("raft_addr %q: the port must be a number from 1 to 65535", addr)
	}
	if have, ok := c.member(id); ok {
		if string(have) == addr {
			return 0, "" // already a member there: adding again changes nothing
		}
		return 409, fmt.Sprintf("%s is already a member at %s: remove it first to move it to %s", id, have, addr)
	}
	if c.dialer == nil {
		return 0, "" // an injected transport (tests): nothing to dial
	}
	conn, err := c.dialer.Dial(raft.ServerAddress(addr), 2*time.Second)
	if err != nil {
		return 400, fmt.Sprintf("%s at %s does not answer as a peer of this cluster (start it first with TICKETING_JOIN=true, the same cluster secret and TICKETING_RAFT_ADDR there): %v", id, addr, err)
	}
	conn.Close()
	return 0, ""
}

// notLeader refuses a membership change on a node that does not lead (409), naming the leader:
// its id, its client address and, when this node can tell, its admin listener (the message and
// the X-Ticketing-Leader* headers, which `ticketing cluster` follows).
func (s *Server) notLeader(w *adminhttp.Response) {
	c := s.cluster
	_, lid := c.raft.LeaderWithID()
	if lid == "" || string(lid) == c.cfg.NodeID {
		w.Error(409, "not the leader, and no leader is known now (an election is in progress, or no majority is reachable): try again in a moment")
		return
	}
	addr := c.leaderHint()
	admin := s.leaderAdminAddr(addr)
	w.Set("X-Ticketing-Leader", string(lid))
	w.Set("X-Ticketing-Leader-Addr", addr)
	w.Set("X-Ticketing-Leader-Admin", admin)
	msg := fmt.Sprintf("not the leader: the leader is %s", lid)
	if addr != "" {
		msg += fmt.Sprintf(" (client address %s)", addr)
	}
	if admin != "" {
		msg += fmt.Sprintf("; send membership changes to its admin listener %s", admin)
	} else {
		msg += "; send membership changes to its admin listener (run the command on its host, or give its admin address)"
	}
	w.Error(409, msg)
}

// leaderAdminAddr is the admin listener of the leader whose client address is leaderAddr, when
// this node can tell: only when this node's own admin listener follows the default rule (its
// client address with the next port), and then by the same rule. Nodes of one cluster are
// configured alike; a node whose admin address was set otherwise (127.0.0.1:7071 beside a
// routable client address, the usual production form) cannot tell, and says "".
func (s *Server) leaderAdminAddr(leaderAddr string) string {
	if leaderAddr == "" || s.cfg.AdminAddr == "off" {
		return ""
	}
	own := s.cfg.AdminListenAddr()
	derived := (&Config{Addr: s.cfg.Addr}).AdminListenAddr()
	host, port, err := net.SplitHostPort(s.cfg.Addr)
	if own == "" || own != derived || port == "0" || err != nil || host == "" {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return "" // a wildcard listener: the leader's advertised host need not be where its admin listens
	}
	return (&Config{Addr: leaderAddr}).AdminListenAddr()
}
