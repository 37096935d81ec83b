//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package tokens

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// TestCrashRestart runs a child process that hands out tokens (printing each
// one as soon as Next returns it) and SIGKILLs itself, then checks that every
// token after a restart is larger than every token printed before.
func TestCrashRestart(t *testing.T) {
	dir := t.TempDir()
	var max uint64
	for round, n := range []int{0, 1, 5, 6, 7, 8, 9, 40, 1000, 3, 2500} {
		cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.v=false")
		cmd.Env = append(os.Environ(), "TOKENS_CRASH_DIR="+dir, "TOKENS_CRASH_N="+strconv.Itoa(n), "TOKENS_CRASH_WORKERS="+strconv.Itoa(1+round%3))
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
		roundMax := uint64(0)
		for sc.Scan() {
			tok, err := strconv.ParseUint(sc.Text(), 10, 64)
			if err != nil {
				t.Fatalf("child output %q", sc.Text())
			}
			if tok <= max {
				t.Fatalf("round %d: token %d not above %d from before the crash", round, tok, max)
			}
			roundMax = maxU(roundMax, tok)
			count++
		}
		if count != n {
			t.Fatalf("round %d: %d tokens, want %d", round, count, n)
		}
		max = maxU(max, roundMax)
	}
	a := mustOpen(t, dir, 8)
	defer a.Close()
	if tok := a.Next(); tok <= max {
		t.Fatalf("token %d after crashes, not above %d", tok, max)
	}
}

// TestMain runs crashChild instead of the tests when TestCrashRestart starts this test binary as
// its child (TOKENS_CRASH_DIR set).
func TestMain(m *testing.M) {
	if dir := os.Getenv("TOKENS_CRASH_DIR"); dir != "" {
		crashChild(dir)
	}
	os.Exit(m.Run())
}

// crashChild hands out TOKENS_CRASH_N tokens from TOKENS_CRASH_WORKERS goroutines, printing each,
// then SIGKILLs itself without closing the allocator.
func crashChild(dir string) {
	n, _ := strconv.Atoi(os.Getenv("TOKENS_CRASH_N"))
	workers, _ := strconv.Atoi(os.Getenv("TOKENS_CRASH_WORKERS"))
	a, err := Open(dir, 7)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				tok := a.Next()
				// One write(2) per line: lines from several goroutines
				// never interleave on the pipe.
				os.Stdout.WriteString(strconv.FormatUint(tok, 10) + "\n")
			}
		}()
	}
	wg.Wait()
	// Crash: no Close, background reservation possibly in flight.
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
