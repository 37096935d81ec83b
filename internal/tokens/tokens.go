// Package tokens hands out fencing tokens that only ever grow, across process
// restarts included.
//
// The guarantee rests on a durable high-water mark: the file dir/tokens.hwm
// holds a limit L such that no token greater than L has ever been handed out.
// Tokens are reserved in blocks: before any token above the current durable
// limit is handed out, a new limit is written (temporary file, fsync, rename,
// fsync of the directory). After a restart, even one without Close (a crash,
// SIGKILL, power loss), the first token is L+1 for the L on disk, which is
// larger than every token handed out before. Tokens are wasted at every
// restart (up to one block), never repeated.
package tokens

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBlock is the block size used when Open is given 0.
const DefaultBlock = 1 << 20

const (
	fileName = "tokens.hwm"
	lockName = "tokens.lock"

	// File format, 20 bytes, little endian:
	//   0  4  magic "TKHW"
	//   4  4  version (1)
	//   8  8  limit
	//  16  4  CRC-32C (Castagnoli) of bytes 0..15
	fileSize    = 20
	fileMagic   = "TKHW"
	fileVersion = 1

	maxBackoff = time.Second
)

var (
	// ErrCorrupt is wrapped by Open's error when tokens.hwm exists but cannot
	// be trusted (wrong size, magic or checksum). Open never falls back to 0:
	// an operator must look (restore it, or write a limit known to be high
	// enough).
	ErrCorrupt = errors.New("tokens: corrupt high-water mark file")
	// ErrLocked is returned by Open when another Allocator (in this or another
	// process) has the directory open.
	ErrLocked = errors.New("tokens: directory in use by another allocator")
	// ErrExhausted is reported when the limit cannot grow any further (the
	// 64-bit token space is used up).
	ErrExhausted = errors.New("tokens: token space exhausted")

	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// Allocator hands out strictly increasing fencing tokens (the first is 1 on a
// fresh directory) and implements locktable.TokenSource.
//
// Next is safe for concurrent use and, in the common case, is one atomic
// compare-and-swap with no allocation and no I/O. When the counter passes
// half of the current block, the next block is reserved by a background
// goroutine (at most one at a time), so Next normally never waits for the
// disk.
//
// Persist failures: Next never hands out a token that is not covered by a
// durable limit. If the counter reaches the durable limit before the next
// reservation has been written, Next blocks until it is. A failing write is
// retried in the background forever, with exponential backoff from 1ms to 1s;
// meanwhile Err reports the failure (so health checks and logs can show it)
// and every Next that needs a new block blocks. Returning a token that might
// repeat after a restart, or a sentinel such as 0 (which would make tokens
// ambiguous for Release), would break fencing; stalling grants while the disk
// is broken is the only safe answer, and it heals by itself when the disk
// does.
type Allocator struct {
	last    atomic.Uint64 // last token handed out
	limit   atomic.Uint64 // durable limit: every token <= limit is covered on disk
	trigger atomic.Uint64 // reserve the next block once last reaches this
	busy    atomic.Bool   // a reservation goroutine is running
	closedA atomic.Bool

	block uint64
	dir   string
	path  string
	lock  *os.File

	mu      sync.Mutex
	cond    sync.Cond // signalled when limit grows, or on Close
	err     error     // last persist error; nil after a success
	closed  bool
	quit    chan struct{}
	wg      sync.WaitGroup
	persist func(limit uint64) error // writes the limit durably; replaced by tests
}

// Open opens (creating dir if needed) the token store in dir, reads the
// stored limit L (0 if the file is missing; an error wrapping ErrCorrupt if
// it is damaged) and durably records L+block before returning, so the first
// Next returns L+1 without waiting. block 0 means DefaultBlock. The directory
// is locked (flock) until Close: a second Open of the same directory fails
// with ErrLocked.
func Open(dir string, block uint64) (*Allocator, error) {
	if block == 0 {
		block = DefaultBlock
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	// Make the directory entry itself durable: if it vanished in a power
	// loss, the missing file would read as limit 0.
	if err := syncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	a := &Allocator{
		block: block,
		dir:   dir,
		path:  filepath.Join(dir, fileName),
		lock:  lock,
		quit:  make(chan struct{}),
	}
	a.cond.L = &a.mu
	a.persist = a.writeLimit

	stored, err := readLimit(a.path)
	if err != nil {
		lock.Close()
		return nil, err
	}
	target, ok := a.nextLimit(stored)
	if !ok {
		lock.Close()
		return nil, ErrExhausted
	}
	if err := a.persist(target); err != nil {
		lock.Close()
		return nil, fmt.Errorf("tokens: persisting high-water mark: %w", err)
	}
	a.last.Store(stored)
	a.limit.Store(target)
	a.trigger.Store(target - block/2)
	return a, nil
}

// nextLimit is limit+block, saturated; ok is false if it cannot grow.
func (a *Allocator) nextLimit(limit uint64) (uint64, bool) {
	if limit == math.MaxUint64 {
		return limit, false
	}
	if a.block > math.MaxUint64-limit {
		return math.MaxUint64, true
	}
	return limit + a.block, true
}

// Next returns the next token: larger than every token returned before by
// this Allocator and by any Allocator on the same directory before it. It
// blocks only while the next block is not yet durable (see Allocator). Next
// must not be called after Close: it panics then, as it can no longer make a
// token durable.
func (a *Allocator) Next() uint64 {
	for {
		if a.closedA.Load() {
			panic("tokens: Next called after Close")
		}
		cur := a.last.Load()
		if cur < a.limit.Load() {
			if !a.last.CompareAndSwap(cur, cur+1) {
				continue
			}
			if cur+1 >= a.trigger.Load() && !a.busy.Load() {
				a.mu.Lock()
				if a.last.Load() >= a.trigger.Load() {
					a.startReserve()
				}
				a.mu.Unlock()
			}
			return cur + 1
		}
		a.waitDurable()
	}
}

// waitDurable blocks until the durable limit is above the counter, or Close.
func (a *Allocator) waitDurable() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.last.Load() >= a.limit.Load() && !a.closed {
		a.startReserve()
		a.cond.Wait()
	}
}

// startReserve starts the background reservation of the next block unless
// one is running. a.mu is held.
func (a *Allocator) startReserve() {
	if a.busy.Load() || a.closed {
		return
	}
	target, ok := a.nextLimit(a.limit.Load())
	if !ok {
		a.err = ErrExhausted
		return
	}
	a.busy.Store(true)
	a.wg.Add(1)
	go a.reserve(target)
}

// reserve writes target until it succeeds (then publishes it as the durable
// limit) or the Allocator is closed.
func (a *Allocator) reserve(target uint64) {
	defer a.wg.Done()
	backoff := time.Millisecond
	for {
		a.mu.Lock()
		persist := a.persist
		a.mu.Unlock()
		err := persist(target)

		a.mu.Lock()
		if err == nil {
			a.limit.Store(target)
			a.trigger.Store(target - a.block/2)
			a.err = nil
			a.busy.Store(false)
			a.cond.Broadcast()
			a.mu.Unlock()
			return
		}
		a.err = fmt.Errorf("tokens: persisting high-water mark %d: %w", target, err)
		if a.closed {
			a.busy.Store(false)
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()

		timer := time.NewTimer(backoff)
		select {
		case <-timer.C:
		case <-a.quit:
			timer.Stop()
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// Last returns the last token handed out, 0 if none (on a fresh directory), or
// the stored limit L after Open if Next has not been called yet.
func (a *Allocator) Last() uint64 { return a.last.Load() }

// Err returns the error of the most recent failed attempt to persist a new
// limit, or nil if the most recent attempt succeeded (or none failed).
func (a *Allocator) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// Close stops the background reservation (waiting for a write already under
// way, so nothing is written after Close returns) and releases the directory
// lock. It persists nothing: tokens already reserved but not handed out are
// simply skipped by the next Open. A Next blocked waiting for a reservation
// panics. Close is idempotent.
func (a *Allocator) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.closedA.Store(true)
	close(a.quit)
	a.cond.Broadcast()
	a.mu.Unlock()
	a.wg.Wait()
	return a.lock.Close()
}

// readLimit reads the stored limit; 0 if the file does not exist.
func readLimit(path string) (uint64, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("tokens: %w", err)
	}
	if len(data) != fileSize {
		return 0, fmt.Errorf("%w: %s: %d bytes, want %d", ErrCorrupt, path, len(data), fileSize)
	}
	if string(data[0:4]) != fileMagic {
		return 0, fmt.Errorf("%w: %s: bad magic %q", ErrCorrupt, path, data[0:4])
	}
	if sum := crc32.Checksum(data[:16], castagnoli); sum != binary.LittleEndian.Uint32(data[16:20]) {
		return 0, fmt.Errorf("%w: %s: checksum mismatch", ErrCorrupt, path)
	}
	if v := binary.LittleEndian.Uint32(data[4:8]); v != fileVersion {
		return 0, fmt.Errorf("%w: %s: unsupported version %d", ErrCorrupt, path, v)
	}
	return binary.LittleEndian.Uint64(data[8:16]), nil
}

func encodeLimit(limit uint64) []byte {
	buf := make([]byte, fileSize)
	copy(buf[0:4], fileMagic)
	binary.LittleEndian.PutUint32(buf[4:8], fileVersion)
	binary.LittleEndian.PutUint64(buf[8:16], limit)
	binary.LittleEndian.PutUint32(buf[16:20], crc32.Checksum(buf[:16], castagnoli))
	return buf
}

// writeLimit durably replaces the stored limit: temporary file, fsync,
// rename over the old file, fsync of the directory.
func (a *Allocator) writeLimit(limit uint64) error {
	tmp := a.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(encodeLimit(limit))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, a.path); err != nil {
		return err
	}
	return syncDir(a.dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
