package server

import (
	"context"
	"errors"
	"time"

	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/wire"
)

// machine is the one seam between the request path (handshake.go, conn.go, the clock) and the
// state machine: every change the request path makes to the lock table goes through it, and
// nothing else in the request path knows whether the node is single or one of a cluster. Two
// implementations:
//
//   - local (this file): a single node. A change is made to the table at once, under
//     Server.mu, and its outputs are routed (route.go, Server.route) before the lock is released.
//     Durability is persist.go's (the token ceiling and the restart horizon).
//   - cluster (replicated.go): a Raft cluster. A change is encoded as a command of the next log
//     entry (proposer.go); the table sees it when the entry commits (fsm.ApplyBatch, on every
//     replica), and its outputs are routed through the same route step.
//
// Why a single node does not encode its batches and go through Table.Apply as a replica does:
// both are 0 allocs/op, but the round trip costs. Measured (go test -run '^$' -bench Seam
// ./internal/locktable; batches of 32 ACQUIREs then their 32 RELEASEs, 2 loaded cores): the
// direct call 3.6-4.3 us per 64 requests, encoded and applied 5.3-6.2 us, of which encoding
// 1.3-1.4 us (a reader could do that before the lock) and decoding about 0.7 us under
// Server.mu: +32 ns per request in all, +55% of the table's own time. Both ways end in the same
// table code (Table.Apply decodes a REQUESTS command and calls Table.Requests) and the
// same route step.
//
// "Server.mu held" below: the caller holds it, and routes (routeUnlock) before it releases it.
type machine interface {
	// batch is the apply step for connection c's batch of valid requests; fatal: the stream
	// after the batch cannot be trusted, and c is detached in the same step. Server.mu not held:
	// a replicated machine may first wait for room (backpressure on this reader).
	batch(c *conn, reqs []wire.Request, fatal bool)
	// attach starts attaching session c.sid on connection c; the route step writes WELCOME
	// (Server.welcome) when the attach result comes out: within this call on a single node,
	// when the entry commits in a cluster. Server.mu held.
	attach(c *conn)
	// detach: connection c is gone; its session lives on for its grace. Server.mu held.
	detach(c *conn)
	// undelivered: the grant answering request reqID on connection conn (session sid, table
	// owner owner) never left this server (PROTOCOL.md: it is revocable). Server.mu held.
	undelivered(sid *[wire.SessionIDSize]byte, owner locktable.Owner, conn, reqID uint64)
	// tick runs what the table's deadlines make due now; the clock goroutine calls it when the
	// timer fires. Server.mu not held. scratch is the caller's delivery slice, returned for reuse.
	tick(scratch []*conn) []*conn
	// now is the table's clock (a single node: CLOCK_BOOTTIME since start; a cluster: the
	// leader's log time).
	now() int64
	// serving reports whether this node takes clients now (a cluster node: while it leads and
	// has committed its first entry); leaderHint is where to go instead ("" unknown).
	serving() bool
	leaderHint() string
	// expires reports whether this node arms the timer for the table's deadlines (a cluster
	// follower never does: its deadlines pass through the leader's log). Server.mu held.
	expires() bool
	// routed runs at the end of every route step. Server.mu held.
	routed()
	// stateID is the state id clients see. Server.mu held.
	stateID() [wire.StateIDSize]byte
	// start starts the machine's goroutines (Serve); shutdown is the end of a graceful stop,
	// after the listener and pending handshakes are closed (Shutdown).
	start()
	shutdown(ctx context.Context, deadline time.Time) error
}

// local is the single node's machine.
type local struct{ s *Server }

var _ machine = (*local)(nil)

func (l *local) batch(c *conn, reqs []wire.Request, fatal bool) {
	s := l.s
	s.mu.Lock()
	if len(reqs) > 0 {
		s.table.Requests(s.clk.Now(), c.owner, c.id, reqs)
	}
	if fatal {
		s.detachLater(c)
	}
	c.flushScratch = s.routeUnlock(c, c.flushScratch)
}

func (l *local) attach(c *conn) {
	s := l.s
	s.table.Attach(s.clk.Now(), c.sid, c.id, int64(s.cfg.SessionGrace))
}

func (l *local) detach(c *conn) { l.s.table.Detach(l.s.clk.Now(), c.owner, c.id) }

func (l *local) undelivered(_ *[wire.SessionIDSize]byte, owner locktable.Owner, conn, reqID uint64) {
	l.s.table.Undelivered(l.s.clk.Now(), owner, conn, reqID)
}

func (l *local) tick(scratch []*conn) []*conn {
	s := l.s
	s.mu.Lock()
	s.armed = false
	s.table.Tick(s.clk.Now())
	return s.routeUnlock(nil, scratch)
}

func (l *local) now() int64                      { return l.s.clk.Now() }
func (l *local) serving() bool                   { return true }
func (l *local) leaderHint() string              { return "" }
func (l *local) expires() bool                   { return true }
func (l *local) routed()                         { l.s.checkStorage() }
func (l *local) stateID() [wire.StateIDSize]byte { return l.s.stateID }

func (l *local) start() {
	l.s.wg.Add(1)
	go l.s.persister()
}

// shutdown: every queued acquire is answered SHUTTING_DOWN and every holder told EXPIRED with
// reason STOPPING; RELEASE, CANCEL, PING, INSPECT and ACK are served until the connections close
// (bounded by ctx); then the end of every lease still held is recorded as the restart horizon,
// so that a restart without live leases starts at once.
func (l *local) shutdown(ctx context.Context, deadline time.Time) error {
	s := l.s
	s.mu.Lock()
	s.stopping = true
	s.table.Stop(s.now())
	s.route(nil)
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.takeToFlush(nil) // every connection is flushed below
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
