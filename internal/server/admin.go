package server

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

// The admin listener: a separate HTTP port for operators, on loopback by default. Off loopback
// it requires TLS and its own admin credential (a bearer token, never the client token), so
// neither the credential nor what the pages show crosses a network in clear.
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
func (s *Server) AdminMux() *http.ServeMux { return s.adminMux }

func (s *Server) initAdmin() {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if ok, why := s.ready(); !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /cluster/status", s.clusterStatus)
	mux.HandleFunc("POST /cluster/add", s.clusterChange)
	mux.HandleFunc("POST /cluster/remove", s.clusterChange)
	mux.HandleFunc("POST /cluster/transfer", s.clusterChange)
	s.metrics = s.initOps(mux) // inspect.go: /metrics, /api/*, the admin page
	s.adminMux = mux
}

// ready reports whether the node can serve clients now, and why not.
func (s *Server) ready() (bool, string) {
	if s.isStopping() {
		return false, "stopping"
	}
	if c := s.cluster; c != nil {
		if c.ready() {
			return true, ""
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
func (s *Server) adminAuth(h http.Handler, needToken bool) http.Handler {
	want := []byte("Bearer " + s.cfg.AdminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if needToken && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ticketing admin"`)
			http.Error(w, "admin credential required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// ServeAdmin runs the admin listener on ln until Shutdown.
func (s *Server) ServeAdmin(ln net.Listener) error {
	needToken := !isLoopback(ln.Addr())
	srv := &http.Server{Handler: s.adminAuth(s.adminMux, needToken), ReadHeaderTimeout: 5 * time.Second}
	if needToken {
		if s.cfg.AdminToken == "" || s.cfg.AdminTLS == nil {
			return errors.New("TICKETING_ADMIN_ADDR off loopback needs TICKETING_ADMIN_TOKEN and TLS (TICKETING_ADMIN_TLS_CERT/KEY)")
		}
		srv.TLSConfig = s.cfg.AdminTLS
	}
	go func() {
		<-s.done
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	var err error
	if srv.TLSConfig != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func isLoopback(a net.Addr) bool {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.IsLoopback()
	}
	return false
}

// ClusterStatus is the JSON of GET /cluster/status.
type ClusterStatus struct {
	Node         string          `json:"node"`
	Role         string          `json:"role"` // leader, follower, candidate, single
	Serving      bool            `json:"serving"`
	Leader       string          `json:"leader"`
	LeaderAddr   string          `json:"leader_addr"` // the leader's client address
	Term         uint64          `json:"term"`
	CommitIndex  uint64          `json:"commit_index"`
	AppliedIndex uint64          `json:"applied_index"`
	LastContact  string          `json:"last_contact"`
	StateID      string          `json:"state_id"`
	StateHash    string          `json:"state_hash"`
	Members      []ClusterMember `json:"members"`
}

// ClusterMember is one server of the Raft configuration.
type ClusterMember struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	Voter    bool   `json:"voter"`
}

func (s *Server) clusterStatus(w http.ResponseWriter, r *http.Request) {
	st := ClusterStatus{Role: "single", Serving: true}
	s.mu.Lock()
	id := s.StateIDLocked()
	hash := s.table.StateHash()
	s.mu.Unlock()
	st.StateID, st.StateHash = hex.EncodeToString(id[:]), hex.EncodeToString(hash[:])
	if c := s.cluster; c != nil {
		st.Node = c.cfg.NodeID
		st.Role = strings.ToLower(c.raft.State().String())
		st.Serving = c.ready()
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
		if f := c.raft.GetConfiguration(); f.Error() == nil {
			for _, m := range f.Configuration().Servers {
				st.Members = append(st.Members, ClusterMember{ID: string(m.ID), RaftAddr: string(m.Address), Voter: m.Suffrage == raft.Voter})
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(st)
}

// StateIDLocked is StateID with Server.mu held.
func (s *Server) StateIDLocked() [16]byte {
	if s.cluster != nil {
		return s.table.StateID()
	}
	return s.stateID
}

func (s *Server) clusterChange(w http.ResponseWriter, r *http.Request) {
	c := s.cluster
	if c == nil {
		http.Error(w, "not a cluster node", http.StatusBadRequest)
		return
	}
	var req struct {
		ID       string `json:"id"`
		RaftAddr string `json:"raft_addr"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
			http.Error(w, "bad JSON: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	var f raft.Future
	switch r.URL.Path {
	case "/cluster/add":
		if req.ID == "" || req.RaftAddr == "" {
			http.Error(w, `want {"id": ..., "raft_addr": "host:port"}`, http.StatusBadRequest)
			return
		}
		f = c.raft.AddVoter(raft.ServerID(req.ID), raft.ServerAddress(req.RaftAddr), 0, 10*time.Second)
	case "/cluster/remove":
		if req.ID == "" {
			http.Error(w, `want {"id": ...}`, http.StatusBadRequest)
			return
		}
		f = c.raft.RemoveServer(raft.ServerID(req.ID), 0, 10*time.Second)
	case "/cluster/transfer":
		if req.ID == "" {
			f = c.raft.LeadershipTransfer()
		} else {
			cfg := c.raft.GetConfiguration()
			if err := cfg.Error(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			var addr raft.ServerAddress
			for _, m := range cfg.Configuration().Servers {
				if string(m.ID) == req.ID {
					addr = m.Address
				}
			}
			if addr == "" {
				http.Error(w, "no member "+req.ID, http.StatusNotFound)
				return
			}
			f = c.raft.LeadershipTransferToServer(raft.ServerID(req.ID), addr)
		}
	}
	if err := f.Error(); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, raft.ErrNotLeader) {
			code = http.StatusConflict
			w.Header().Set("X-Ticketing-Leader", c.leaderAdminHint())
		}
		http.Error(w, err.Error(), code)
		return
	}
	s.clusterStatus(w, r)
}

// leaderAdminHint names the leader for an admin client sent to a follower.
func (c *cluster) leaderAdminHint() string {
	_, id := c.raft.LeaderWithID()
	return string(id)
}
