//go:build unix

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
	"github.com/ticketing/ticketing/internal/testserver"
)

// Tests of `ticketing lock` that need Unix signals and process groups.

// waitFile waits (bounded) until path exists and returns its content.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		if b, err := os.ReadFile(path); err == nil {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// alive reports whether pid is a live process (a zombie counts as gone).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil // no /proc: best effort
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestCLILockForwardsSignals(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{})
	c := dialT(t, srv.Addr)
	out := filepath.Join(t.TempDir(), "child")
	self, _ := os.Executable()
	cmd, _, errb := cliCmd(t, []string{"TICKETING_ADDR=" + srv.Addr, "TICKETING_TEST_CHILD=sleep", "TICKETING_TEST_OUT=" + out},
		"lock", "sig", "--lease", "2s", "--", self)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	waitFile(t, out)
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(bound):
		cmd.Process.Kill()
		t.Fatalf("lock did not exit after SIGTERM; stderr:\n%s", errb)
	}
	if code := cmd.ProcessState.ExitCode(); code != 143 {
		t.Errorf("exit %d, want the command's 143; stderr:\n%s", code, errb)
	}
	waitFile(t, out+".term")
	lk, err := c.TryAcquire(ctxT(t), "sig", time.Second)
	if err != nil {
		t.Fatalf("not released after a forwarded signal: %v", err)
	}
	lk.Release(ctxT(t))
}

// TestCLILockStopsCommandBeforeHandoff is the guarantee of `ticketing lock`: when the CLI can no
// longer reach the server (a partition between it and the server), the command is stopped before
// the server can grant the lock to anyone else. A proxy that the test cuts sits between the CLI
// and the server; a second client, direct to the server, waits on the key; the test records, in
// its own clock, when the command's process is gone and when the second client is granted.
func TestCLILockStopsCommandBeforeHandoff(t *testing.T) {
	for _, mode := range []string{"sleep", "stubborn"} {
		t.Run(mode, func(t *testing.T) {
			srv := testserver.Start(t, testserver.Config{})
			proxy := testserver.NewProxy(t, srv.Addr)
			c := dialT(t, srv.Addr)
			out := filepath.Join(t.TempDir(), "child")
			self, _ := os.Executable()
			cmd, _, errb := cliCmd(t, []string{"TICKETING_TEST_CHILD=" + mode, "TICKETING_TEST_OUT=" + out},
				"lock", "guarded", "--addr", proxy.Addr, "--timeout", "1s", "--lease", "1500ms", "--kill-grace", "600ms", "--", self)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { cmd.Wait(); close(exited) }()
			defer func() {
				select {
				case <-exited:
				default:
					cmd.Process.Kill()
					<-exited
				}
			}()
			pid, err := strconv.Atoi(waitFile(t, out))
			if err != nil {
				t.Fatal(err)
			}

			// The second client queues on the key (its grant time is taken when Acquire returns,
			// which is no earlier than the server's grant).
			type grant struct {
				at  time.Time
				err error
				lk  *ticketing.Lock
			}
			granted := make(chan grant, 1)
			go func() {
				lk, err := c.Acquire(ctxT(t), "guarded", time.Minute)
				granted <- grant{time.Now(), err, lk}
			}()
			// Watch the command's process in this process's clock: lastAlive is the last time it was
			// seen running, gone the first time it was seen gone.
			var lastAlive atomic.Int64
			gone := make(chan time.Time, 1)
			stopWatch := make(chan struct{})
			defer close(stopWatch)
			go func() {
				for {
					before := time.Now() // seen running: at least until before
					if !alive(pid) {
						gone <- time.Now() // seen gone: at the latest now
						return
					}
					lastAlive.Store(before.UnixNano())
					select {
					case <-stopWatch:
						return
					case <-time.After(200 * time.Microsecond):
					}
				}
			}()

			// Let keep-alive run for more than a lease, then partition the CLI from the server. (On
			// a badly overloaded machine the CLI may miss its extends and stop the command before
			// the cut; the checks below hold all the same.)
			var g grant
			var early bool
			select {
			case g = <-granted:
				early = true
			case <-time.After(2 * time.Second):
			}
			cutAt := time.Now()
			proxy.Cut()
			if early {
				t.Logf("the CLI lost the lock before the cut (overloaded machine?)")
			} else {
				select {
				case g = <-granted:
				case <-time.After(bound):
					t.Fatal("second client never granted")
				}
			}
			if g.err != nil {
				t.Fatal(g.err)
			}
			defer g.lk.Release(context.Background())
			// The command must be gone when the grant is seen, and must not have been seen running
			// at or after the moment of the grant. (Both clocks here lag the events they time by
			// scheduling delays; these two checks cannot be fooled by that lag.)
			if alive(pid) {
				t.Fatalf("second client granted %v after the cut while the command (pid %d) still runs; lock's stderr:\n%s", g.at.Sub(cutAt), pid, errb)
			}
			var goneAt time.Time
			select {
			case goneAt = <-gone:
			case <-time.After(bound):
				t.Fatal("process watcher stuck")
			}
			if last := time.Unix(0, lastAlive.Load()); !last.Before(g.at) {
				t.Fatalf("command seen running %v after the cut, at or after the second client's grant at %v; lock's stderr:\n%s", last.Sub(cutAt), g.at.Sub(cutAt), errb)
			}
			t.Logf("cut at 0, command last seen running at %v, seen gone at %v, second client granted at %v; lock's stderr:\n%s",
				time.Unix(0, lastAlive.Load()).Sub(cutAt), goneAt.Sub(cutAt), g.at.Sub(cutAt), errb)

			if mode == "sleep" {
				if _, err := os.Stat(out + ".term"); err != nil {
					t.Error("the command did not get SIGTERM first")
				}
			}
			select {
			case <-exited:
			case <-time.After(bound):
				t.Fatalf("lock did not exit; stderr:\n%s", errb)
			}
			if code := cmd.ProcessState.ExitCode(); code != exitLockLost {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, exitLockLost, errb)
			}
			if !strings.Contains(errb.String(), "lost") {
				t.Errorf("stderr does not say the lock was lost:\n%s", errb)
			}
		})
	}
}

// TestCLIInterruptWhileWaiting: SIGINT while `lock` (or `acquire`) waits in the queue withdraws
// the request: the command never runs, the exit status is 130, and nothing is left held or queued.
func TestCLIInterruptWhileWaiting(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{})
	c := dialT(t, srv.Addr)
	holder, err := c.Acquire(ctxT(t), "busy", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "env")
	self, _ := os.Executable()
	for _, args := range [][]string{{"lock", "busy", "--", self}, {"acquire", "busy"}} {
		cmd, _, errb := cliCmd(t, []string{"TICKETING_ADDR=" + srv.Addr, "TICKETING_TEST_CHILD=env", "TICKETING_TEST_OUT=" + out}, args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		// Wait until it is queued.
		deadline := time.Now().Add(bound)
		for {
			info, err := c.Inspect(ctxT(t), "busy")
			if err != nil {
				t.Fatal(err)
			}
			if info.Waiters == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v never queued; stderr:\n%s", args, errb)
			}
			time.Sleep(5 * time.Millisecond)
		}
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(bound):
			cmd.Process.Kill()
			t.Fatalf("%v did not exit on SIGINT", args)
		}
		if code := cmd.ProcessState.ExitCode(); code != 130 {
			t.Errorf("%v: exit %d, want 130; stderr:\n%s", args, code, errb)
		}
		if info, err := c.Inspect(ctxT(t), "busy"); err != nil || info.Waiters != 0 || info.Token != holder.Token() {
			t.Fatalf("%v: after the interrupt: %+v %v", args, info, err)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("the command ran although the lock was never acquired")
	}
	holder.Release(ctxT(t))
}
