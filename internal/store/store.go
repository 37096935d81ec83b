// Package store keeps a single node's durable state: the fencing-token high-water mark and the
// restart horizon, in one small file written atomically (temporary file, fsync, rename, fsync
// of the directory).
//
// Tokens: the file holds a limit L such that no token above L has ever been handed out. The
// server reserves blocks ahead (writes L+block before handing out tokens up to it), so after
// any restart — a crash, SIGKILL or power loss included — the next token is above every token
// handed out before.
//
// Horizon: the file holds an instant past which no lease granted, handed off or extended by
// the process that wrote it can run, measured on CLOCK_BOOTTIME of the boot that wrote it (and,
// for a start after a reboot, on the wall clock). It too is recorded ahead, never once per
// grant. A restarted node computes from it how long it must wait before it grants anything an
// earlier holder could still legitimately hold (StartupWait).
//
// Safety of the directory itself: a directory that holds the lock file but no state file
// looks like a lost store (the state file was deleted, or the directory restored without it);
// Open refuses it unless the operator gives a token floor (MinToken) known to be above every
// token ever issued from it.
//
// Cluster nodes: the file also says whether the directory has served a cluster node
// (State.Cluster). A cluster's tokens and leases live in its replicated log, not here (a node
// records the last token it applied now and then, a lower bound), so a directory that served
// a cluster node must not start a single node, nor a new cluster, as if it were empty: the
// server refuses that without an operator's token floor (internal/server).
package store

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
	"time"

	"github.com/ticketing/ticketing/internal/clock"
)

const (
	fileName   = "ticketing.state"
	lockName   = "tokens.lock"
	legacyName = "tokens.hwm" // written by earlier versions: the token limit only

	// File format, 72 bytes, little endian:
	//   0  4  magic "TKST"
	//   4  4  version (1)
	//   8  8  token limit
	//  16 16  boot id (ASCII of the first 16 bytes of the kernel's boot id, zero padded)
	//  32  8  boottime when written (ns)
	//  40  8  horizon on that boot's CLOCK_BOOTTIME (ns; 0 = nothing recorded)
	//  48  8  wall clock when written (Unix ns)
	//  56  8  horizon on the wall clock (Unix ns)
	//  64  4  flags: bit 0, the directory has served a cluster node (earlier versions wrote 0)
	//  68  4  CRC-32C (Castagnoli) of bytes 0..67
	fileSize    = 72
	fileMagic   = "TKST"
	fileVersion = 1

	legacySize  = 20
	legacyMagic = "TKHW"

	flagCluster = 1

	// WallMargin is added to the wall-clock estimate of the wait after a reboot (clocks of two
	// boots are compared only through the wall clock, which NTP may step).
	WallMargin = 2 * time.Second
)

var (
	// ErrCorrupt is wrapped by Open's error when the state file exists but cannot be trusted.
	// Open never falls back to 0: an operator must look.
	ErrCorrupt = errors.New("store: corrupt state file")
	// ErrLocked: another process has the directory open.
	ErrLocked = errors.New("store: data directory in use by another process")
	// ErrLostStore: the lock file is there but the state file is not.
	ErrLostStore = errors.New("store: data directory has a lock file but no state file (a lost store: tokens could go backwards)")

	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// State is what the file records.
type State struct {
	TokenLimit  uint64 // no token above this was ever handed out
	BootID      string // boot that wrote it
	BootWritten int64  // CLOCK_BOOTTIME at the write
	HorizonBoot int64  // no lease runs past this instant on that boot's CLOCK_BOOTTIME (0: none recorded)
	WallWritten int64  // wall clock at the write
	HorizonWall int64  // the same instant on the wall clock
	// Cluster: the directory has served a cluster node. TokenLimit is then only a lower bound
	// of the cluster's tokens (what this node applied when it last recorded it).
	Cluster bool
}

// Store is an open data directory. Persist is safe for concurrent use (writes are serialised).
type Store struct {
	dir  string
	path string
	lock *os.File

	mu    sync.Mutex
	state State
	// persist writes s durably; tests replace it to simulate a failing or slow disk.
	persist func(s *State) error
}

// Options for Open.
type Options struct {
	// MinToken: tokens handed out start above this (a recovery floor for a lost store; it is
	// also applied when the stored limit is lower).
	MinToken uint64
}

// Open opens (creating it if needed) the data directory dir and reads its state. A missing
// state file in a new directory reads as zero; a lock file without a state file is
// ErrLostStore unless opts.MinToken is set.
func Open(dir string, opts Options) (*Store, State, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, State{}, fmt.Errorf("store: %w", err)
	}
	// Make the directory entry itself durable: if it vanished in a power loss, the missing
	// file would read as a new store.
	if err := syncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
		return nil, State{}, fmt.Errorf("store: %w", err)
	}
	_, lockErr := os.Stat(filepath.Join(dir, lockName))
	hadLock := lockErr == nil
	s := &Store{dir: dir, path: filepath.Join(dir, fileName)}
	s.persist = s.write
	if !hadLock {
		// A new directory: the state file exists before the lock file ever does, so a crash
		// right after this point never leaves a lock file without a state file.
		if _, found, err := readState(s.path); err == nil && !found {
			if _, legacy, _ := readLegacy(filepath.Join(dir, legacyName)); !legacy {
				if err := s.write(&State{TokenLimit: opts.MinToken}); err != nil {
					return nil, State{}, fmt.Errorf("store: %w", err)
				}
			}
		}
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, State{}, err
	}
	s.lock = lock
	st, found, err := readState(s.path)
	if err != nil {
		lock.Close()
		return nil, State{}, err
	}
	if !found {
		limit, legacy, err := readLegacy(filepath.Join(dir, legacyName))
		if err != nil {
			lock.Close()
			return nil, State{}, err
		}
		st = State{TokenLimit: limit}
		if !legacy && hadLock && opts.MinToken == 0 {
			lock.Close()
			return nil, State{}, fmt.Errorf("%w: %s; restore %s, or start with a token floor (--min-token) above every token ever issued from it", ErrLostStore, dir, fileName)
		}
	}
	st.TokenLimit = max(st.TokenLimit, opts.MinToken)
	s.state = st
	return s, st, nil
}

// Dir returns the data directory.
func (s *Store) Dir() string { return s.dir }

// State returns the state last written (or read at Open).
func (s *Store) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// SetPersistHook replaces the durable write, for tests that simulate a slow or failing disk;
// nil restores the real one.
func (s *Store) SetPersistHook(f func(st *State) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == nil {
		f = s.write
	}
	s.persist = f
}

// Persist durably records tokenLimit and horizonBoot (a CLOCK_BOOTTIME instant of this boot;
// 0 records no horizon). Neither ever goes down: a lower value keeps the recorded one, except
// that Persist with force lowers the horizon (a graceful stop recording the leases that really
// remain). It returns the state written.
func (s *Store) Persist(tokenLimit uint64, horizonBoot int64, force bool) (State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state
	st.TokenLimit = max(st.TokenLimit, tokenLimit)
	bootNow, wallNow := clock.Boottime(), clock.Wall()
	bootID := BootID()
	if st.BootID != bootID && st.HorizonBoot != 0 {
		// The recorded horizon is from another boot: carry what is left of it over.
		st.HorizonBoot = bootNow + int64(StartupWait(st, bootID, bootNow, wallNow))
	}
	if force || horizonBoot > st.HorizonBoot {
		st.HorizonBoot = horizonBoot
	}
	st.BootID, st.BootWritten, st.WallWritten = bootID, bootNow, wallNow
	st.HorizonWall = 0
	if st.HorizonBoot != 0 {
		st.HorizonWall = wallNow + (st.HorizonBoot - bootNow)
	}
	if err := s.persist(&st); err != nil {
		return s.state, err
	}
	s.state = st
	return st, nil
}

// MarkCluster durably records whether the directory serves a cluster node (see State.Cluster).
func (s *Store) MarkCluster(on bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state.Cluster == on {
		return nil
	}
	st := s.state
	st.Cluster = on
	if err := s.persist(&st); err != nil {
		return err
	}
	s.state = st
	return nil
}

// StartupWait is how long a node starting now must wait before granting anything, given the
// recorded state: on the same boot, until the recorded horizon; after a reboot, the smaller of
// the wall clock's estimate (plus WallMargin) and the recorded span minus the uptime (the time
// since boot is a lower bound of the time since the write). Zero when nothing is recorded or
// the horizon has passed. Computed once at start; the caller counts it down on CLOCK_BOOTTIME.
func StartupWait(st State, bootID string, bootNow, wallNow int64) time.Duration {
	if st.HorizonBoot == 0 {
		return 0
	}
	if bootID != "" && st.BootID == bootID {
		return time.Duration(max(st.HorizonBoot-bootNow, 0))
	}
	span := st.HorizonBoot - st.BootWritten
	bySpan := max(span-bootNow, 0)
	byWall := int64(math.MaxInt64)
	if st.HorizonWall != 0 {
		byWall = max(st.HorizonWall-wallNow, 0) + int64(WallMargin)
	}
	return time.Duration(min(bySpan, byWall))
}

// BootID is the kernel's boot id as the state file records it (its first 16 characters).
func BootID() string {
	id := clock.BootID()
	if len(id) > 16 {
		id = id[:16]
	}
	return id
}

// Close releases the directory lock. It writes nothing.
func (s *Store) Close() error { return s.lock.Close() }

func readState(path string) (State, bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return State{}, false, nil
	}
	if err != nil {
		return State{}, false, fmt.Errorf("store: %w", err)
	}
	if len(data) != fileSize {
		return State{}, false, fmt.Errorf("%w: %s: %d bytes, want %d", ErrCorrupt, path, len(data), fileSize)
	}
	if string(data[0:4]) != fileMagic {
		return State{}, false, fmt.Errorf("%w: %s: bad magic %q", ErrCorrupt, path, data[0:4])
	}
	if sum := crc32.Checksum(data[:68], castagnoli); sum != binary.LittleEndian.Uint32(data[68:72]) {
		return State{}, false, fmt.Errorf("%w: %s: checksum mismatch", ErrCorrupt, path)
	}
	if v := binary.LittleEndian.Uint32(data[4:8]); v != fileVersion {
		return State{}, false, fmt.Errorf("%w: %s: unsupported version %d", ErrCorrupt, path, v)
	}
	le := binary.LittleEndian
	id := data[16:32]
	n := 0
	for n < len(id) && id[n] != 0 {
		n++
	}
	return State{
		TokenLimit:  le.Uint64(data[8:]),
		BootID:      string(id[:n]),
		BootWritten: int64(le.Uint64(data[32:])),
		HorizonBoot: int64(le.Uint64(data[40:])),
		WallWritten: int64(le.Uint64(data[48:])),
		HorizonWall: int64(le.Uint64(data[56:])),
		Cluster:     le.Uint32(data[64:])&flagCluster != 0,
	}, true, nil
}

// readLegacy reads an earlier version's tokens.hwm; found false when absent.
func readLegacy(path string) (uint64, bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("store: %w", err)
	}
	if len(data) != legacySize || string(data[0:4]) != legacyMagic ||
		crc32.Checksum(data[:16], castagnoli) != binary.LittleEndian.Uint32(data[16:20]) {
		return 0, false, fmt.Errorf("%w: %s", ErrCorrupt, path)
	}
	return binary.LittleEndian.Uint64(data[8:16]), true, nil
}

func encode(st *State) []byte {
	le := binary.LittleEndian
	buf := make([]byte, fileSize)
	copy(buf[0:4], fileMagic)
	le.PutUint32(buf[4:], fileVersion)
	le.PutUint64(buf[8:], st.TokenLimit)
	copy(buf[16:32], st.BootID) // the first 16 bytes of the id tell boots apart
	le.PutUint64(buf[32:], uint64(st.BootWritten))
	le.PutUint64(buf[40:], uint64(st.HorizonBoot))
	le.PutUint64(buf[48:], uint64(st.WallWritten))
	le.PutUint64(buf[56:], uint64(st.HorizonWall))
	if st.Cluster {
		le.PutUint32(buf[64:], flagCluster)
	}
	le.PutUint32(buf[68:], crc32.Checksum(buf[:68], castagnoli))
	return buf
}

// write durably replaces the state file: temporary file, fsync, rename over the old file,
// fsync of the directory.
func (s *Store) write(st *State) error {
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(encode(st))
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
	if err := os.Rename(tmp, s.path); err != nil {
		return err
	}
	return syncDir(s.dir)
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

func crc32Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
