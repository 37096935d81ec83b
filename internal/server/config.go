package server

import (
	"crypto/tls"
	"fmt"
	"time"

	"github.com/ticketing/ticketing/internal/wire"
)

// Config is the server's configuration. The zero value is not valid; start from Default().
// cmd/ticketing maps each field to a TICKETING_* environment variable and a flag of the same name.
type Config struct {
	Addr    string      // listen address; default 127.0.0.1:7070 (loopback only)
	DataDir string      // holds the fencing-token high-water mark; default ./ticketing-data
	Token   string      // shared auth token; "" = no auth
	TLS     *tls.Config // nil = plain TCP

	MaxKeyLen        int           // default 256 bytes (<= 65535)
	MinLease         time.Duration // default 1ms
	MaxLease         time.Duration // default 24h (<= 2^32-1 ms)
	MaxConnections   int           // default 10,000
	MaxWaitersPerKey int           // default 10,000
	MaxWaiters       int           // default 1,000,000 in total
	MaxLocks         int           // distinct keys; default 1,000,000
	MaxInflight      int           // pending acquires per connection; default 4,096
	HandshakeTimeout time.Duration // default 5s
	WriteTimeout     time.Duration // a write that blocks longer closes the connection; default 30s
	MaxOutput        int           // bytes queued for a client that is not reading; default 4 MiB
	LockDelay        time.Duration // key unavailable after a lease expiry; default 0 (off)
	StartupGrace     time.Duration // no grants for this long after start; default 0 (off)
	ShutdownTimeout  time.Duration // graceful shutdown bound; default 10s
	TokenBlock       uint64        // tokens reserved per durable write; default 1<<20
}

// Default returns the defaults: a working single node on loopback with no configuration.
func Default() Config {
	return Config{
		Addr:             "127.0.0.1:7070",
		DataDir:          "ticketing-data",
		MaxKeyLen:        256,
		MinLease:         time.Millisecond,
		MaxLease:         24 * time.Hour,
		MaxConnections:   10_000,
		MaxWaitersPerKey: 10_000,
		MaxWaiters:       1_000_000,
		MaxLocks:         1_000_000,
		MaxInflight:      4096,
		HandshakeTimeout: 5 * time.Second,
		WriteTimeout:     30 * time.Second,
		MaxOutput:        4 << 20,
		ShutdownTimeout:  10 * time.Second,
		TokenBlock:       1 << 20,
	}
}

// Validate reports the first setting that is out of range.
func (c *Config) Validate() error {
	switch {
	case c.Addr == "":
		return fmt.Errorf("TICKETING_ADDR is empty")
	case c.DataDir == "":
		return fmt.Errorf("TICKETING_DATA_DIR is empty")
	case c.MaxKeyLen < 1 || c.MaxKeyLen > wire.MaxKeyLen:
		return fmt.Errorf("TICKETING_MAX_KEY_LEN %d outside 1..%d", c.MaxKeyLen, wire.MaxKeyLen)
	case c.MinLease < time.Millisecond:
		return fmt.Errorf("TICKETING_MIN_LEASE %v below 1ms", c.MinLease)
	case c.MaxLease < c.MinLease || c.MaxLease > time.Duration(wire.WaitForever-1)*time.Millisecond:
		return fmt.Errorf("TICKETING_MAX_LEASE %v outside %v..%v", c.MaxLease, c.MinLease, time.Duration(wire.WaitForever-1)*time.Millisecond)
	case c.MaxConnections < 1, c.MaxWaitersPerKey < 1, c.MaxWaiters < 1, c.MaxLocks < 1, c.MaxInflight < 1:
		return fmt.Errorf("connection, waiter, lock and in-flight limits must be at least 1")
	case c.HandshakeTimeout <= 0 || c.WriteTimeout <= 0 || c.ShutdownTimeout <= 0:
		return fmt.Errorf("timeouts must be positive")
	case c.MaxOutput < 64<<10:
		return fmt.Errorf("TICKETING_MAX_OUTPUT %d below 64 KiB", c.MaxOutput)
	case c.LockDelay < 0:
		return fmt.Errorf("TICKETING_LOCK_DELAY is negative")
	case c.StartupGrace < 0 || c.StartupGrace > c.MaxLease:
		return fmt.Errorf("TICKETING_STARTUP_GRACE %v outside 0..TICKETING_MAX_LEASE", c.StartupGrace)
	}
	return nil
}
