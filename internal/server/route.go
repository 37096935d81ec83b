package server

import (
	"os"
	"syscall"

	"github.com/ticketing/ticketing/wire"
)

// crashBeforeGrantReply is the Faults.CrashBeforeGrantReply failpoint.
func (s *Server) crashBeforeGrantReply() {
	if os.Remove(s.cfg.Faults.CrashBeforeGrantReply) == nil {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}

// lostGrant is a grant whose answer was dropped unwritten (its connection failed).
type lostGrant struct {
	c     *conn
	reqID uint64
}

// routeUnlock ends every change to the table: its outputs are routed (route), Server.mu is
// released, and the connections that got output are written to (deliver). cur is the
// connection whose batch ran, or nil; scratch is the caller's reusable slice, returned for reuse.
// Server.mu must be held.
func (s *Server) routeUnlock(cur *conn, scratch []*conn) []*conn {
	s.route(cur)
	scratch = s.takeToFlush(scratch)
	s.mu.Unlock()
	return deliver(scratch)
}

// route routes the table's outputs, detaches the connections marked by detachLater (which may produce more
// outputs: hand-offs of revoked grants), rearms the timer and checks whether storage must
// reserve more. cur is the connection whose batch is running (its answers go to its own
// buffer and are committed here), or nil. Server.mu must be held.
func (s *Server) route(cur *conn) {
	var lost []lostGrant
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
				if grant && s.ownsConn(o.Conn) {
					// A connection is forgotten when its detach is submitted. In a cluster that is
					// before the table sees it (the DETACH entry commits later), so a grant for it
					// can still come out here: it is undelivered like any other.
					if sid, ok := s.table.SessionOnConn(o.Conn); ok {
						s.sm.undelivered(&sid, 0, o.Conn, o.Resp.ID)
					}
				}
				continue
			}
			s.metrics.answered(&o.Resp)
			if grant && s.cfg.Faults.CrashBeforeGrantReply != "" {
				s.crashBeforeGrantReply() // tests: the grant is committed (and applied here), its answer never written
			}
			if d == cur {
				cur.resp = wire.AppendResponse(answerBuf(cur.resp), &o.Resp)
				if grant {
					cur.grants = append(cur.grants, grantMark{len(cur.resp), o.Resp.ID})
				}
				continue
			}
			if !d.push(&o.Resp, grant) && grant {
				lost = append(lost, lostGrant{d, o.Resp.ID})
			}
			if !d.inToFlush {
				d.inToFlush = true
				s.toFlush = append(s.toFlush, d)
			}
		}
		s.table.ClearOuts()
		if cur != nil {
			if !cur.commit() {
				for _, g := range cur.grants {
					lost = append(lost, lostGrant{cur, g.id})
				}
			}
			cur.grants = cur.grants[:0]
		}
		if len(lost) == 0 && len(s.toDetach) == 0 {
			break
		}
		for _, u := range lost {
			s.sm.undelivered(&u.c.sid, u.c.owner, u.c.id, u.reqID)
		}
		lost = lost[:0]
		for _, d := range s.toDetach {
			d.inToDetach = false
			s.detach(d)
		}
		clear(s.toDetach)
		s.toDetach = s.toDetach[:0]
	}
	s.rearm()
	s.sm.routed()
}

// detachLater marks c for detaching before Server.mu is released (see route). Server.mu must be held.
func (s *Server) detachLater(c *conn) {
	if !c.inToDetach && !c.detached {
		c.inToDetach = true
		s.toDetach = append(s.toDetach, c)
	}
}

// ownsConn reports whether connection id was made by this node (see Server.connBase).
func (s *Server) ownsConn(id uint64) bool { return id&^0xffffffff == s.connBase }

// reportLost hands the table the grants c's output buffers dropped unwritten (a failed or
// timed-out write, an overflow, a kill; see conn.lost). Server.mu must be held; call route
// afterwards.
func (s *Server) reportLost(c *conn) {
	c.mu.Lock()
	lost := c.lost
	c.lost = nil
	c.mu.Unlock()
	if len(lost) == 0 || c.id == 0 {
		return
	}
	for _, id := range lost {
		s.sm.undelivered(&c.sid, c.owner, c.id, id)
	}
}

// detach tells the table that c is gone (its session lives on for its grace) and forgets c;
// grants its buffers dropped unwritten are reported first. Server.mu must be held; call route
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
	s.sm.detach(c)
}

// takeToFlush moves the connections that route gave output to (other than the current
// reader's) into dst, for delivery once Server.mu is released. Server.mu must be held.
func (s *Server) takeToFlush(dst []*conn) []*conn {
	for _, d := range s.toFlush {
		d.inToFlush = false
	}
	dst = append(dst, s.toFlush...)
	clear(s.toFlush)
	s.toFlush = s.toFlush[:0]
	return dst
}

// deliver writes what route queued for each connection in ds, without blocking the caller
// (see conn.tryFlush), and clears ds. Server.mu must not be held.
func deliver(ds []*conn) []*conn {
	for _, d := range ds {
		d.tryFlush()
	}
	clear(ds)
	return ds[:0]
}
