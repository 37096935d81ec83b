package server

import (
	"bytes"
	"crypto/rand"
	"errors"
	"math"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ticketing/ticketing/internal/clock"
	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/internal/store"
	"github.com/ticketing/ticketing/wire"
)

// watchLeadership reacts to this node gaining or losing leadership.
func (c *cluster) watchLeadership() {
	defer c.s.wg.Done()
	obs := make(chan raft.Observation, 16)
	o := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	c.raft.RegisterObserver(o)
	defer c.raft.DeregisterObserver(o)
	check := time.NewTicker(100 * time.Millisecond)
	defer check.Stop()
	isLeader := false
	var lastLeader raft.ServerID
	wasMember := false
	for {
		select {
		case <-c.s.done:
			return
		case o := <-obs:
			// Every node says when the leader changes, with the term (the one line an operator
			// looks for after an incident); "" is an election in progress.
			if lo, ok := o.Data.(raft.LeaderObservation); ok && lo.LeaderID != lastLeader {
				lastLeader = lo.LeaderID
				if lo.LeaderID == "" {
					c.s.log.Info("cluster: no leader (election)", "term", c.raft.CurrentTerm())
				} else {
					c.s.log.Info("cluster: leader changed", "leader", string(lo.LeaderID), "leader_raft_addr", string(lo.LeaderAddr), "term", c.raft.CurrentTerm(), "self", string(lo.LeaderID) == c.cfg.NodeID)
				}
			}
		case <-check.C:
			// A node that was a member and is not any more says so once (it would otherwise go
			// on quietly, and answer /readyz until it lost the leader).
			_, in := c.member(c.cfg.NodeID)
			if wasMember && !in {
				c.s.log.Warn("cluster: this node was removed from the cluster's configuration; it serves nothing and takes no part: stop it, or add it back (ticketing cluster add)", "node", c.cfg.NodeID)
			}
			wasMember = in
		}
		now := c.raft.State() == raft.Leader && !c.halted.Load()
		switch {
		case now && !isLeader:
			isLeader = true
			if err := c.becomeLeader(); err != nil {
				c.s.log.Warn("cluster: leadership not established", "err", err)
				isLeader = false
			}
		case !now && isLeader:
			isLeader = false
			reason := wire.GoawayLeadership
			if c.s.isStopping() {
				reason = wire.GoawayStopping
			}
			c.loseLeadership(reason)
		}
	}
}

// becomeLeader: a Barrier (every earlier entry applied), then the time base, then the first
// entry: this node's client address, its table limits (CONFIG: every replica applies the
// leader's limits from here on, so they never differ between replicas), the state id if the
// cluster has none, the token floor of this node's data directory, and DETACH_ALL — no session
// has a connection to this node yet. Only after that entry commits does the node accept clients.
func (c *cluster) becomeLeader() error {
	s := c.s
	if c.halted.Load() {
		return errors.New("this node stopped applying the log")
	}
	if err := c.raft.Barrier(10 * time.Second).Error(); err != nil {
		return err
	}
	s.mu.Lock()
	base := s.table.Now()
	if base == c.appliedNow && !c.appliedAt.IsZero() {
		// The log's time goes on from the last stamp applied here, plus the time since this
		// node applied it: at least that much real time has passed since the old leader stamped
		// it (stamped before applied), so the log's time stays behind real time, as it must,
		// without losing the idle time before a leader change (a waiter's detail, and so its
		// holder's local deadline, counts it).
		base += int64(float64(time.Since(c.appliedAt)) * s.cfg.Faults.clockRate())
	}
	state := s.table.StateID()
	s.mu.Unlock()
	c.monoMu.Lock()
	c.stamp0.Store(base)
	c.mono0 = time.Now()
	c.monoMu.Unlock()
	var e locktable.Encoder
	now := c.stamp()
	e.Reset(now)
	e.Node(c.cfg.NodeID, c.advertise())
	e.Config(s.tableConfig().Limits())
	local := s.store.State()
	seed := max(local.TokenLimit, s.cfg.MinToken)
	switch {
	case c.recovered && !c.recoveryDone:
		// A forced recovery: the log this node kept may lack entries the lost majority
		// committed. New state id; tokens RecoveryTokenMargin above what this log saw (and
		// above the operator's floor: see RecoveryTokenMargin for the bound); no grant until
		// every lease the old state could hold has ended.
		s.mu.Lock()
		last := s.table.LastToken()
		s.mu.Unlock()
		jump := last + RecoveryTokenMargin
		if jump < last {
			jump = math.MaxUint64 // saturated: no token is left to issue
		}
		seed = max(seed, jump)
		s.log.Warn("cluster: forced recovery: tokens continue above the last one in this log plus the recovery margin",
			"last_token", last, "next_token_above", seed)
		rand.Read(state[:])
		e.Init(&state, true, now+int64(s.cfg.MaxLease))
	case state == ([wire.StateIDSize]byte{}):
		// A new cluster. Converted from a single node (its data directory has history),
		// restored (an operator's token floor) or started again from a directory that served a
		// cluster node: no grant until the old state's leases have ended (the single node's
		// recorded horizon; unknown: the maximum lease).
		var wait time.Duration
		switch {
		case local.HorizonBoot != 0:
			wait = store.StartupWait(local, store.BootID(), clock.Boottime(), clock.Wall())
		case local.TokenLimit > 0 || s.cfg.MinToken > 0:
			wait = s.cfg.MaxLease
		}
		rand.Read(state[:])
		e.Init(&state, false, now+int64(wait))
	}
	e.Seed(seed)
	e.DetachAll()
	if err := c.raft.Apply(bytes.Clone(e.Bytes()), 10*time.Second).Error(); err != nil {
		return err
	}
	c.recoveryDone = true
	c.leader.Store(true)
	s.log.Info("cluster: this node leads and serves clients", "node", c.cfg.NodeID, "term", c.raft.CurrentTerm(), "term_time", time.Duration(base))
	s.wakeClock()
	return nil
}

func (c *cluster) advertise() string {
	if c.cfg.Advertise != "" {
		return c.cfg.Advertise
	}
	if a := c.s.listenAddr.Load(); a != nil {
		return *a
	}
	return c.s.cfg.Addr
}

// loseLeadership: every client connection gets GOAWAY with the new leader's address (when
// known) and is closed; clients resume their sessions on the new leader.
func (c *cluster) loseLeadership(reason uint32) {
	s := c.s
	c.leader.Store(false)
	c.prop.wake() // readers waiting for room in the proposer: their commands are dropped now
	hint := c.leaderHint()
	if reason == wire.GoawayLeadership {
		// Deposed (a transfer, or a frozen leader that woke): the new leader is usually known
		// within a heartbeat or two. Waiting for it briefly gives clients the hint, so they go
		// straight there instead of trying every endpoint. Nothing is served meanwhile: the
		// node is not the leader.
		hint = c.awaitLeaderHint(time.Second)
	}
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, cn := range s.conns {
		if cn.hs != nil && !cn.hs.welcomed {
			if !cn.hs.ended {
				cn.hs.ended = true
				close(cn.hs.done) // its handshake answers WELCOME NOT_LEADER
			}
			continue
		}
		conns = append(conns, cn)
		cn.push(&wire.Response{Op: wire.OpGoaway, Detail: reason, Data: []byte(hint)}, false)
		cn.detached = true
		delete(s.conns, cn.id)
		s.attached.Add(-1)
	}
	s.mu.Unlock()
	for _, cn := range conns {
		cn.tryFlush()
		cn.stopReading(time.Now(), time.Now().Add(time.Second))
	}
	s.log.Info("cluster: not the leader any more", "leader", hint)
}

// awaitLeaderHint polls leaderHint for up to d (the node stopping ends it early).
func (c *cluster) awaitLeaderHint(d time.Duration) string {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	until := time.Now().Add(d)
	for {
		if h := c.leaderHint(); h != "" || !time.Now().Before(until) {
			return h
		}
		select {
		case <-t.C:
		case <-c.s.done:
			return ""
		}
	}
}

// leaderHint is the current leader's client address, or "" when unknown.
func (c *cluster) leaderHint() string {
	_, id := c.raft.LeaderWithID()
	if id == "" || string(id) == c.cfg.NodeID && !c.leader.Load() {
		return ""
	}
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.table.NodeAddr(string(id))
}

// leads reports whether this node serves clients (it is the leader and has committed its
// first entry).
func (c *cluster) leads() bool { return c.leader.Load() && c.raft.State() == raft.Leader }
