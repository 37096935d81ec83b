package server

import (
	"time"
)

// The durable ceiling: the lock table grants only tokens at or below the durable token limit
// and leases that end at or before the durable horizon (locktable.Config.Durable). The
// persister keeps both ahead of demand, in the background, so that grants normally never wait
// for the disk:
//   - tokens: a block of TokenBlock is reserved when half of the previous block is used;
//   - horizon: kept at least leaseHint + horizonStep/2 ahead of now, where leaseHint is the
//     largest lease asked for recently; each write puts it horizonStep beyond what is needed.
//
// A grant that does not fit waits (its key stalls, queue intact; an EXTEND is deferred) until
// the next write lands, which the apply step requests at once. When a write fails, the table is
// told storage is failing: acquires that cannot wait get BUSY/STORAGE, stalled keys keep their
// queues, and RELEASE, CANCEL, PING, INSPECT and handshakes keep working; the persister retries
// with back-off (1 ms doubling to 1 s) and the keys resume in order once a write succeeds.
// No disk I/O ever happens under Server.mu.

const (
	horizonStep     = 5 * time.Second
	leaseHintWindow = time.Minute
	// ceilingStep is how many stalled keys a write that landed hands off before their answers
	// are routed (Table.CeilingStep).
	ceilingStep = 256
)

// noteLease records a lease asked for (ACQUIRE, EXTEND); called by the validate step.
func (s *Server) noteLease(d time.Duration) {
	for {
		cur := s.leaseHint.Load()
		if int64(d) <= cur || s.leaseHint.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// checkStorage asks the persister for a write when the table is near its bounds or something
// waits for storage. Server.mu must be held.
func (s *Server) checkStorage() {
	limit, horizon, _ := s.table.Bounds()
	last := s.table.LastToken()
	now := s.table.Now()
	if s.table.StorageWaiting() || last+s.cfg.TokenBlock/2 >= limit || horizon < now+s.leaseHint.Load()+int64(horizonStep/2) {
		select {
		case s.persistWake <- struct{}{}:
		default:
		}
	}
}

// persister writes the durable ceiling when asked, then applies it to the table.
func (s *Server) persister() {
	defer s.wg.Done()
	backoff := time.Duration(0)
	hintReset := time.Now()
	var scratch []*conn
	for {
		if backoff > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.done:
				t.Stop()
				return
			}
		} else {
			select {
			case <-s.persistWake:
			case <-s.done:
				return
			}
		}
		select {
		case <-s.done: // a wake and the stop came together: the stop writes the last record
			return
		default:
		}
		if time.Since(hintReset) > leaseHintWindow {
			// Let the hint shrink once long leases stop: the horizon (and so the wait after a
			// crash) follows the leases in use, not the longest ever seen.
			s.leaseHint.Store(0)
			hintReset = time.Now()
		}
		s.mu.Lock()
		now := s.now()
		last := s.table.LastToken()
		limit, horizon, failing := s.table.Bounds()
		need := s.table.StorageNeeds(now)
		s.mu.Unlock()
		tokenTarget := limit
		if last+s.cfg.TokenBlock/2 >= limit {
			tokenTarget = last + s.cfg.TokenBlock
		}
		horizonTarget := max(need, now+s.leaseHint.Load(), horizon-int64(horizonStep)) + int64(horizonStep)
		st, err := s.store.Persist(tokenTarget, s.boot0+horizonTarget, false)

		s.mu.Lock()
		now = s.now()
		if err != nil {
			if !failing {
				s.log.Error("storage failing: grants that need a new token or lease horizon wait (or get BUSY/STORAGE) until it works again",
					"dir", s.cfg.DataDir, "err", err)
			}
			s.table.Storage(now, true)
			backoff = min(max(2*backoff, time.Millisecond), time.Second)
		} else {
			if failing {
				s.log.Info("storage works again", "dir", s.cfg.DataDir)
				s.table.Storage(now, false)
			}
			// The keys that waited are granted in steps, their answers routed after each, so
			// that the table's event and output lists stay the size of one step (a node's first
			// burst is every acquire that came while its first horizon was written).
			more := s.table.CeilingStep(now, st.TokenLimit, st.HorizonBoot-s.boot0, ceilingStep)
			for more {
				s.route(nil)
				more = s.table.ResumeStalled(now, ceilingStep)
			}
			backoff = 0
		}
		scratch = s.routeUnlock(nil, scratch)
	}
}
