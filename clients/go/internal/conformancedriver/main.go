// Command conformancedriver is the Go client's conformance driver (tests/conformance/DRIVER.md):
// it reads commands from stdin, one JSON object per line, runs each on the public API of
// github.com/ticketing/ticketing/clients/go concurrently, and writes one reply per command, and
// lost events, to stdout, one JSON object per line. It checks nothing itself: the runner does.
//
// clients/go/test.sh builds it into bin/; clients/go/conformance-driver starts it.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
)

func main() {
	d := newDriver(os.Stdout)
	os.Exit(d.run(os.Stdin))
}

// features are the DRIVER.md features this client has.
var features = []string{"locks", "cancel", "keepalive", "with_lock", "verify", "refuse_held", "tls", "mtls", "request_timeout", "lost_events", "connect_election"}

type driver struct {
	outMu sync.Mutex
	out   *bufio.Writer

	mu       sync.Mutex
	clients  map[string]*ticketing.Client
	handles  map[string]*handle
	acquires map[int64]context.CancelFunc // pending acquire commands, by command id
	wg       sync.WaitGroup               // commands in progress (for tests)
}

// handle is a lock created by acquire/try_acquire, with the goroutine that reports its lost
// event.
type handle struct {
	lk   *ticketing.Lock
	stop chan struct{} // closed after a successful release or at reset: no event after that
	once sync.Once
}

func (h *handle) forget() { h.once.Do(func() { close(h.stop) }) }

func newDriver(w io.Writer) *driver {
	return &driver{
		out:      bufio.NewWriter(w),
		clients:  map[string]*ticketing.Client{},
		handles:  map[string]*handle{},
		acquires: map[int64]context.CancelFunc{},
	}
}

// command is one line from the runner; arguments are decoded per op.
type command struct {
	ID int64  `json:"id"`
	Op string `json:"op"`

	Client           string          `json:"client"`
	Endpoints        []string        `json:"endpoints"`
	Token            json.RawMessage `json:"token"` // connect: string or null; release_token: decimal string
	TLS              *tlsArgs        `json:"tls"`
	RequestTimeoutMs *int64          `json:"request_timeout_ms"`
	HeartbeatMs      *int64          `json:"heartbeat_ms"`
	DialTimeoutMs    *int64          `json:"dial_timeout_ms"`
	Key              *string         `json:"key"`
	KeyHex           *string         `json:"key_hex"`
	LeaseMs          int64           `json:"lease_ms"`
	WaitMs           *int64          `json:"wait_ms"`
	KeepAlive        bool            `json:"keepalive"`
	RefuseHeld       bool            `json:"refuse_held"`
	Lock             string          `json:"lock"`
	Target           int64           `json:"target"`
	HoldMs           int64           `json:"hold_ms"`
}

type tlsArgs struct {
	CA         string `json:"ca"`
	Cert       string `json:"cert"`
	Key        string `json:"key"`
	ServerName string `json:"server_name"`
}

// run reads commands until exit or the end of stdin and returns the exit status.
func (d *driver) run(in io.Reader) int {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var cmd command
		if err := json.Unmarshal(line, &cmd); err != nil {
			fmt.Fprintf(os.Stderr, "go driver: bad command %q: %v\n", line, err)
			continue
		}
		if cmd.Op == "exit" {
			d.reply(cmd.ID, nil, nil) // commands still running are abandoned with the process
			return 0
		}
		if cmd.Op == "acquire" {
			// Registered before the next command is read, so that a cancel naming it finds it.
			ctx, cancel := context.WithCancel(context.Background())
			d.mu.Lock()
			d.acquires[cmd.ID] = cancel
			d.mu.Unlock()
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				res, err := d.acquire(ctx, &cmd)
				d.mu.Lock()
				delete(d.acquires, cmd.ID)
				d.mu.Unlock()
				cancel()
				d.reply(cmd.ID, res, err)
			}()
			continue
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			res, err := d.handle(&cmd)
			d.reply(cmd.ID, res, err)
		}()
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "go driver: reading stdin:", err)
	}
	return 0
}

// write sends one JSON line, flushed.
func (d *driver) write(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go driver: marshal:", err)
		return
	}
	d.outMu.Lock()
	defer d.outMu.Unlock()
	d.out.Write(append(b, '\n'))
	d.out.Flush()
}

func (d *driver) reply(id int64, res map[string]any, err error) {
	if err != nil {
		e := map[string]any{"kind": kind(err), "message": err.Error()}
		var lost *ticketing.LockLostError
		if errors.As(err, &lost) {
			e["reason"] = reason(lost.Reason)
		}
		d.write(map[string]any{"id": id, "ok": false, "error": e})
		return
	}
	out := map[string]any{"id": id, "ok": true}
	for k, v := range res {
		out[k] = v
	}
	d.write(out)
}

// badArg is an argument the driver cannot pass to the client at all (a malformed token string).
type badArg struct{ msg string }

func (e *badArg) Error() string { return e.msg }

// kind maps a client error onto DRIVER.md's error kinds.
func kind(err error) string {
	var ba *badArg
	switch {
	case errors.As(err, &ba):
		return "invalid_argument"
	case errors.Is(err, ticketing.ErrLockLost):
		return "lock_lost"
	case errors.Is(err, ticketing.ErrNotAcquired):
		return "not_acquired"
	case errors.Is(err, ticketing.ErrAlreadyHeld):
		return "already_held"
	case errors.Is(err, ticketing.ErrServerRestarted):
		return "server_restarted"
	case errors.Is(err, ticketing.ErrCancelled), errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, ticketing.ErrNotHeld):
		return "not_held"
	case errors.Is(err, ticketing.ErrInvalid):
		return "invalid_argument"
	case errors.Is(err, ticketing.ErrAuthFailed):
		return "auth_failed"
	case errors.Is(err, ticketing.ErrUnsupportedVersion):
		return "unsupported_version"
	case errors.Is(err, ticketing.ErrTLS):
		return "tls"
	case errors.Is(err, ticketing.ErrTimeout):
		return "timeout"
	case errors.Is(err, ticketing.ErrConnectionLost):
		return "connection_lost"
	case errors.Is(err, ticketing.ErrBusy):
		return "busy"
	case errors.Is(err, ticketing.ErrShuttingDown):
		return "shutting_down"
	case errors.Is(err, ticketing.ErrClosed):
		return "closed"
	case errors.Is(err, ticketing.ErrUnavailable):
		return "unavailable"
	}
	return "other"
}

// reason maps a lost reason onto DRIVER.md's names.
func reason(r ticketing.LostReason) string {
	switch r {
	case ticketing.ReasonExpired:
		return "expired"
	case ticketing.ReasonNotHeld:
		return "not_held"
	case ticketing.ReasonServerRestarted:
		return "server_restarted"
	case ticketing.ReasonServerStopping:
		return "server_stopping"
	}
	return string(r)
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

func (d *driver) client(name string) (*ticketing.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.clients[name]
	if c == nil {
		return nil, fmt.Errorf("no client %q", name)
	}
	return c, nil
}

func (d *driver) lock(name string) (*handle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.handles[name]
	if h == nil {
		return nil, fmt.Errorf("no lock %q", name)
	}
	return h, nil
}

func (cmd *command) key() (string, error) {
	if cmd.KeyHex != nil {
		b, err := hex.DecodeString(*cmd.KeyHex)
		if err != nil {
			return "", &badArg{"key_hex: " + err.Error()}
		}
		return string(b), nil
	}
	if cmd.Key == nil {
		return "", nil // the client refuses an empty key
	}
	return *cmd.Key, nil
}

// newHandle records a lock and reports its lost event once, unless forgotten first.
func (d *driver) newHandle(name string, lk *ticketing.Lock) {
	h := &handle{lk: lk, stop: make(chan struct{})}
	d.mu.Lock()
	d.handles[name] = h
	d.mu.Unlock()
	go func() {
		select {
		case <-lk.Lost():
			var lost *ticketing.LockLostError
			if errors.As(lk.Err(), &lost) {
				select {
				case <-h.stop:
				default:
					d.write(map[string]any{"event": "lost", "lock": name, "reason": reason(lost.Reason)})
				}
			}
		case <-h.stop:
		}
	}()
}

func (d *driver) acquire(ctx context.Context, cmd *command) (map[string]any, error) {
	c, err := d.client(cmd.Client)
	if err != nil {
		return nil, err
	}
	k, err := cmd.key()
	if err != nil {
		return nil, err
	}
	var opts []ticketing.AcquireOption
	if cmd.WaitMs != nil {
		opts = append(opts, ticketing.WithWaitTimeout(ms(*cmd.WaitMs)))
	}
	if cmd.KeepAlive {
		opts = append(opts, ticketing.WithKeepAlive())
	}
	if cmd.RefuseHeld {
		opts = append(opts, ticketing.WithRefuseHeld())
	}
	lk, err := c.Acquire(ctx, k, ms(cmd.LeaseMs), opts...)
	if err != nil {
		return nil, err
	}
	d.newHandle(cmd.Lock, lk)
	return map[string]any{"token": strconv.FormatUint(lk.Token(), 10), "lease_ms": lk.Lease().Milliseconds()}, nil
}

// handle runs every command but acquire and exit.
func (d *driver) handle(cmd *command) (map[string]any, error) {
	ctx := context.Background()
	switch cmd.Op {
	case "hello":
		return map[string]any{"language": "go", "client_version": ticketing.Version, "features": features}, nil

	case "connect":
		opts := []ticketing.Option{ticketing.WithEndpoints(cmd.Endpoints...)}
		if len(cmd.Token) > 0 && string(cmd.Token) != "null" {
			var tok string
			if err := json.Unmarshal(cmd.Token, &tok); err != nil {
				return nil, &badArg{"token: " + err.Error()}
			}
			opts = append(opts, ticketing.WithToken(tok))
		}
		if cmd.TLS != nil {
			cfg, err := tlsConfig(cmd.TLS)
			if err != nil {
				return nil, err
			}
			opts = append(opts, ticketing.WithTLS(cfg))
		}
		if cmd.RequestTimeoutMs != nil {
			opts = append(opts, ticketing.WithRequestTimeout(ms(*cmd.RequestTimeoutMs)))
		}
		if cmd.HeartbeatMs != nil {
			opts = append(opts, ticketing.WithHeartbeat(ms(*cmd.HeartbeatMs)))
		}
		if cmd.DialTimeoutMs != nil {
			opts = append(opts, ticketing.WithDialTimeout(ms(*cmd.DialTimeoutMs)))
		}
		c, err := ticketing.Dial(ctx, opts...)
		if err != nil {
			return nil, err
		}
		d.mu.Lock()
		old := d.clients[cmd.Client]
		d.clients[cmd.Client] = c
		d.mu.Unlock()
		if old != nil {
			old.Close()
		}
		id := c.SessionID()
		return map[string]any{"session_id": hex.EncodeToString(id[:])}, nil

	case "close":
		d.mu.Lock()
		c := d.clients[cmd.Client]
		delete(d.clients, cmd.Client)
		d.mu.Unlock()
		if c == nil {
			return nil, fmt.Errorf("no client %q", cmd.Client)
		}
		return nil, c.Close()

	case "try_acquire":
		c, err := d.client(cmd.Client)
		if err != nil {
			return nil, err
		}
		k, err := cmd.key()
		if err != nil {
			return nil, err
		}
		lk, err := c.TryAcquire(ctx, k, ms(cmd.LeaseMs))
		if err != nil {
			return nil, err
		}
		if lk == nil {
			return map[string]any{"acquired": false}, nil
		}
		d.newHandle(cmd.Lock, lk)
		return map[string]any{"acquired": true, "token": strconv.FormatUint(lk.Token(), 10)}, nil

	case "cancel":
		d.mu.Lock()
		cancel := d.acquires[cmd.Target]
		d.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		return nil, nil

	case "release":
		h, err := d.lock(cmd.Lock)
		if err != nil {
			return nil, err
		}
		if err := h.lk.Release(ctx); err != nil {
			return nil, err
		}
		h.forget()
		return nil, nil

	case "extend":
		h, err := d.lock(cmd.Lock)
		if err != nil {
			return nil, err
		}
		if err := h.lk.Extend(ctx, ms(cmd.LeaseMs)); err != nil {
			return nil, err
		}
		return map[string]any{"lease_ms": h.lk.Lease().Milliseconds()}, nil

	case "lock_state":
		h, err := d.lock(cmd.Lock)
		if err != nil {
			return nil, err
		}
		res := map[string]any{"lost": false, "token": strconv.FormatUint(h.lk.Token(), 10),
			"deadline_in_ms": float64(time.Until(h.lk.Deadline())) / float64(time.Millisecond)}
		var lost *ticketing.LockLostError
		if errors.As(h.lk.Err(), &lost) {
			res["lost"], res["reason"] = true, reason(lost.Reason)
		}
		return res, nil

	case "verify":
		h, err := d.lock(cmd.Lock)
		if err != nil {
			return nil, err
		}
		held, err := h.lk.Verify(ctx)
		if err != nil {
			return nil, err
		}
		return map[string]any{"held": held}, nil

	case "release_token":
		c, err := d.client(cmd.Client)
		if err != nil {
			return nil, err
		}
		k, err := cmd.key()
		if err != nil {
			return nil, err
		}
		var s string
		if err := json.Unmarshal(cmd.Token, &s); err != nil {
			return nil, &badArg{"token: want a decimal string: " + err.Error()}
		}
		token, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, &badArg{"token " + strconv.Quote(s) + " is not a 64-bit unsigned integer"}
		}
		return nil, c.Release(ctx, k, token)

	case "inspect":
		c, err := d.client(cmd.Client)
		if err != nil {
			return nil, err
		}
		k, err := cmd.key()
		if err != nil {
			return nil, err
		}
		info, err := c.Inspect(ctx, k)
		if err != nil {
			return nil, err
		}
		return map[string]any{"held": info.Held, "waiters": info.Waiters, "lease_left_ms": info.LeaseLeft.Milliseconds()}, nil

	case "ping":
		c, err := d.client(cmd.Client)
		if err != nil {
			return nil, err
		}
		return nil, c.Ping(ctx)

	case "with_lock":
		c, err := d.client(cmd.Client)
		if err != nil {
			return nil, err
		}
		k, err := cmd.key()
		if err != nil {
			return nil, err
		}
		return nil, c.WithLock(ctx, k, ms(cmd.LeaseMs), func(ctx context.Context, _ *ticketing.Lock) error {
			t := time.NewTimer(ms(cmd.HoldMs))
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})

	case "reset":
		d.mu.Lock()
		handles, clients := d.handles, d.clients
		d.handles, d.clients = map[string]*handle{}, map[string]*ticketing.Client{}
		d.mu.Unlock()
		for _, h := range handles {
			h.forget()
		}
		var wg sync.WaitGroup
		for _, c := range clients {
			wg.Add(1)
			go func() { defer wg.Done(); c.Close() }()
		}
		wg.Wait()
		return nil, nil
	}
	return nil, fmt.Errorf("unknown op %q", cmd.Op)
}

func tlsConfig(a *tlsArgs) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: a.ServerName}
	if a.CA != "" {
		pem, err := os.ReadFile(a.CA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate", a.CA)
		}
		cfg.RootCAs = pool
	}
	if a.Cert != "" || a.Key != "" {
		cert, err := tls.LoadX509KeyPair(a.Cert, a.Key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
