package server

import (
	"testing"

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
