package server

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

// The log store wrapper passes on raft-wal's MonotonicLogStore: hashicorp/raft clears a WAL
// follower's log when it installs a snapshot only if it knows the store takes no gaps.
func TestTimedLogStoreKeepsMonotonic(t *testing.T) {
	w, err := raftwal.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var ls raft.LogStore = &timedLogStore{LogStore: w}
	if m, ok := ls.(raft.MonotonicLogStore); !ok || !m.IsMonotonic() {
		t.Fatal("the wrapped raft-wal store does not say it is monotonic")
	}
	ls = &timedLogStore{LogStore: raft.NewInmemStore()}
	if m, ok := ls.(raft.MonotonicLogStore); ok && m.IsMonotonic() {
		t.Fatal("a store that takes gaps says it is monotonic")
	}
}

// A write that looks stalled only because the whole process was frozen (its watchdog's ticks
// came late) is not a disk stall: the count restarts at the wake. A write that hangs on after
// the wake is still caught, one bound later.
func TestStallWatchIgnoresAFrozenProcess(t *testing.T) {
	w := stallWatch{interval: 250 * time.Millisecond}
	t0 := time.Unix(1_000_000, 0)
	write := t0.Add(100 * time.Millisecond).UnixNano()
	tick := func(at time.Duration) time.Duration { return w.observe(t0.Add(at), write) }
	if d := tick(250 * time.Millisecond); d != 150*time.Millisecond {
		t.Fatalf("regular tick: %v", d)
	}
	// Frozen for 5 s: the next tick comes 5 s late. Not a stall.
	if d := tick(5250 * time.Millisecond); d != 0 {
		t.Fatalf("first tick after a freeze counts %v of stall, want 0", d)
	}
	// The write still hangs after the wake: counted from the wake.
	for at := 5500 * time.Millisecond; at <= 6250*time.Millisecond; at += 250 * time.Millisecond {
		tick(at)
	}
	if d := tick(6500 * time.Millisecond); d != 1250*time.Millisecond {
		t.Fatalf("a write hanging 1.25 s after the wake counts %v", d)
	}
	// Ticks on time, a write stalled from before them: counted from its start.
	w2 := stallWatch{interval: 250 * time.Millisecond}
	for at := time.Duration(0); at <= time.Second; at += 250 * time.Millisecond {
		w2.observe(t0.Add(at), 0)
	}
	if d := w2.observe(t0.Add(1250*time.Millisecond), t0.UnixNano()); d != 1250*time.Millisecond {
		t.Fatalf("a stall seen by regular ticks: %v", d)
	}
}
