package main

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe to read while another goroutine writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// stalledOut blocks every Write until released, like a pipe nobody reads.
type stalledOut struct {
	release chan struct{}
	syncBuffer
}

func (s *stalledOut) Write(p []byte) (int, error) {
	<-s.release
	return s.syncBuffer.Write(p)
}

// TestLogWriterNeverBlocks: with the output stalled, logging returns at once (lines past the
// queue are dropped and counted); once the output moves, every queued line comes out in order,
// then a notice of the drops, and flush returns; later lines are written as usual.
func TestLogWriterNeverBlocks(t *testing.T) {
	out := &stalledOut{release: make(chan struct{})}
	_, lw, err := newLogger("info", "text", out)
	if err != nil {
		t.Fatal(err)
	}
	n := logQueue + 500
	done := make(chan struct{})
	go func() {
		for i := range n {
			fmt.Fprintf(lw, "line %d\n", i)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("writing log lines blocked on a stalled output")
	}
	if lw.flush(50 * time.Millisecond) {
		t.Fatal("flush reported the lines written while the output is stalled")
	}
	close(out.release)
	if !lw.flush(5 * time.Second) {
		t.Fatal("flush did not finish after the output moved")
	}
	fmt.Fprintf(lw, "after\n")
	if !lw.flush(5 * time.Second) {
		t.Fatal("flush did not finish")
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	// One line may have been taken by the writer goroutine (and blocked in Write) before the
	// queue filled, so the queue held logQueue more: logQueue+1 lines written, the rest dropped.
	if lines[0] != "line 0" {
		t.Fatalf("first line %q", lines[0])
	}
	var kept int
	for kept < len(lines) && lines[kept] == fmt.Sprintf("line %d", kept) {
		kept++
	}
	if kept < logQueue || kept >= n {
		t.Fatalf("%d lines kept in order, want at least the queue's %d and fewer than all %d", kept, logQueue, n)
	}
	// If the writer goroutine took its first line only after the queue had filled (a busy
	// machine starts it late), that took a slot back: one later line got in after the first
	// drops, still in order.
	written := kept
	if kept < len(lines) && strings.HasPrefix(lines[kept], "line ") {
		var later int
		if _, err := fmt.Sscanf(lines[kept], "line %d", &later); err != nil || later <= kept || later >= n {
			t.Fatalf("line %d after the kept lines: %q", kept, lines[kept])
		}
		written++
	}
	want := []string{fmt.Sprintf("ticketing: %d log lines dropped: the log output was blocked", n-written), "after"}
	if got := lines[written:]; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("after the kept lines: %q, want %q", got, want)
	}
}
