package server

import (
	"encoding/binary"
	"time"

	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/internal/wire"
)

// Constant messages, so that answering does not allocate.
const (
	msgFlags    = "reserved flags must be zero"
	msgID       = "request id must be non-zero"
	msgDupID    = "request id already used by a pending acquire on this connection"
	msgOp       = "unknown operation"
	msgKey      = "key empty or longer than the server's max key length"
	msgLease    = "lease outside the server's range"
	msgToken    = "token must be non-zero"
	msgShutting = "server shutting down"
	msgInflight = "too many pending acquires on this connection"
	msgPerKey   = "too many waiters on this key"
	msgWaiters  = "too many waiters on this server"
	msgLocks    = "too many keys on this server"
)

var msgShuttingBytes = []byte(msgShutting)

// handle applies one request and queues its answer (and any events it caused). Server.mu must be held.
func (c *conn) handle(now int64, r *wire.Request) {
	s := c.s
	switch {
	case r.Flags != 0:
		c.answer(r.Op, wire.StatusInvalid, r.ID, 0, 0, wire.FieldFlags, msgFlags)
		return
	case r.ID == 0:
		c.answer(r.Op, wire.StatusInvalid, r.ID, 0, 0, wire.FieldRequestID, msgID)
		return
	}
	switch r.Op {
	case wire.OpAcquire:
		if !c.validKey(r) || !c.validLease(r) {
			return
		}
		if s.shutting {
			c.answer(r.Op, wire.StatusShuttingDown, r.ID, 0, 0, 0, msgShutting)
			return
		}
		wait := int64(-1)
		if r.WaitMs != wire.WaitForever {
			wait = int64(r.WaitMs) * int64(time.Millisecond)
		}
		if wait != 0 && c.pending >= s.cfg.MaxInflight {
			c.answer(r.Op, wire.StatusBusy, r.ID, 0, 0, wire.LimitInflight, msgInflight)
			return
		}
		res := s.table.Acquire(now, c.id, r.ID, r.Key, int64(r.Lease)*int64(time.Millisecond), wait)
		switch res.Status {
		case locktable.OK:
			c.answer(r.Op, wire.StatusOK, r.ID, res.Token, r.Lease, 0, "")
		case locktable.Queued:
			c.pending++
		case locktable.TimedOut:
			c.answer(r.Op, wire.StatusTimedOut, r.ID, 0, 0, 0, "")
		case locktable.Duplicate:
			c.answer(r.Op, wire.StatusInvalid, r.ID, 0, 0, wire.FieldRequestID, msgDupID)
		case locktable.Busy:
			limit, msg := wire.LimitLocks, msgLocks
			switch res.Limit {
			case locktable.LimitWaitersPerKey:
				limit, msg = wire.LimitWaitersPerKey, msgPerKey
			case locktable.LimitWaitersTotal:
				limit, msg = wire.LimitWaitersTotal, msgWaiters
			}
			c.answer(r.Op, wire.StatusBusy, r.ID, 0, 0, limit, msg)
		}
	case wire.OpRelease:
		if !c.validKey(r) || !c.validToken(r) {
			return
		}
		st := wire.StatusNotHeld
		if s.table.Release(now, r.Key, r.Token) == locktable.OK {
			st = wire.StatusOK
		}
		c.answer(r.Op, st, r.ID, 0, 0, 0, "")
	case wire.OpExtend:
		if !c.validKey(r) || !c.validToken(r) || !c.validLease(r) {
			return
		}
		if s.table.Extend(now, r.Key, r.Token, int64(r.Lease)*int64(time.Millisecond)) == locktable.OK {
			c.answer(r.Op, wire.StatusOK, r.ID, r.Token, r.Lease, 0, "")
		} else {
			c.answer(r.Op, wire.StatusNotHeld, r.ID, 0, 0, 0, "")
		}
	case wire.OpCancel:
		var removed uint32
		if s.table.Cancel(now, c.id, r.Token) {
			removed = 1
			c.pending--
			c.answer(wire.OpAcquire, wire.StatusCancelled, r.Token, 0, 0, 0, "")
		}
		c.answer(r.Op, wire.StatusOK, r.ID, 0, 0, removed, "")
	case wire.OpPing:
		c.answer(r.Op, wire.StatusOK, r.ID, 0, 0, 0, "")
	case wire.OpInspect:
		if !c.validKey(r) {
			return
		}
		c.inspect(now, r)
	default:
		c.answer(r.Op, wire.StatusInvalid, r.ID, 0, 0, wire.FieldOp, msgOp)
		return
	}
	s.dispatch(now, c)
}

func (c *conn) validKey(r *wire.Request) bool {
	if len(r.Key) == 0 || len(r.Key) > c.s.cfg.MaxKeyLen {
		c.answer(r.Op, wire.StatusInvalid, r.ID, 0, 0, wire.FieldKey, msgKey)
		return false
	}
	return true
}

func (c *conn) validLease(r *wire.Request) bool {
	d := time.Duration(r.Lease) * time.Millisecond
	if d < c.s.cfg.MinLease || d > c.s.cfg.MaxLease {
		c.answer(r.Op, wire.StatusInvalid, r.ID, 0, 0, wire.FieldLease, msgLease)
		return false
	}
	return true
}

func (c *conn) validToken(r *wire.Request) bool {
	if r.Token == 0 {
		c.answer(r.Op, wire.StatusInvalid, r.ID, 0, 0, wire.FieldToken, msgToken)
		return false
	}
	return true
}

// dispatch queues the table's events as answers on their connections and records every
// connection other than cur (whose reader flushes after its batch) in s.touched, for delivery
// once Server.mu is released. Server.mu must be held.
func (s *Server) dispatch(now int64, cur *conn) {
	evs := s.table.Events()
	if len(evs) == 0 {
		return
	}
	for i := range evs {
		ev := &evs[i]
		d := s.conns[ev.Owner]
		if d == nil {
			continue // an expiry notice for a connection that is gone
		}
		r := wire.Response{Op: wire.OpAcquire, ID: ev.ReqID}
		switch ev.Kind {
		case locktable.EvGranted:
			d.pending--
			r.Token = ev.Token
			r.Lease = uint32(ev.Lease / int64(time.Millisecond))
			r.Detail = uint32(max(now-ev.Since, 0) / int64(time.Millisecond)) // ms spent queued
		case locktable.EvTimedOut:
			d.pending--
			r.Status = wire.StatusTimedOut
		case locktable.EvAborted:
			d.pending--
			r.Status = wire.StatusShuttingDown
			r.Data = msgShuttingBytes
		case locktable.EvExpired:
			r = wire.Response{Op: wire.OpExpired, Token: ev.Token, Data: ev.Key}
		}
		d.push(cur, &r)
		if d != cur && !d.marked {
			d.marked = true
			s.touched = append(s.touched, d)
		}
	}
	s.table.ClearEvents()
}

// takeTouched moves the connections that dispatch gave answers to (other than the current
// reader's) into dst, for delivery after Server.mu is released. Server.mu must be held.
func (s *Server) takeTouched(dst []*conn) []*conn {
	for _, d := range s.touched {
		d.marked = false
	}
	dst = append(dst, s.touched...)
	clear(s.touched)
	s.touched = s.touched[:0]
	return dst
}

// deliver writes what dispatch queued for each connection in ds, without blocking the caller
// (see conn.tryFlush), and clears ds. Server.mu must not be held.
func deliver(ds []*conn) []*conn {
	for _, d := range ds {
		d.tryFlush()
	}
	clear(ds)
	return ds[:0]
}

// inspect answers INSPECT: holder token, lease left, queue length, held-for and lock-delay left.
// Server.mu must be held.
func (c *conn) inspect(now int64, r *wire.Request) {
	var data [wire.InspectDataSize]byte
	resp := wire.Response{Op: r.Op, Status: wire.StatusOK, ID: r.ID, Data: data[:]}
	if info, ok := c.s.table.Inspect(r.Key); ok {
		ms := func(d int64) uint32 { return uint32(min(max(d, 0)/int64(time.Millisecond), int64(^uint32(0)))) }
		if info.Held {
			resp.Token = info.Token
			resp.Lease = ms(info.Deadline - now)
			binary.BigEndian.PutUint32(data[0:], ms(now-info.GrantedAt))
		}
		resp.Detail = uint32(info.Waiters)
		binary.BigEndian.PutUint32(data[4:], ms(info.DelayUntil-now))
	}
	c.resp = wire.AppendResponse(c.resp, &resp)
}
