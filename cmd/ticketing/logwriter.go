package main

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// logQueue bounds the log lines waiting for a stalled output.
const logQueue = 4096

// logWriter hands the server's log lines to one goroutine that writes them to out, so that no
// caller ever waits for out. A stalled stderr (a pipe nobody reads, a blocked container log
// driver) must not stop the server: some of its log lines are written while it holds the lock
// every request takes, and a client can provoke them (a slow consumer closed, a handshake refused
// for too many sessions). Lines beyond logQueue are dropped and counted; the count is written
// once the queued lines are out. flush waits, bounded, for the queued lines: before the
// process exits.
type logWriter struct {
	out     io.Writer
	lines   chan []byte
	pending atomic.Int64  // lines queued and not yet written
	dropped atomic.Uint64 // lines dropped since the last notice
}

func newLogWriter(out io.Writer) *logWriter {
	w := &logWriter{out: out, lines: make(chan []byte, logQueue)}
	go w.run()
	return w
}

// Write queues a copy of p (slog reuses its buffers) and never blocks.
func (w *logWriter) Write(p []byte) (int, error) {
	line := append([]byte(nil), p...)
	w.pending.Add(1)
	select {
	case w.lines <- line:
	default:
		w.pending.Add(-1)
		w.dropped.Add(1)
	}
	return len(p), nil
}

func (w *logWriter) run() {
	for line := range w.lines {
		w.out.Write(line)
		if len(w.lines) == 0 { // caught up: say what could not be queued
			if n := w.dropped.Swap(0); n > 0 {
				fmt.Fprintf(w.out, "ticketing: %d log lines dropped: the log output was blocked\n", n)
			}
		}
		w.pending.Add(-1)
	}
}

// flush waits until every queued line is written, or d has passed; it reports whether they were.
func (w *logWriter) flush(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for w.pending.Load() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}
