package server

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing/ticketing/internal/locktable"
)

// proposer accumulates commands from all connections into one entry while proposals are in
// flight, then proposes it (group commit).
//
// Bounds: an entry is closed once it holds maxEntry bytes (it may exceed that by the one batch
// that crossed it) and queued behind the open one; the propose goroutine submits them in order,
// at most maxInflight at once. What is queued (closed entries and the open one: accepted, not
// yet handed to Raft) is bounded by Config.RaftMaxPending through backpressure: a connection
// reader (beginConn) waits while that much is queued, so it stops reading and TCP flow control
// reaches the client. Commands the server makes itself (DETACH, UNDELIVERED, TICK, ATTACH;
// small, some proposed under Server.mu) never wait, so the bound can be exceeded by those and by
// one batch per reader. Memory for client requests on the leader is therefore about
// RaftMaxPending + maxInflight*maxEntry, plus what Raft itself keeps.
type proposer struct {
	mu     sync.Mutex
	enc    locktable.Encoder // the open entry
	n      int               // commands in enc; 0: enc holds nothing to propose
	closed [][]byte          // full entries waiting for a slot, oldest first
	cbytes int               // bytes in closed
	limit  int               // readers wait while queued() >= limit (Config.RaftMaxPending)
	room   sync.Cond         // on mu: queued() fell below limit, or waiting must end
	stop   bool              // the propose goroutine has exited: nobody waits any more
	leader *atomic.Bool      // the cluster's leader flag: a node that does not lead makes nobody wait
	notify chan struct{}
	slots  chan struct{} // in-flight proposals
}

// queued is the number of bytes accepted and not yet handed to Raft. p.mu must be held.
func (p *proposer) queued() int {
	if p.n == 0 {
		return p.cbytes
	}
	return p.cbytes + p.enc.Len()
}

func (p *proposer) begin() {
	p.mu.Lock()
	if p.n == 0 {
		p.enc.Reset(0) // stamped at submission
	}
	p.n++
}

// beginConn is begin for a connection reader's batch: it first waits while RaftMaxPending bytes
// or more are queued (see proposer). Server.mu must not be held.
func (p *proposer) beginConn() {
	p.mu.Lock()
	for p.queued() >= p.limit && !p.stop && p.leader.Load() {
		p.room.Wait()
	}
	if p.n == 0 {
		p.enc.Reset(0)
	}
	p.n++
}

func (p *proposer) end() {
	if p.enc.Len() >= maxEntry {
		// Close the entry: the next command begins a new one.
		e := bytes.Clone(p.enc.Bytes())
		p.closed = append(p.closed, e)
		p.cbytes += len(e)
		p.n = 0
	}
	p.mu.Unlock()
	p.signal()
}

// signal wakes the propose goroutine.
func (p *proposer) signal() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// wake ends the readers' wait when it must end regardless of room: leadership lost, or the
// proposer stopped.
func (p *proposer) wake() {
	p.mu.Lock()
	p.room.Broadcast()
	p.mu.Unlock()
}

// next takes the next entry to propose: the oldest closed one, else the open one (nil: none).
// p.mu must be held.
func (p *proposer) next() []byte {
	var e []byte
	switch {
	case len(p.closed) > 0:
		e = p.closed[0]
		p.closed[0] = nil
		p.closed = p.closed[1:]
		p.cbytes -= len(e)
		if len(p.closed) == 0 {
			p.closed = nil // let the queue's memory go
		}
	case p.n > 0:
		e = bytes.Clone(p.enc.Bytes())
		p.n = 0
	}
	if p.queued() < p.limit {
		p.room.Broadcast()
	}
	return e
}

// drop discards everything queued (commands of a node that no longer leads: their clients
// resume elsewhere). p.mu must be held.
func (p *proposer) drop() {
	clear(p.closed)
	p.closed, p.cbytes, p.n = nil, 0, 0
	p.room.Broadcast()
}

// proposeLoop submits the queued entries in order, each when a slot is free.
func (c *cluster) proposeLoop() {
	defer c.s.wg.Done()
	p := &c.prop
	defer func() { // readers waiting for room wait no more
		p.mu.Lock()
		p.stop = true
		p.room.Broadcast()
		p.mu.Unlock()
	}()
	for {
		select {
		case <-p.notify:
		case <-c.s.done:
			return
		}
		select {
		case p.slots <- struct{}{}:
		case <-c.s.done:
			return
		}
		p.mu.Lock()
		if !c.leader.Load() {
			p.drop() // commands of connections the node no longer serves: dropped (their clients resume elsewhere)
			p.mu.Unlock()
			<-p.slots
			continue
		}
		entry := p.next()
		more := len(p.closed) > 0 || p.n > 0
		p.mu.Unlock()
		if entry == nil {
			<-p.slots
			continue
		}
		if more {
			p.signal() // the next one goes as soon as a slot is free
		}
		locktable.SetTime(entry, c.stamp())
		f := c.raft.Apply(entry, 10*time.Second)
		go func() {
			if err := f.Error(); err != nil {
				c.s.log.Debug("cluster: proposal failed", "err", err)
			}
			<-p.slots
			select { // more may have accumulated meanwhile
			case p.notify <- struct{}{}:
			default:
			}
		}()
	}
}
