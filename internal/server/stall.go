package server

import (
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// A leader whose disk stalls keeps sending heartbeats (they do not touch the disk), so its
// followers never elect another leader while nothing commits (hashicorp/raft#503). The log
// store is wrapped to time every write; a watchdog on the leader stops the process (a
// supervisor restarts it) when a write has been in progress longer than the stall bound, so the
// others elect a leader. It does not try a leadership transfer first: hashicorp/raft runs the
// transfer on the same loop that is blocked in the stalled write, so it could never finish.

// timedLogStore times the writes of a raft.LogStore.
type timedLogStore struct {
	raft.LogStore
	since atomic.Int64 // UnixNano when the write in progress started; 0 when none
	mu    sync.Mutex   // one write at a time is what raft does; the mutex keeps since exact
	stall string       // failpoint: while this file exists, writes block (tests)
}

// IsMonotonic passes on raft.MonotonicLogStore: raft-wal cannot take gaps in its indexes and
// says so, and hashicorp/raft then clears the log after installing a snapshot instead of
// leaving the old entries before a gap. A wrapper that hid it made raft treat the WAL as a store
// that tolerates gaps.
func (s *timedLogStore) IsMonotonic() bool {
	m, ok := s.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (s *timedLogStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s *timedLogStore) StoreLogs(logs []*raft.Log) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.since.Store(time.Now().UnixNano())
	defer s.since.Store(0)
	for s.stall != "" {
		if _, err := os.Stat(s.stall); err != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return s.LogStore.StoreLogs(logs)
}

// stallBound is how long a leader's log write may take before it steps down.
func (c *cluster) stallBound() time.Duration {
	return max(time.Second, time.Duration(float64(4*baseHeartbeat)*c.cfg.timing()))
}

// watchDisk steps a leader down when its log store stalls past the bound.
func (c *cluster) watchDisk(logs *timedLogStore) {
	defer c.s.wg.Done()
	w := stallWatch{interval: c.stallBound() / 4}
	tick := time.NewTicker(w.interval)
	defer tick.Stop()
	for {
		select {
		case <-c.s.done:
			return
		case <-tick.C:
		}
		d := w.observe(time.Now(), logs.since.Load())
		if d < c.stallBound() || c.raft.State() != raft.Leader {
			continue
		}
		c.s.log.Error("cluster: the log store has stalled while leading; stopping the process so the cluster can elect another leader",
			"stalled_for", d.Round(time.Millisecond))
		c.s.flushLog()
		os.Exit(70)
	}
}

// stallWatch counts a write's stall only over time the watchdog itself saw pass: when its ticks
// come much later than their interval, the whole process was frozen (SIGSTOP, a VM paused) or
// starved of CPU, and a write in progress then looks stalled though the disk did nothing
// wrong. Exiting on waking would turn every pause of a leader into a crash and a restart; the
// watch restarts from the wake instead, so a write that still hangs afterwards is caught one
// bound later.
type stallWatch struct {
	interval time.Duration
	last     time.Time // the previous observation
	resumed  time.Time // the last wake after a gap in the ticks
}

// observe returns how long the write in progress since (UnixNano; 0: none) has stalled, counted
// from the later of its start and the last wake.
func (w *stallWatch) observe(now time.Time, since int64) time.Duration {
	if !w.last.IsZero() && now.Sub(w.last) > 2*w.interval {
		w.resumed = now
	}
	w.last = now
	if since == 0 {
		return 0
	}
	from := time.Unix(0, since)
	if w.resumed.After(from) {
		from = w.resumed
	}
	return now.Sub(from)
}
