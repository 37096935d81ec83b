package server

import (
	"encoding/hex"
	"io"
	"os"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ticketing/ticketing/internal/locktable"
)

// fsm is the lock table as hashicorp/raft's (batching) state machine.
type fsm cluster

var _ raft.BatchingFSM = (*fsm)(nil)

// ApplyBatch applies committed entries in order under Server.mu and routes their outputs to this
// node's connections (only the leader has any). An entry that cannot be applied stops the
// replica (applyFailed).
func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	s := f.s
	s.mu.Lock()
	for _, l := range logs {
		if l.Type != raft.LogCommand || f.halted.Load() {
			continue
		}
		var err error
		s.reqs, err = s.table.Apply(l.Data, s.reqs)
		if err != nil {
			s.table.ClearOuts() // a partly applied entry answers nobody
			(*cluster)(f).applyFailed(l.Index, err)
			continue
		}
		s.route(nil)
		if now := s.table.Now(); now != f.appliedNow {
			f.appliedNow, f.appliedAt = now, time.Now()
		}
		if every := s.cfg.Faults.StateHashEvery; every > 0 && l.Index%every == 0 {
			h := s.table.StateHash()
			s.log.Info("state hash", "index", l.Index, "hash", hex.EncodeToString(h[:8]))
		}
	}
	s.routeUnlock(nil, nil)
	return make([]interface{}, len(logs))
}

// exitProcess ends the process (applyFailed); tests replace it.
var exitProcess = os.Exit

// applyFailed stops this replica for good: the committed entry at index could not be applied (a
// command type this version does not know — a newer leader during a rolling upgrade — or a
// malformed entry). Table.Apply has applied the commands before the failing one and not the
// rest, so this node's table is no longer the one the other replicas have, and nothing it
// would do from here on (serve clients, lead, apply more entries on top) can be trusted. Raft's
// state machine cannot refuse an entry, and carrying on diverges silently, so the node stops:
// one error line saying why, then the process exits with code 70 (as for a stalled disk). A
// supervisor restarts it, and it stops again at the same entry until it runs a binary that can
// apply it; the other nodes keep the cluster going. exitProcess returns only in tests: the node
// then stays halted (it applies nothing more, never leads, and serves no client).
// Server.mu is held.
func (c *cluster) applyFailed(index uint64, err error) {
	c.halted.Store(true)
	c.leader.Store(false) // stop serving at once; watchLeadership sends the clients away
	c.s.log.Error("cluster: a committed log entry cannot be applied; stopping this node (exit 70) so that it does not diverge from the other replicas: run a version that can apply it (upgrade this node) and restart it",
		"index", index, "err", err)
	c.s.flushLog()
	exitProcess(70)
}

// flushLog gives the log writer up to a second to write what is queued (Config.LogFlush), before
// the process exits.
func (s *Server) flushLog() {
	if f := s.cfg.LogFlush; f != nil {
		f(time.Second)
	}
}

// Apply is ApplyBatch for one entry.
func (f *fsm) Apply(l *raft.Log) interface{} { return f.ApplyBatch([]*raft.Log{l})[0] }

// Snapshot captures the table (the bytes are produced here; Persist only writes them).
//
// It serialises the table without Server.mu: hashicorp/raft calls Snapshot, ApplyBatch and
// Restore from one goroutine (its runFSM loop), and on a replica nothing else changes the table
// (every change is an applied entry; the request path and the admin views only read it under
// Server.mu). So the table holds still while it is read here, and the readers that hold the lock
// meanwhile are not kept waiting behind a serialisation of every key (0.56 s for 100,000 held
// locks on a busy 2-core machine: locktable's BenchmarkSnapshot100kHeld).
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	t := f.s.table // replaced only by Restore, on this goroutine
	return &fsmSnapshot{b: t.Snapshot(), last: t.LastToken(), s: f.s}, nil
}

// Restore replaces the table with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	t, err := locktable.Restore(f.s.tableConfig(), b)
	if err != nil {
		return err
	}
	f.s.mu.Lock()
	t.SetObserver(f.s.obs)
	f.s.table = t
	f.appliedNow, f.appliedAt = t.Now(), time.Now()
	f.s.mu.Unlock()
	return nil
}

// fsmSnapshot is a snapshot's bytes and the last token applied when it was taken, which Persist
// also records in the data directory's store: a lower bound of the cluster's tokens, for the
// message that refuses to reuse the directory as something else (New, startCluster).
type fsmSnapshot struct {
	b    []byte
	last uint64
	s    *Server
}

func (f *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(f.b); err != nil {
		sink.Cancel()
		return err
	}
	if err := sink.Close(); err != nil {
		return err
	}
	if _, err := f.s.store.Persist(f.last, 0, false); err != nil {
		f.s.log.Warn("cluster: could not record the last token in the data directory's state file", "err", err)
	}
	return nil
}

func (*fsmSnapshot) Release() {}
