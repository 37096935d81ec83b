package cluster

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// TestCrashBetweenCommitAndReply: the leader dies after committing a hand-off and before writing
// a single answer of it. On the new leader the holder's retried RELEASE replays its stored OK,
// the grantee's retried ACQUIRE gets the same token (never a second grant), and the next waiter
// keeps its place.
func TestCrashBetweenCommitAndReply(t *testing.T) {
	fp := filepath.Join(t.TempDir(), "crash")
	p := newCluster(t, 3, "TICKETING_FAILPOINT_FILE="+fp)
	p.startAll()
	h, w1, w2 := p.newClient(), p.newClient(), p.newClient()
	h.send(acquire(1, "k", 30000, 0))
	g := h.mustAnswer(1)
	if g.Status != wire.StatusOK {
		t.Fatal(g.Status)
	}
	w1.send(acquire(1, "k", 30000, wire.WaitForever))
	time.Sleep(150 * time.Millisecond) // w1 queued first (its entry commits before w2's is sent)
	w2.send(acquire(1, "k", 30000, wire.WaitForever))
	time.Sleep(150 * time.Millisecond)

	if err := os.WriteFile(fp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h.send(release(2, "k", g.Token)) // committed hand-off to w1; the leader dies before answering
	if _, err := h.answer(2, 10*time.Second); err == nil {
		t.Fatal("the release was answered: the failpoint did not fire")
	}
	if _, err := os.Stat(fp); !os.IsNotExist(err) {
		t.Fatal("failpoint file still there: no node crashed")
	}

	// Everyone resumes on the new leader and re-sends what is unanswered, with the same ids.
	h.reconnect()
	h.send(release(2, "k", g.Token))
	if r := h.mustAnswer(2); r.Status != wire.StatusOK {
		t.Fatalf("retried release: %v (the stored OK must be replayed)", r.Status)
	}
	w1.reconnect()
	w1.send(acquire(1, "k", 30000, wire.WaitForever))
	r1 := w1.mustAnswer(1)
	if r1.Status != wire.StatusOK || r1.Token != g.Token+1 {
		t.Fatalf("w1 retry: %+v (want the committed grant, token %d)", r1, g.Token+1)
	}
	w2.reconnect()
	w2.send(acquire(1, "k", 30000, wire.WaitForever))
	w1.send(release(2, "k", r1.Token))
	if r := w1.mustAnswer(2); r.Status != wire.StatusOK {
		t.Fatal(r.Status)
	}
	r2 := w2.mustAnswer(1)
	if r2.Status != wire.StatusOK || r2.Token != r1.Token+1 {
		t.Fatalf("w2 after w1: %+v (want token %d: no grant in between, order kept)", r2, r1.Token+1)
	}
}
