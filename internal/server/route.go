package server

import (
	"os"
	"syscall"

	"github.com/ticketing/ticketing/wire"
)

// failCrashBeforeGrantReply is a failpoint for crash tests: with TICKETING_FAILPOINT_FILE set,
// the first node that is about to write a grant's answer (committed and applied) while that file
// exists removes it and kills itself with SIGKILL — one crash per file, across a cluster.
var failpointFile = os.Getenv("TICKETING_FAILPOINT_FILE")

var failCrashBeforeGrantReply = failpointFile != ""

func crashNow() {
	if os.Remove(failpointFile) == nil {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}

// undelivered is a grant whose answer was dropped unwritten (its connection was doomed).
type undelivered struct {
	c     *conn
	reqID uint64
}

// apply is the apply step for one batch of connection c: the valid requests go to the lock
// table under Server.mu, and the outputs are routed before it is released. A fatal batch (a
// frame that cannot be trusted) dooms c in the same critical section: nothing decided after it
// is handed to c.
func (s *Server) apply(c *conn, reqs []wire.Request, fatal bool) {
	if s.cluster != nil {
		s.propose(c, reqs, fatal)
		return
	}
	s.mu.Lock()
	if len(reqs) > 0 {
		s.table.Requests(s.now(), c.owner, c.id, reqs)
	}
	if fatal {
		s.doom(c)
	}
	s.settle(c)
	c.touched = s.takeTouched(c.touched)
	s.mu.Unlock()
	c.touched = deliver(c.touched)
}

// settle routes the table's outputs, detaches doomed connections (which may produce more
// outputs: hand-offs of revoked grants), rearms the timer and checks whether storage must
// reserve more. cur is the connection whose batch is running (its answers go to its own
// buffer and are committed here), or nil. Server.mu must be held.
func (s *Server) settle(cur *conn) {
	var lost []undelivered
	for {
		outs := s.table.Outs()
		for k := range outs {
			o := &outs[k]
			if o.Attached {
				if d := s.conns[o.Conn]; d != nil {
					s.welcome(d, o)
				}
				continue
			}
			if o.Conn == 0 {
				continue
			}
			grant := o.Resp.Op == wire.OpAcquire && o.Resp.Status == wire.StatusOK
			var d *conn
			if cur != nil && o.Conn == cur.id {
				d = cur
			} else if d = s.conns[o.Conn]; d == nil {
				if grant && s.cluster != nil && s.cluster.ownsConn(o.Conn) {
					// In a cluster a connection is forgotten when its DETACH is proposed, before
					// it is applied: a grant for it is undelivered like any other.
					if sid, ok := s.table.SessionOnConn(o.Conn); ok {
						s.proposeUndelivered(&sid, o.Conn, o.Resp.ID)
					}
				}
				continue
			}
			s.metrics.answered(&o.Resp)
			if grant && failCrashBeforeGrantReply {
				crashNow() // tests: the grant is committed (and applied here), its answer never written
			}
			if d == cur {
				cur.resp = wire.AppendResponse(cur.resp, &o.Resp)
				if grant {
					cur.grants = append(cur.grants, grantMark{len(cur.resp), o.Resp.ID})
				}
				continue
			}
			if !d.push(&o.Resp, grant) && grant {
				lost = append(lost, undelivered{d, o.Resp.ID})
			}
			if !d.marked {
				d.marked = true
				s.touched = append(s.touched, d)
			}
		}
		s.table.ClearOuts()
		if cur != nil {
			if !cur.commit() {
				for _, g := range cur.grants {
					lost = append(lost, undelivered{cur, g.id})
				}
			}
			cur.grants = cur.grants[:0]
		}
		if len(lost) == 0 && len(s.doomed) == 0 {
			break
		}
		now := s.now()
		for _, u := range lost {
			s.undelivered(now, u.c, u.reqID)
		}
		lost = lost[:0]
		for _, d := range s.doomed {
			d.doomedAt = false
			s.detach(d)
		}
		clear(s.doomed)
		s.doomed = s.doomed[:0]
	}
	s.rearm()
	if s.cluster == nil {
		s.checkStorage()
	}
}

// doom marks c for detaching before Server.mu is released (see settle). Server.mu must be held.
func (s *Server) doom(c *conn) {
	if !c.doomedAt && !c.detached {
		c.doomedAt = true
		s.doomed = append(s.doomed, c)
	}
}

// undelivered tells the table that c's grant for request reqID was dropped unwritten (in a
// cluster: proposes it). Server.mu must be held; call settle afterwards.
func (s *Server) undelivered(now int64, c *conn, reqID uint64) {
	if s.cluster != nil {
		s.proposeUndelivered(&c.sid, c.id, reqID)
		return
	}
	s.table.Undelivered(now, c.owner, c.id, reqID)
}

func (s *Server) proposeUndelivered(sid *[wire.SessionIDSize]byte, conn, reqID uint64) {
	p := &s.cluster.prop
	p.begin()
	p.enc.Undelivered(sid, conn, reqID)
	p.end()
}

// ownsConn reports whether connection id was made by this node (see nextConnID).
func (c *cluster) ownsConn(id uint64) bool { return id&^0xffffffff == c.connBase }

// reportLost hands the table the grants c's output buffers dropped unwritten (a failed or
// timed-out write, an overflow, a kill; see conn.lost). Server.mu must be held; call settle
// afterwards.
func (s *Server) reportLost(c *conn) {
	c.mu.Lock()
	lost := c.lost
	c.lost = nil
	c.mu.Unlock()
	if len(lost) == 0 || c.id == 0 {
		return
	}
	now := s.now()
	for _, id := range lost {
		s.undelivered(now, c, id)
	}
}

// detach tells the table that c is gone (its session lives on for its grace) and forgets c;
// grants its buffers dropped unwritten are reported first. Server.mu must be held; call settle
// afterwards.
func (s *Server) detach(c *conn) {
	if c.detached || c.id == 0 {
		return
	}
	s.reportLost(c)
	c.detached = true
	if s.conns[c.id] == c {
		delete(s.conns, c.id)
		s.attached.Add(-1)
	}
	if s.cluster != nil {
		s.cluster.prop.begin()
		s.cluster.prop.enc.Detach(&c.sid, c.id)
		s.cluster.prop.end()
		return
	}
	s.table.Detach(s.now(), c.owner, c.id)
}

// propose is the apply step in a cluster: the batch becomes a REQUESTS command of the next
// proposal (its answers come when the entry is applied); the connection's local answers
// (invalid requests, PING) are committed at once. While the proposer holds
// Config.RaftMaxPending bytes not yet handed to Raft it waits first: this reader stops reading,
// and TCP flow control holds the client back.
func (s *Server) propose(c *conn, reqs []wire.Request, fatal bool) {
	if len(reqs) > 0 {
		p := &s.cluster.prop
		p.beginConn() // waits while the proposer is full: backpressure on this client
		p.enc.Requests(&c.sid, c.id)
		for k := range reqs {
			p.enc.Request(&reqs[k])
		}
		p.end()
	}
	s.mu.Lock()
	if !c.commit() {
		s.doom(c)
	}
	if fatal {
		s.doom(c)
	}
	if len(s.doomed) > 0 {
		s.settle(nil)
	}
	s.mu.Unlock()
}

// takeTouched moves the connections that settle gave output to (other than the current
// reader's) into dst, for delivery once Server.mu is released. Server.mu must be held.
func (s *Server) takeTouched(dst []*conn) []*conn {
	for _, d := range s.touched {
		d.marked = false
	}
	dst = append(dst, s.touched...)
	clear(s.touched)
	s.touched = s.touched[:0]
	return dst
}

// deliver writes what settle queued for each connection in ds, without blocking the caller
// (see conn.tryFlush), and clears ds. Server.mu must not be held.
func deliver(ds []*conn) []*conn {
	for _, d := range ds {
		d.tryFlush()
	}
	clear(ds)
	return ds[:0]
}
