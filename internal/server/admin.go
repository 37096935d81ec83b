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
	LastContact   string          `json:"last_contact"`    // as Raft says it: "115.3ms", "0" (the leader), "never"
	LastContactMs int64           `json:"last_contact_ms"` // the same in milliseconds; 0 on the leader and a single node, -1 never
	StateID       string          `json:"state_id"`
	StateHash     string          `json:"state_hash"`
	Members       []ClusterMember `json:"members"`
}

// ClusterMember is one server of the Raft configuration.
type ClusterMember struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	Voter    bool   `json:"voter"`
}

func (s *Server) clusterStatus(w *adminhttp.Response, r *adminhttp.Request) {
	st := ClusterStatus{Role: "single", Serving: true}
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
		code := 500
		if errors.Is(err, raft.ErrNotLeader) {
			code = 409
			w.Set("X-Ticketing-Leader", c.leaderAdminHint())
		}
		w.Error(code, err.Error())
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

// leaderAdminHint names the leader for an admin client sent to a follower.
func (c *cluster) leaderAdminHint() string {
	_, id := c.raft.LeaderWithID()
	return string(id)
}
