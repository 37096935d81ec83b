package server

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"github.com/hashicorp/raft"
)

// Cluster metrics that hashicorp/raft measures itself: it reports its timings to the process's
// go-metrics sink (none by default: a no-op). raftTimings takes the two an operator pages on and
// keeps them as histograms for /metrics:
//
//   - ticketing_raft_commit_seconds: on the leader, from the start of a batch's write to its own
//     log until a majority has it (raft.commitTime);
//   - ticketing_raft_log_fsync_seconds: a durable append to this node's Raft log, the write and
//     its fsync (raft.leader.dispatchLog on the leader, raft.rpc.appendEntries.storeLogs on a
//     follower).
//
// The sink is the process's (go-metrics has one global sink), installed once; a process runs
// one server, so these are that server's. It ignores every other key without allocating, and
// with no filter configured go-metrics hands keys over without joining them.
//
// Leader changes are counted from a Raft observer (watchLeaderChanges) while event metrics are
// on.

var (
	commitBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	fsyncBuckets  = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

	raftCommit = newAtomicHisto(commitBuckets)
	raftFsync  = newAtomicHisto(fsyncBuckets)

	raftTimingsOnce sync.Once
)

// installRaftSink makes raftTimings the process's go-metrics sink (once).
func installRaftSink() {
	raftTimingsOnce.Do(func() {
		gometrics.NewGlobal(&gometrics.Config{FilterDefault: true, TimerGranularity: time.Millisecond}, raftTimings{})
	})
}

// atomicHisto is a histogram observed from any goroutine: counts[i] observations fell in bucket
// i (not cumulative; the last one is +Inf); the sum in ns.
type atomicHisto struct {
	bounds []float64 // seconds
	counts []atomic.Uint64
	n      atomic.Uint64
	sumNs  atomic.Int64
}

func newAtomicHisto(bounds []float64) *atomicHisto {
	return &atomicHisto{bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
}

func (h *atomicHisto) observe(sec float64) {
	i := 0
	for i < len(h.bounds) && sec > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.n.Add(1)
	h.sumNs.Add(int64(math.Round(sec * 1e9)))
}

// write writes h as family name (Prometheus reads _count after the buckets: counts are read
// first, so the total is never below a bucket's).
func (h *atomicHisto) write(e *expo, name, help string) {
	counts := make([]uint64, len(h.counts))
	var n uint64
	for i := range h.counts {
		counts[i] = h.counts[i].Load()
		n += counts[i]
	}
	e.family(name, "histogram", help)
	e.histogram(name, h.bounds, counts, n, float64(h.sumNs.Load())/1e9)
}

// raftTimings is a go-metrics sink that keeps raft's commit and log-write timings (in ms, the
// go-metrics timer unit) and drops everything else.
type raftTimings struct{}

func (raftTimings) AddSample(key []string, val float32) {
	if len(key) < 2 || key[0] != "raft" {
		return
	}
	switch {
	case len(key) == 2 && key[1] == "commitTime":
		raftCommit.observe(float64(val) / 1e3)
	case len(key) == 3 && key[1] == "leader" && key[2] == "dispatchLog",
		len(key) == 4 && key[1] == "rpc" && key[2] == "appendEntries" && key[3] == "storeLogs":
		raftFsync.observe(float64(val) / 1e3)
	}
}

func (s raftTimings) AddSampleWithLabels(key []string, val float32, _ []gometrics.Label) {
	s.AddSample(key, val)
}
func (raftTimings) SetGauge([]string, float32)                                 {}
func (raftTimings) SetGaugeWithLabels([]string, float32, []gometrics.Label)    {}
func (raftTimings) EmitKey([]string, float32)                                  {}
func (raftTimings) IncrCounter([]string, float32)                              {}
func (raftTimings) IncrCounterWithLabels([]string, float32, []gometrics.Label) {}

// watchLeaderChanges counts the leader changes this node sees (a new leader known; an election
// in progress is not one) until the server stops.
func (m *metrics) watchLeaderChanges(c *cluster) {
	obs := make(chan raft.Observation, 16)
	o := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	c.raft.RegisterObserver(o)
	go func() {
		defer c.raft.DeregisterObserver(o)
		var last raft.ServerID
		if _, id := c.raft.LeaderWithID(); id != "" {
			last = id
			m.leaderChanges.Add(1) // the leader this node knew when counting began
		}
		for {
			select {
			case <-m.s.done:
				return
			case ob := <-obs:
				if lo, ok := ob.Data.(raft.LeaderObservation); ok && lo.LeaderID != "" && lo.LeaderID != last {
					last = lo.LeaderID
					m.leaderChanges.Add(1)
				}
			}
		}
	}()
}

// writeRaftTimings writes the cluster's timing histograms and the leader-change counter.
func (m *metrics) writeRaftTimings(e *expo) {
	raftCommit.write(e, "ticketing_raft_commit_seconds", "Cluster: on the leader, time from writing a batch of entries to its log until a majority has stored it (commit latency).")
	raftFsync.write(e, "ticketing_raft_log_fsync_seconds", "Cluster: durable appends to this node's Raft log, the write and its fsync (leader and followers).")
	if m.on {
		e.family("ticketing_raft_leader_changes_total", "counter", "Cluster: leader changes this node has seen (a new leader known; the first leader it learnt of counts).")
		e.uint("ticketing_raft_leader_changes_total", m.leaderChanges.Load())
	}
}
