// Package server owns the sockets of a Ticketing node: it accepts connections, runs the
// handshake (and attaches the client's session), and serves each connection's requests in four
// steps:
//
//   - validate (conn.go, conn.validate): the connection-local checks of every complete frame in
//     a read; invalid requests and PING are answered on the spot;
//   - batch (conn.go, conn.serve): the valid requests of one read, in order;
//   - apply (machine.go): the batch goes through the machine, the one seam between the request
//     path and the state machine: on a single node (local) the lock table runs it at once under
//     Server.mu; in a cluster (replicated.go) it becomes a command of the next log entry
//     (proposer.go), and every replica's FSM (fsm.go) makes the same table call when the entry
//     commits;
//   - route (route.go, Server.route): the table's outputs go to their connections — the
//     batch's own answers to the reader's buffer, hand-offs, EXPIRED and answers for other
//     sessions to theirs — and every batch is written with one write (output.go).
//
// The durable token ceiling and restart horizon of a single node (persist.go) and the clock that
// drives deadlines (machine.tick) feed the table through the same route step (routeUnlock).
//
// Locks, in order: conn.wmu (the one writer of a connection; the only mutex held across a
// socket write), Server.mu (the lock table, the connection registry, the timer, each
// connection's pending handshake, the cluster's applied time), proposer.mu (the open log
// entry), conn.mu (a connection's output buffer and grant marks). Neither Server.mu nor conn.mu
// is held during socket or disk I/O (durable writes run in persist.go's goroutine; Raft's in
// hashicorp/raft's). Other mutexes are leaves: cluster.monoMu (the leader's time base),
// timedLogStore.mu (one log write at a time), Server.lnMu (the listener against Shutdown),
// metrics' own.
package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing/ticketing/internal/adminhttp"
	"github.com/ticketing/ticketing/internal/clock"
	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/internal/store"
	"github.com/ticketing/ticketing/internal/version"
	"github.com/ticketing/ticketing/wire"
)

// Server is a single Ticketing node.
type Server struct {
	cfg     Config
	log     *slog.Logger
	store   *store.Store
	boot0   int64        // CLOCK_BOOTTIME at start: the table's clock is Boottime() - boot0
	clk     *clock.Since // reads Boottime() - boot0 cheaply (the request path reads it per batch)
	stateID [wire.StateIDSize]byte
	auth    atomic.Pointer[authKeys]
	tlsCert atomic.Pointer[tls.Certificate]

	// mu (Server.mu) guards the fields from here to the blank line, the table's observer, and
	// each connection's handshake state and registry flags (conn.hs, inToFlush, detached, inToDetach).
	mu       sync.Mutex
	table    *locktable.Table
	conns    map[uint64]*conn // attached connections by id
	nextConn uint64
	timer    *time.Timer
	timerAt  int64 // when timer fires; valid while armed
	armed    bool
	stopping bool
	toFlush  []*conn            // connections route gave output to; see takeToFlush
	toDetach []*conn            // connections to detach before Server.mu is released; see detachLater
	reqs     []wire.Request     // decode scratch of the cluster's apply
	obs      locktable.Observer // metrics (nil: none); kept across table restores

	// Set once in New, read-only after.
	sm        machine // how changes reach the table: local (single node) or the cluster
	connBase  uint64  // connection ids are connBase | nextConn (a cluster: random per process)
	adminMux  *adminhttp.Mux
	metrics   *metrics // metrics.go: Prometheus series, the contention sketch; set by initAdmin
	startWait int64    // single node: the table time before which nothing is granted
	cluster   *cluster // nil on a single node

	attached atomic.Int64 // connection slots taken: len(conns) plus handshakes holding one (takeSlot); at most MaxConnections
	pending  pendingSet   // connections still in their handshake
	failures authFailures

	persistWake chan struct{}
	leaseHint   atomic.Int64 // largest lease (ns) asked for recently; see persist.go

	ln         net.Listener
	listenAddr atomic.Pointer[string]
	lnMu       sync.Mutex    // guards ln, and Serve's connWG.Add against Shutdown's Wait
	done       chan struct{} // closed by Shutdown
	wg         sync.WaitGroup
	connWG     sync.WaitGroup
	shutOnce   sync.Once
	shutErr    error
}

// authKeys is the set of accepted tokens (the first is current; a second is accepted during a
// rotation).
type authKeys struct{ tokens [][]byte }

// New prepares a server: it validates cfg, opens the data directory, reserves the first block
// of tokens and the start-up horizon durably, and computes the start-up wait.
func New(cfg Config, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	st, state, err := store.Open(cfg.DataDir, store.Options{MinToken: cfg.MinToken})
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w", cfg.DataDir, err)
	}
	s := &Server{
		cfg:         cfg,
		log:         log,
		store:       st,
		conns:       make(map[uint64]*conn),
		persistWake: make(chan struct{}, 1),
		done:        make(chan struct{}),
		clk:         clock.NewSince(),
	}
	s.boot0 = s.clk.Boot0()
	s.sm = &local{s}
	s.pending.init(cfg.MaxHandshakes)
	s.initAdmin()
	s.failures.init()
	s.SetTokens(cfg.Tokens)
	if cfg.TLS != nil && len(cfg.TLS.Certificates) > 0 {
		s.tlsCert.Store(&cfg.TLS.Certificates[0])
	}
	if _, err := rand.Read(s.stateID[:]); err != nil {
		st.Close()
		return nil, fmt.Errorf("state id: %w", err)
	}

	s.timer = time.NewTimer(time.Hour)
	s.timer.Stop()
	if err := s.checkDataDir(state); err != nil {
		st.Close()
		return nil, err
	}
	if cfg.Cluster != nil {
		// The log is the cluster's durability: tokens are a replicated counter (seeded above
		// this directory's high-water mark when this node first leads), there is no restart
		// horizon (a cluster keeps its state across node restarts), and time comes from the log.
		s.table = locktable.New(s.tableConfig())
		if err := s.startCluster(); err != nil {
			if s.cluster != nil {
				s.cluster.close()
			}
			st.Close()
			return nil, err
		}
		return s, nil
	}

	// Start-up wait: nothing an earlier run could have granted may be granted twice.
	var wait time.Duration
	if cfg.StartupAuto {
		wait = store.StartupWait(state, store.BootID(), s.boot0, clock.Wall())
	}
	wait = max(wait, cfg.StartupGrace)
	if state.Cluster {
		// A former cluster node's directory, started with a token floor (checkDataDir): the
		// cluster's leases are not recorded here, so none may run past the maximum lease.
		wait = max(wait, cfg.MaxLease)
	}
	lastToken := state.TokenLimit
	// Durable before the first grant: the next token block, and a horizon covering the wait
	// (a crash during the wait must not shorten the next start's wait).
	if state, err = st.Persist(lastToken+cfg.TokenBlock, s.boot0+int64(wait), false); err != nil {
		st.Close()
		return nil, fmt.Errorf("data directory %s: %w", cfg.DataDir, err)
	}
	tc := s.tableConfig()
	tc.AvailableFrom = int64(wait)
	s.startWait = int64(wait)
	tc.LastToken = lastToken
	tc.Durable = true
	s.table = locktable.New(tc)
	s.table.Ceiling(0, state.TokenLimit, state.HorizonBoot-s.boot0)
	s.table.ClearOuts()
	if state.Cluster {
		// The horizon covering the wait is durable: from now on the directory is a single
		// node's (a crash before this line leaves it marked, and the next start refused).
		if err := st.MarkCluster(false); err != nil {
			st.Close()
			return nil, fmt.Errorf("data directory %s: %w", cfg.DataDir, err)
		}
		log.Warn("data directory of a former cluster node: tokens continue above the floor; no grants until the cluster's leases have ended",
			"min_token", cfg.MinToken, "wait", wait)
	}
	if wait > 0 {
		log.Warn("start-up wait: no grants until every lease from before this start has ended",
			"wait", wait.Round(time.Millisecond), "why", "the data directory records leases that may still run (TICKETING_STARTUP_GRACE=0 turns this off)")
	}
	return s, nil
}

// checkDataDir refuses a single-node start on a directory that holds, or held, a cluster
// node's state: the cluster's tokens and leases are in its replicated log, not in the state
// file, so a single node started there would issue tokens the cluster already issued and grant
// keys the cluster's holders may still hold (a cluster start checks its side in startCluster).
func (s *Server) checkDataDir(state store.State) error {
	if s.cfg.Cluster != nil {
		return nil
	}
	raftDir := filepath.Join(s.cfg.DataDir, "raft")
	if hasFiles(raftDir) {
		return fmt.Errorf("data directory %s holds a cluster node's Raft state (%s): started without TICKETING_NODE_ID it would be a single node that issues tokens the cluster already issued and grants keys the cluster's holders may still hold; "+
			"start it as that cluster node (TICKETING_NODE_ID, TICKETING_PEERS, TICKETING_RAFT_ADDR as before), or, to leave the cluster for good, remove it from the cluster, move %s away and start the single node with TICKETING_MIN_TOKEN above the cluster's last token (docs/cluster.md, \"A cluster node's directory as a single node\")",
			s.cfg.DataDir, raftDir, raftDir)
	}
	if state.Cluster && s.cfg.MinToken == 0 {
		return fmt.Errorf("data directory %s served a cluster node (its Raft state is gone): a single node started from it would issue tokens the cluster already issued; "+
			"start it with TICKETING_MIN_TOKEN above the cluster's last token (at least %d, the last this node recorded): it then waits the maximum lease (TICKETING_MAX_LEASE, %v) before its first grant (docs/cluster.md, \"A cluster node's directory as a single node\")",
			s.cfg.DataDir, state.TokenLimit, s.cfg.MaxLease)
	}
	return nil
}

// hasFiles reports whether dir holds a file, at any depth (a missing dir holds none).
func hasFiles(dir string) bool {
	found := false
	filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			found = true
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

// tableConfig is the lock table's configuration from the server's.
func (s *Server) tableConfig() locktable.Config {
	return locktable.Config{
		MaxWaitersPerKey: s.cfg.MaxWaitersPerKey,
		MaxWaitersTotal:  s.cfg.MaxWaiters,
		MaxLocks:         s.cfg.MaxLocks,
		LockDelay:        int64(s.cfg.LockDelay),
		MaxSessions:      s.cfg.MaxSessions,
		MaxOutcomes:      s.cfg.MaxOutcomes,
		MaxQueued:        s.cfg.MaxInflight,
	}
}

// SetObserver installs the lock table's observer (metrics); call before Serve.
func (s *Server) SetObserver(o locktable.Observer) {
	s.mu.Lock()
	s.obs = o
	s.table.SetObserver(o)
	s.mu.Unlock()
}

// now is the table's clock: on a single node, nanoseconds of CLOCK_BOOTTIME since the server
// started; in a cluster, the leader's log time.
func (s *Server) now() int64 { return s.sm.now() }

// wakeClock makes the clock goroutine look at the table's deadlines now.
func (s *Server) wakeClock() {
	s.mu.Lock()
	s.armed = true
	s.timerAt = 0
	s.timer.Reset(0)
	s.mu.Unlock()
}

// StateID returns the state id clients see: new at every start of a single node; the
// replicated one in a cluster (zero until the first leader set it).
func (s *Server) StateID() [wire.StateIDSize]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sm.stateID()
}

// SetTokens replaces the accepted auth tokens (SIGHUP reload). Connections already past their
// handshake are not affected.
func (s *Server) SetTokens(tokens []string) {
	k := &authKeys{}
	for _, t := range tokens {
		k.tokens = append(k.tokens, []byte(t))
	}
	s.auth.Store(k)
}

// SetCertificate replaces the TLS certificate served to new connections (SIGHUP reload).
func (s *Server) SetCertificate(c *tls.Certificate) { s.tlsCert.Store(c) }

// tlsConfig is the TLS configuration with the current certificate.
func (s *Server) tlsConfig() *tls.Config {
	cfg := s.cfg.TLS.Clone()
	cfg.Certificates = nil
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.tlsCert.Load(), nil }
	return cfg
}

// Listen opens the configured address.
func (s *Server) Listen() (net.Listener, error) {
	return net.Listen("tcp", s.cfg.Addr)
}

// Serve accepts connections on ln until Shutdown. It returns nil after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.lnMu.Lock()
	select {
	case <-s.done:
		s.lnMu.Unlock()
		ln.Close()
		return nil
	default:
	}
	s.ln = ln
	addr := ln.Addr().String()
	s.listenAddr.Store(&addr)
	s.wg.Add(1)
	go s.clock()
	s.sm.start()
	s.lnMu.Unlock()
	var tlsCfg *tls.Config
	if s.cfg.TLS != nil {
		tlsCfg = s.tlsConfig()
	}
	s.mu.Lock()
	next := s.table.LastToken() + 1
	s.mu.Unlock()
	attrs := []any{"addr", ln.Addr().String(), "version", version.Get().String(), "tls", s.cfg.TLS != nil,
		"auth", len(s.auth.Load().tokens) > 0, "data_dir", s.cfg.DataDir, "next_token", next,
		"session_grace", s.cfg.SessionGrace, "cluster", s.cluster != nil}
	if cc := s.cfg.Cluster; cc != nil {
		peers := make([]string, 0, len(cc.Peers))
		for id, a := range cc.Peers {
			peers = append(peers, id+"="+a)
		}
		slices.Sort(peers)
		raftAddr := cc.RaftAddr
		if raftAddr == "" {
			raftAddr = cc.Peers[cc.NodeID]
		}
		attrs = append(attrs, "node", cc.NodeID, "raft_addr", raftAddr, "peers", strings.Join(peers, ","))
	}
	s.log.Info("listening", attrs...)
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return nil
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Anything else (EMFILE and the like) is temporary: back off instead of spinning.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
				continue
			case <-s.done:
				return nil
			}
		}
		backoff = 0
		s.lnMu.Lock() // Shutdown's connWG.Wait never runs concurrently with this Add
		select {
		case <-s.done:
			s.lnMu.Unlock()
			nc.Close()
			return nil
		default:
		}
		s.connWG.Add(1)
		s.lnMu.Unlock()
		go s.serveConn(nc, tlsCfg)
	}
}

// serveConn runs one connection: handshake (and session attach), then the read loop, then the
// session's detach.
func (s *Server) serveConn(nc net.Conn, tlsCfg *tls.Config) {
	defer s.connWG.Done()
	tcp, _ := nc.(*net.TCPConn)
	if tcp != nil {
		tcp.SetNoDelay(true)
		setDeadPeer(tcp, s.cfg.DeadPeerTimeout)
	}
	p := s.pending.add(nc)
	if tlsCfg != nil {
		nc = tls.Server(nc, tlsCfg)
	}
	c, ok := s.handshake(nc, tcp)
	s.pending.remove(p)
	if !ok {
		nc.Close()
		return
	}
	c.readLoop()
	s.closeConn(c)
}

// closeConn detaches a connection whose reader has stopped and releases it.
func (s *Server) closeConn(c *conn) {
	s.mu.Lock()
	s.detach(c)
	scratch := s.routeUnlock(nil, nil)
	c.close(time.Now().Add(s.cfg.WriteTimeout))
	// The last writes may have failed too.
	if c.hasLost() {
		s.mu.Lock()
		s.reportLost(c)
		s.routeUnlock(nil, scratch)
	}
}

// clock is the one goroutine that drives lease expiries, wait timeouts, lock-delay ends and
// session grace ends (machine.tick).
func (s *Server) clock() {
	defer s.wg.Done()
	var scratch []*conn
	for {
		select {
		case <-s.done:
			return
		case <-s.timer.C:
		}
		scratch = s.sm.tick(scratch)
	}
}

// rearm makes the timer fire at the table's next deadline if that is earlier than the timer's.
// s.mu must be held.
func (s *Server) rearm() {
	if !s.sm.expires() {
		return // cluster followers never expire anything on their own
	}
	if s.armed && s.table.DeadlineFloor() >= s.timerAt {
		return // nothing pending is due before the wake-up already armed (no search needed)
	}
	next, ok := s.table.NextDeadline()
	if !ok || (s.armed && next >= s.timerAt) {
		return
	}
	s.armed = true
	s.timerAt = next
	s.timer.Reset(time.Duration(next - s.now()))
}

// Shutdown stops the server gracefully: no new connections; every queued acquire is answered
// SHUTTING_DOWN and every holder told EXPIRED with reason STOPPING; RELEASE, CANCEL, PING,
// INSPECT and ACK are served until the connections close (bounded by ctx); then the end of
// every lease still held is recorded as the restart horizon, so that a restart without live
// leases starts at once. Everything, final writes included, is bounded by ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutOnce.Do(func() { s.shutErr = s.shutdown(ctx) })
	return s.shutErr
}

func (s *Server) shutdown(ctx context.Context) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(s.cfg.ShutdownTimeout)
	}
	s.lnMu.Lock()
	close(s.done)
	if s.ln != nil {
		s.ln.Close()
	}
	s.lnMu.Unlock()
	s.pending.closeAll()

	return s.sm.shutdown(ctx, deadline)
}

// Stats reports the table's size: keys present, locks held, acquires queued, and connections.
func (s *Server) Stats() (keys, held, waiters, conns int) {
	s.mu.Lock()
	keys, held, waiters = s.table.Stats()
	conns = len(s.conns)
	s.mu.Unlock()
	return
}

// Store returns the durable store (for tests that simulate a failing disk).
func (s *Server) Store() *store.Store { return s.store }
