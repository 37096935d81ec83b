// Package server owns the sockets of a single Ticketing node: it accepts connections, runs the
// handshake (and attaches the client's session), and serves each connection's requests in four
// steps:
//
//   - validate (conn.go, conn.validate): the connection-local checks of every complete frame in
//     a read; invalid requests and PING are answered on the spot;
//   - batch (conn.go, conn.serve): the valid requests of one read, in order;
//   - apply (route.go, Server.apply): the batch applied to the lock table
//     (locktable.Table.Requests) under Server.mu on a single node; in a cluster the batch is
//     encoded as a log entry instead (route.go, Server.propose; cluster.go) and every replica's
//     FSM makes the same table call when the entry commits;
//   - route (route.go, Server.settle): the table's outputs go to their connections — the
//     batch's own answers to the reader's buffer, hand-offs, EXPIRED and answers for other
//     sessions to theirs — and every batch is written with one write.
//
// The durable token ceiling and restart horizon (persist.go) and the clock that drives deadlines
// (clock goroutine, below) feed the table through the same apply step.
//
// Locks: Server.mu before conn.mu. Server.mu guards the lock table, the connection registry, the
// timer and each connection's pending handshake; conn.mu guards a connection's output buffer and
// its grant marks. conn.wmu (one writer per connection) is taken before conn.mu and is the one
// mutex held across a socket write; neither Server.mu nor conn.mu is held during socket or disk
// I/O (durable writes run in persist.go's goroutine; Raft's in hashicorp/raft's).
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ticketing/ticketing/internal/adminhttp"
	"github.com/ticketing/ticketing/internal/clock"
	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/internal/store"
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

	mu       sync.Mutex // guards everything below it
	table    *locktable.Table
	conns    map[uint64]*conn // attached connections by id
	nextConn uint64
	timer    *time.Timer
	timerAt  int64 // when timer fires; valid while armed
	armed    bool
	stopping bool
	touched  []*conn // connections route gave output to; see takeTouched
	doomed   []*conn // connections to detach before Server.mu is released; see doom

	reqs      []wire.Request // decode scratch of the cluster's apply
	adminMux  *adminhttp.Mux
	obs       locktable.Observer // metrics (nil: none); kept across table restores
	metrics   *metrics           // metrics.go: Prometheus series, the contention sketch; set by initAdmin
	startWait int64              // single node: the table time before which nothing is granted
	cluster   *cluster           // nil on a single node

	attached atomic.Int64 // connection slots taken: len(conns) plus handshakes holding one (takeSlot); at most MaxConnections
	pending  pendingSet   // connections still in their handshake
	failures authFailures

	persistKick chan struct{}
	leaseHint   atomic.Int64 // largest lease (ns) asked for recently; see persist.go

	ln         net.Listener
	listenAddr atomic.Pointer[string]
	lnMu       sync.Mutex
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
		persistKick: make(chan struct{}, 1),
		done:        make(chan struct{}),
		clk:         clock.NewSince(),
	}
	s.boot0 = s.clk.Boot0()
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
func (s *Server) now() int64 {
	if s.cluster != nil {
		return s.cluster.stamp()
	}
	return s.clk.Now()
}

// kickClock makes the clock goroutine look at the table's deadlines now.
func (s *Server) kickClock() {
	s.mu.Lock()
	s.armed = true
	s.timerAt = 0
	s.timer.Reset(0)
	s.mu.Unlock()
}

// StateID returns the state id clients see: new at every start of a single node; the
// replicated one in a cluster (zero until the first leader set it).
func (s *Server) StateID() [wire.StateIDSize]byte {
	if s.cluster != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.table.StateID()
	}
	return s.stateID
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
	if s.cluster != nil {
		s.cluster.run()
	} else {
		s.wg.Add(1)
		go s.persister()
	}
	s.lnMu.Unlock()
	var tlsCfg *tls.Config
	if s.cfg.TLS != nil {
		tlsCfg = s.tlsConfig()
	}
	s.mu.Lock()
	next := s.table.LastToken() + 1
	s.mu.Unlock()
	s.log.Info("listening", "addr", ln.Addr().String(), "tls", s.cfg.TLS != nil, "auth", len(s.auth.Load().tokens) > 0,
		"data_dir", s.cfg.DataDir, "next_token", next, "session_grace", s.cfg.SessionGrace, "cluster", s.cluster != nil)
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
	s.settle(nil)
	touched := s.takeTouched(nil)
	s.mu.Unlock()
	deliver(touched)
	c.close(time.Now().Add(s.cfg.WriteTimeout))
	// The last writes may have failed too.
	if c.hasLost() {
		s.mu.Lock()
		s.reportLost(c)
		s.settle(nil)
		touched = s.takeTouched(touched)
		s.mu.Unlock()
		deliver(touched)
	}
}

// clock is the one goroutine that drives lease expiries, wait timeouts, lock-delay ends and
// session grace ends.
func (s *Server) clock() {
	defer s.wg.Done()
	var touched []*conn
	for {
		select {
		case <-s.done:
			return
		case <-s.timer.C:
		}
		if c := s.cluster; c != nil {
			s.mu.Lock()
			s.armed = false
			_, pending := s.table.NextDeadline()
			s.mu.Unlock()
			if c.ready() {
				c.prop.begin()
				c.prop.enc.Tick()
				c.prop.end()
				if pending {
					// Expiries happen only through committed entries: while deadlines are
					// pending, tick at least every tickEvery (the apply rearms earlier ones).
					s.mu.Lock()
					if !s.armed || s.timerAt > s.now()+int64(tickEvery) {
						s.armed = true
						s.timerAt = s.now() + int64(tickEvery)
						s.timer.Reset(tickEvery)
					}
					s.mu.Unlock()
				}
			}
			continue
		}
		s.mu.Lock()
		s.armed = false
		s.table.Tick(s.now())
		s.settle(nil)
		touched = s.takeTouched(touched)
		s.mu.Unlock()
		touched = deliver(touched)
	}
}

// rearm makes the timer fire at the table's next deadline if that is earlier than the timer's.
// s.mu must be held.
func (s *Server) rearm() {
	if s.cluster != nil && !s.cluster.leader.Load() {
		return // followers never expire anything on their own
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

	if c := s.cluster; c != nil {
		return s.shutdownCluster(ctx, deadline)
	}
	s.mu.Lock()
	s.stopping = true
	s.table.Stop(s.now())
	s.settle(nil)
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.takeTouched(nil) // every connection is flushed below
	s.mu.Unlock()
	for _, c := range conns {
		c.tryFlush()
	}
	// Give clients a moment to read the notices and release; then stop reading. The readers
	// exit, detach their sessions and flush what is left, each bounded by the deadline.
	drain := min(time.Until(deadline)/2, 500*time.Millisecond)
	for _, c := range conns {
		c.stopReading(time.Now().Add(max(drain, 0)), deadline)
	}

	var err error
	waited := make(chan struct{})
	go func() { s.connWG.Wait(); s.wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		err = ctx.Err()
		for _, c := range conns {
			c.kill()
		}
	}
	s.timer.Stop()

	// Record what really remains: the end of every lease still held (none: no wait at the
	// next start).
	s.mu.Lock()
	horizon := s.table.MaxDeadline()
	lastToken := s.table.LastToken()
	s.mu.Unlock()
	if horizon == 0 {
		horizon = s.now()
	}
	// The final write is bounded by ctx too: a hung disk must not hold the stop. Abandoning it
	// is safe: the horizon recorded before (reserved ahead of every lease) still holds.
	final := make(chan error, 1)
	go func() {
		_, perr := s.store.Persist(lastToken, s.boot0+horizon, true)
		if perr != nil {
			s.log.Error("could not record the restart horizon; the next start waits for the one recorded before", "err", perr)
		}
		final <- s.store.Close() // a failed final record is logged, not an error of the stop
	}()
	select {
	case ferr := <-final:
		if err == nil {
			err = ferr
		}
	case <-time.After(max(time.Until(deadline), 0)):
		s.log.Error("storage did not finish the final write before the stop deadline; stopping without it (the next start waits for the horizon recorded before)")
		if err == nil {
			err = errors.New("shutdown: storage did not answer before the deadline")
		}
	}
	return err
}

// shutdownCluster stops a cluster node: its clients get GOAWAY (reason STOPPING, with the
// leader's address when another node leads) and resume elsewhere; the node keeps the state id
// and records no restart horizon (those are single-node rules); then Raft stops.
func (s *Server) shutdownCluster(ctx context.Context, deadline time.Time) error {
	c := s.cluster
	s.mu.Lock()
	s.stopping = true // new handshakes are refused; GOAWAY says STOPPING
	s.mu.Unlock()
	// A stopping leader hands leadership over first, so its clients' GOAWAY names the new
	// leader and the cluster does not wait for an election timeout.
	if c.raft.State() == raft.Leader {
		f := c.raft.LeadershipTransfer()
		done := make(chan error, 1)
		go func() { done <- f.Error() }()
		select {
		case err := <-done:
			if err != nil {
				s.log.Warn("cluster: leadership transfer failed; stopping anyway", "err", err)
			}
		case <-time.After(time.Until(deadline) / 2):
			s.log.Warn("cluster: leadership transfer did not finish in time; stopping anyway")
		}
		// Wait (briefly) until the new leader is known, for the hint.
		hintBy := time.Now().Add(time.Second)
		if deadline.Before(hintBy) {
			hintBy = deadline
		}
		for time.Now().Before(hintBy) {
			time.Sleep(10 * time.Millisecond)
			if _, id := c.raft.LeaderWithID(); id != "" && string(id) != c.cfg.NodeID && c.leaderHint() != "" {
				break // and its client address applied here too (its first entry), for the hint
			}
		}
	}
	c.loseLeadership(wire.GoawayStopping)
	var err error
	waited := make(chan struct{})
	go func() { s.connWG.Wait(); s.wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		err = ctx.Err() // the readers end by themselves: loseLeadership bounded their reads and writes
	}
	s.timer.Stop()
	// Raft's shutdown waits for its log store: bounded like the rest, with a floor of a second
	// for an ordinary shutdown after a ctx that ran out. A node whose disk hangs stops without
	// it (its log is crash-safe; the disk watchdog in stall.go exits it anyway).
	closed := make(chan error, 1)
	go func() {
		c.close()
		closed <- s.store.Close()
	}()
	select {
	case cerr := <-closed:
		if err == nil {
			err = cerr
		}
	case <-time.After(max(time.Until(deadline), time.Second)):
		s.log.Error("cluster: raft did not shut down before the stop deadline; stopping without it")
		if err == nil {
			err = errors.New("shutdown: raft did not stop before the deadline")
		}
	}
	return err
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
