package server

import (
	"context"
	"io"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// raftLogger is the logger hashicorp/raft and its transport and snapshot store write to: each of
// their events becomes one line of the server's own log, in its format (text or JSON) and at the
// matching level, with the library's fields as attributes and component=raft. (Their formatted
// lines used to be wrapped whole into a WARN message: two timestamps, two levels, opaque in JSON.)
// The library's INFO lines are debug lines here: they narrate elections and snapshots that the
// server logs itself where an operator needs them (leadership, membership).
func raftLogger(l *slog.Logger) hclog.Logger {
	il := hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: "raft", Level: hclog.Debug, Output: io.Discard})
	il.RegisterSink(raftSink{l})
	return il
}

type raftSink struct{ l *slog.Logger }

func (s raftSink) Accept(name string, level hclog.Level, msg string, args ...interface{}) {
	lvl := slog.LevelError
	switch level {
	case hclog.Trace, hclog.Debug, hclog.Info:
		lvl = slog.LevelDebug
	case hclog.Warn:
		lvl = slog.LevelWarn
	}
	ctx := context.Background()
	if !s.l.Enabled(ctx, lvl) {
		return
	}
	s.l.Log(ctx, lvl, msg, append([]any{"component", name}, args...)...)
}
