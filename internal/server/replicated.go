package server

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/wire"
)

// The cluster's side of the seam (machine.go): every change is a command of the next log
// entry (proposer.go); the table sees it when the entry commits (fsm.go), on every replica.

var _ machine = (*cluster)(nil)

// batch: the batch becomes a REQUESTS command of the next proposal (its answers come when the
// entry is applied); the connection's local answers (invalid requests, PING) are committed at
// once. While the proposer holds Config.RaftMaxPending bytes not yet handed to Raft it waits
// first: this reader stops reading, and TCP flow control holds the client back.
func (c *cluster) batch(cn *conn, reqs []wire.Request, fatal bool) {
	s := c.s
	if len(reqs) > 0 {
		p := &c.prop
		p.beginConn() // waits while the proposer is full: backpressure on this client
		p.enc.Requests(&cn.sid, cn.id)
		for k := range reqs {
			p.enc.Request(&reqs[k])
		}
		p.end()
	}
	s.mu.Lock()
	if !cn.commit() || fatal {
		s.detachLater(cn)
	}
	cn.flushScratch = s.routeUnlock(nil, cn.flushScratch)
}

// attach proposes ATTACH; the route step writes WELCOME when it is applied.
func (c *cluster) attach(cn *conn) {
	c.prop.begin()
	c.prop.enc.Attach(&cn.sid, cn.id, uint32(c.s.cfg.SessionGrace/time.Millisecond))
	c.prop.end()
}

func (c *cluster) detach(cn *conn) {
	c.prop.begin()
	c.prop.enc.Detach(&cn.sid, cn.id)
	c.prop.end()
}

func (c *cluster) undelivered(sid *[wire.SessionIDSize]byte, _ locktable.Owner, conn, reqID uint64) {
	c.prop.begin()
	c.prop.enc.Undelivered(sid, conn, reqID)
	c.prop.end()
}

// tick proposes TICK on the leader: expiries happen only through committed entries.
func (c *cluster) tick(scratch []*conn) []*conn {
	s := c.s
	s.mu.Lock()
	s.armed = false
	_, pending := s.table.NextDeadline()
	s.mu.Unlock()
	if !c.leads() {
		return scratch
	}
	c.prop.begin()
	c.prop.enc.Tick()
	c.prop.end()
	if pending {
		// While deadlines are pending, tick at least every tickEvery (the apply rearms
		// earlier ones).
		s.mu.Lock()
		if !s.armed || s.timerAt > s.now()+int64(tickEvery) {
			s.armed = true
			s.timerAt = s.now() + int64(tickEvery)
			s.timer.Reset(tickEvery)
		}
		s.mu.Unlock()
	}
	return scratch
}

func (c *cluster) now() int64                      { return c.stamp() }
func (c *cluster) serving() bool                   { return c.leads() }
func (c *cluster) expires() bool                   { return c.leader.Load() }
func (c *cluster) routed()                         {}
func (c *cluster) stateID() [wire.StateIDSize]byte { return c.s.table.StateID() }

// start runs the leadership watcher, the proposer and the disk watchdog until Shutdown.
func (c *cluster) start() {
	c.s.wg.Add(3)
	go c.watchLeadership()
	go c.proposeLoop()
	go c.watchDisk(c.logs)
}

// shutdown stops a cluster node: its clients get GOAWAY (reason STOPPING, with the
// leader's address when another node leads) and resume elsewhere; the node keeps the state id
// and records no restart horizon (those are single-node rules); then Raft stops.
func (c *cluster) shutdown(ctx context.Context, deadline time.Time) error {
	s := c.s
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
