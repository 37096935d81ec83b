// Package server owns the sockets of a single Ticketing node: it accepts connections, runs the
// handshake, decodes every complete frame in each read, applies it to the lock table, and writes
// the answers of a batch with one write.
//
// Lock order: Server.mu before conn.mu. Server.mu guards the lock table, the connection registry
// and the timer; conn.mu guards a connection's output buffer. No mutex is held during socket I/O.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing/ticketing/internal/locktable"
	"github.com/ticketing/ticketing/internal/tokens"
)

// Server is a single Ticketing node.
type Server struct {
	cfg    Config
	log    *slog.Logger
	tokens *tokens.Allocator
	epoch  time.Time // the table's clock is time.Since(epoch), monotonic

	mu       sync.Mutex // guards everything below it
	table    *locktable.Table
	conns    map[locktable.Owner]*conn
	nextID   locktable.Owner
	timer    *time.Timer
	timerAt  int64 // when timer fires; valid while armed
	armed    bool
	shutting bool
	touched  []*conn // connections dispatch gave answers to; see takeTouched

	nconns   atomic.Int64
	ln       net.Listener
	lnMu     sync.Mutex
	done     chan struct{} // closed by Shutdown
	wg       sync.WaitGroup
	shutOnce sync.Once
}

// New prepares a server: it validates cfg and opens the durable token counter in cfg.DataDir.
func New(cfg Config, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	alloc, err := tokens.Open(cfg.DataDir, cfg.TokenBlock)
	if err != nil {
		return nil, fmt.Errorf("token store in %s: %w", cfg.DataDir, err)
	}
	s := &Server{
		cfg:    cfg,
		log:    log,
		tokens: alloc,
		epoch:  time.Now(),
		conns:  make(map[locktable.Owner]*conn),
		done:   make(chan struct{}),
	}
	s.table = locktable.New(locktable.Config{
		MaxWaitersPerKey: cfg.MaxWaitersPerKey,
		MaxWaitersTotal:  cfg.MaxWaiters,
		MaxLocks:         cfg.MaxLocks,
		LockDelay:        int64(cfg.LockDelay),
		AvailableFrom:    int64(cfg.StartupGrace), // the table's clock starts at 0 with the server
	}, alloc)
	s.timer = time.NewTimer(time.Hour)
	s.timer.Stop()
	return s, nil
}

// now is the table's clock: nanoseconds since the server started, monotonic.
func (s *Server) now() int64 { return int64(time.Since(s.epoch)) }

// Listen opens the configured address (with TLS when configured).
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return nil, err
	}
	return ln, nil
}

// Serve accepts connections on ln until Shutdown. It returns nil after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.lnMu.Lock()
	s.ln = ln
	s.lnMu.Unlock()
	select {
	case <-s.done:
		ln.Close()
		return nil
	default:
	}
	s.wg.Add(1)
	go s.clock()
	s.log.Info("listening", "addr", ln.Addr().String(), "tls", s.cfg.TLS != nil, "auth", s.cfg.Token != "",
		"data_dir", s.cfg.DataDir, "next_token", s.tokens.Last()+1)
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return nil
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Anything else (EMFILE and the like) is temporary: back off instead of spinning.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
				continue
			case <-s.done:
				return nil
			}
		}
		backoff = 0
		s.nconns.Add(1)
		s.wg.Add(1)
		go s.serveConn(nc)
	}
}

// serveConn runs one connection: handshake, then the read loop, then cleanup.
func (s *Server) serveConn(nc net.Conn) {
	defer s.wg.Done()
	defer s.nconns.Add(-1)
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if s.cfg.TLS != nil {
		nc = tls.Server(nc, s.cfg.TLS)
	}
	c := newConn(s, nc)
	if !c.handshake() {
		nc.Close()
		return
	}
	s.mu.Lock()
	if s.shutting {
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.nextID++
	c.id = s.nextID
	s.conns[c.id] = c
	s.mu.Unlock()

	c.readLoop()

	// The connection is gone: its waiters leave the queues; its held locks stay until their
	// lease ends (the holder may reconnect and release).
	s.mu.Lock()
	now := s.now()
	s.table.DropOwner(now, c.id)
	delete(s.conns, c.id)
	s.dispatch(now, nil)
	s.rearm()
	touched := s.takeTouched(nil)
	s.mu.Unlock()
	deliver(touched)
	c.close()
}

// clock is the one goroutine that drives lease expiries, wait timeouts and lock-delay ends.
func (s *Server) clock() {
	defer s.wg.Done()
	var touched []*conn
	for {
		select {
		case <-s.done:
			return
		case <-s.timer.C:
		}
		s.mu.Lock()
		s.armed = false
		now := s.now()
		s.table.Advance(now)
		s.dispatch(now, nil)
		s.rearm()
		touched = s.takeTouched(touched)
		s.mu.Unlock()
		touched = deliver(touched)
	}
}

// rearm makes the timer fire at the table's next deadline if that is earlier than the timer's.
// s.mu must be held.
func (s *Server) rearm() {
	next, ok := s.table.NextDeadline()
	if !ok || (s.armed && next >= s.timerAt) {
		return
	}
	s.armed = true
	s.timerAt = next
	s.timer.Reset(time.Duration(next - s.now()))
}

// Shutdown stops the server gracefully: no new connections; every queued acquire is answered
// SHUTTING_DOWN; answers already queued are flushed; then connections close. Held locks keep their
// tokens' meaning (the token counter is durable), but a single node's lock table is in memory and
// does not survive the process. Shutdown waits for every goroutine or until ctx is done.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutOnce.Do(func() {
		s.mu.Lock()
		s.shutting = true
		now := s.now()
		s.table.Abort(now)
		s.dispatch(now, nil)
		s.takeTouched(nil) // every connection is flushed below
		conns := make([]*conn, 0, len(s.conns))
		for _, c := range s.conns {
			conns = append(conns, c)
		}
		s.mu.Unlock()
		close(s.done)
		s.lnMu.Lock()
		if s.ln != nil {
			s.ln.Close()
		}
		s.lnMu.Unlock()
		for _, c := range conns {
			c.tryFlush() // never blocks on a client that does not read; the reader's close flushes the rest
			c.shutdown()
		}
	})
	waited := make(chan struct{})
	go func() { s.wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		// Some connection goroutines are still running and may still take tokens: leave the
		// allocator open (every token it hands out is already durable).
		return ctx.Err()
	}
	s.timer.Stop()
	return s.tokens.Close()
}

// Stats reports the table's size: keys present, locks held, acquires queued, and connections.
func (s *Server) Stats() (keys, held, waiters, conns int) {
	s.mu.Lock()
	keys, held, waiters = s.table.Stats()
	conns = len(s.conns)
	s.mu.Unlock()
	return
}
