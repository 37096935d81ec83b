package store

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/clock"
)

func mustOpen(t *testing.T, dir string, opts Options) (*Store, State) {
	t.Helper()
	s, st, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, st
}

func TestPersistAndReopen(t *testing.T) {
	dir := t.TempDir()
	s, st := mustOpen(t, dir, Options{})
	if st.TokenLimit != 0 || st.HorizonBoot != 0 {
		t.Fatalf("fresh state %+v", st)
	}
	h := clock.Boottime() + int64(3*time.Second)
	if _, err := s.Persist(100, h, false); err != nil {
		t.Fatal(err)
	}
	// Neither goes down without force.
	if st, err := s.Persist(50, h-1, false); err != nil || st.TokenLimit != 100 || st.HorizonBoot != h {
		t.Fatalf("%+v %v", st, err)
	}
	s.Close()
	s2, st2 := mustOpen(t, dir, Options{})
	if st2.TokenLimit != 100 || st2.HorizonBoot != h || st2.BootID != BootID() {
		t.Fatalf("reopened %+v", st2)
	}
	w := StartupWait(st2, BootID(), clock.Boottime(), clock.Wall())
	if w <= 2*time.Second || w > 3*time.Second {
		t.Fatalf("wait on the same boot %v, want about 3s", w)
	}
	// A graceful stop lowers the horizon with force.
	now := clock.Boottime()
	if st, err := s2.Persist(100, now, true); err != nil || st.HorizonBoot != now {
		t.Fatalf("%+v %v", st, err)
	}
	if w := StartupWait(s2.State(), BootID(), clock.Boottime(), clock.Wall()); w != 0 {
		t.Fatalf("wait after a forced horizon of now: %v", w)
	}
}

// The cluster mark survives a reopen and later writes, and can be cleared.
func TestClusterMark(t *testing.T) {
	dir := t.TempDir()
	s, st := mustOpen(t, dir, Options{})
	if st.Cluster {
		t.Fatal("a new directory is marked")
	}
	if err := s.MarkCluster(true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Persist(7, 0, false); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, st = mustOpen(t, dir, Options{})
	if !st.Cluster || st.TokenLimit != 7 {
		t.Fatalf("reopened %+v", st)
	}
	if err := s.MarkCluster(false); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, st = mustOpen(t, dir, Options{}); st.Cluster {
		t.Fatal("the mark was not cleared")
	}
}

func TestStartupWaitAfterReboot(t *testing.T) {
	st := State{BootID: "old-boot", BootWritten: 1000e9, HorizonBoot: 1030e9, WallWritten: 5000e9, HorizonWall: 5030e9}
	// 10 s after boot, wall clock says 5 s after the write: wait 25 s + margin by the wall,
	// 30 - 10 = 20 s by the span: the smaller, 20 s.
	if w := StartupWait(st, "new-boot", 10e9, 5005e9); w != 20*time.Second {
		t.Fatalf("wait %v, want 20s", w)
	}
	// The wall clock says the horizon passed long ago: only the margin remains.
	if w := StartupWait(st, "new-boot", 1e9, 9000e9); w != WallMargin {
		t.Fatalf("wait %v, want the margin", w)
	}
	// Uptime beyond the span: nothing left whatever the wall clock says.
	if w := StartupWait(st, "new-boot", 40e9, 5001e9); w != 0 {
		t.Fatalf("wait %v, want 0", w)
	}
	if w := StartupWait(State{}, "x", 1, 1); w != 0 {
		t.Fatal("nothing recorded must mean no wait")
	}
}

// A directory with the lock file but no state file is a lost store: refused, unless a token
// floor is given. Deleting the state file must never restart tokens at 1.
func TestLostStoreRefused(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, Options{})
	if _, err := s.Persist(1<<20, 0, false); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.Remove(filepath.Join(dir, fileName)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(dir, Options{}); !errors.Is(err, ErrLostStore) {
		t.Fatalf("lost store opened: %v", err)
	}
	s2, st := mustOpen(t, dir, Options{MinToken: 5 << 20})
	if st.TokenLimit != 5<<20 {
		t.Fatalf("floor not applied: %+v", st)
	}
	s2.Close()
}

func TestLegacyTokenFileMigrates(t *testing.T) {
	dir := t.TempDir()
	legacy := make([]byte, legacySize)
	copy(legacy, legacyMagic)
	legacy[4] = 1
	legacy[8] = 0x2a // limit 42
	sum := crcOf(legacy[:16])
	legacy[16], legacy[17], legacy[18], legacy[19] = byte(sum), byte(sum>>8), byte(sum>>16), byte(sum>>24)
	os.WriteFile(filepath.Join(dir, legacyName), legacy, 0o600)
	os.WriteFile(filepath.Join(dir, lockName), nil, 0o600)
	_, st := mustOpen(t, dir, Options{})
	if st.TokenLimit != 42 {
		t.Fatalf("legacy limit not read: %+v", st)
	}
}

func TestCorruptRefused(t *testing.T) {
	dir := t.TempDir()
	s, _ := mustOpen(t, dir, Options{})
	s.Persist(7, 0, false)
	s.Close()
	p := filepath.Join(dir, fileName)
	b, _ := os.ReadFile(p)
	b[10] ^= 0xff
	os.WriteFile(p, b, 0o600)
	if _, _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt state opened: %v", err)
	}
}

func TestSecondOpenLocked(t *testing.T) {
	dir := t.TempDir()
	mustOpen(t, dir, Options{})
	if _, _, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
}

// TestCrashRestart runs a child that hands out tokens only below the durable limit (as the
// server does), printing each, and SIGKILLs itself mid-way; every token after a restart must be
// above every token printed before.
func TestCrashRestart(t *testing.T) {
	dir := t.TempDir()
	var maxTok uint64
	for round, n := range []int{0, 1, 5, 9, 40, 1000, 3} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "STORE_CRASH_DIR="+dir, "STORE_CRASH_N="+strconv.Itoa(n))
		out, err := cmd.Output()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("round %d: child: %v", round, err)
		}
		if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child did not die by SIGKILL: %v\n%s", round, err, ee.Stderr)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		count := 0
		for sc.Scan() {
			tok, err := strconv.ParseUint(sc.Text(), 10, 64)
			if err != nil {
				t.Fatalf("child output %q", sc.Text())
			}
			if tok <= maxTok {
				t.Fatalf("round %d: token %d not above %d from before the crash", round, tok, maxTok)
			}
			maxTok = max(maxTok, tok)
			count++
		}
		if count != n {
			t.Fatalf("round %d: %d tokens, want %d", round, count, n)
		}
	}
}

// TestMain runs crashChild instead of the tests when TestCrashRestart starts this binary.
func TestMain(m *testing.M) {
	if dir := os.Getenv("STORE_CRASH_DIR"); dir != "" {
		crashChild(dir)
	}
	os.Exit(m.Run())
}

func crashChild(dir string) {
	n, _ := strconv.Atoi(os.Getenv("STORE_CRASH_N"))
	s, st, err := Open(dir, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	last, limit := st.TokenLimit, st.TokenLimit
	for i := 0; i < n; i++ {
		if last == limit {
			st, err := s.Persist(limit+7, 0, false)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(3)
			}
			limit = st.TokenLimit
		}
		last++
		os.Stdout.WriteString(strconv.FormatUint(last, 10) + "\n")
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func crcOf(b []byte) uint32 { return crc32Checksum(b) }
