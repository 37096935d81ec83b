//go:build !unix

package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Without Unix process groups and signals, `ticketing lock` runs COMMAND directly and kills it
// (there is no SIGTERM) at the deadline minus half the grace; there is no watchdog process, so a
// stopped or killed `ticketing lock` does not stop COMMAND (docs/cli.md).

var jobStopSignal os.Signal // none

var signalNames = map[syscall.Signal]string{syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL", syscall.SIGHUP: "SIGHUP"}

func ignoreJobControlOutput() {}

func inTerminalForeground() bool { return false }

// RunSupervisor refuses: there is no watchdog process without Unix process groups.
func RunSupervisor() int {
	fmt.Fprintln(os.Stderr, "ticketing: no watchdog on this platform")
	return ExitUsage
}

type directRunner struct {
	cmd  *exec.Cmd
	ev   chan runnerEvent
	kill *time.Timer
}

func newRunner(bool) (commandRunner, error) { return &directRunner{ev: make(chan runnerEvent, 4)}, nil }

func (r *directRunner) start(argv, env []string, grace time.Duration, termAt, killAt time.Time) (int, error) {
	r.cmd = exec.Command(argv[0], argv[1:]...)
	r.cmd.Env = append(os.Environ(), env...)
	r.cmd.Stdin, r.cmd.Stdout, r.cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := r.cmd.Start(); err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127, err
		}
		return 126, err
	}
	r.kill = time.AfterFunc(time.Until(killAt), func() { r.cmd.Process.Kill(); r.ev <- runnerEvent{kind: "kill"} })
	go func() {
		err := r.cmd.Wait()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		r.ev <- runnerEvent{kind: "exit", code: code}
	}()
	return 0, nil
}

func (r *directRunner) schedule(termAt, killAt time.Time) { r.kill.Reset(time.Until(killAt)) }

func (r *directRunner) terminate(killAt time.Time) {
	r.cmd.Process.Kill()
	r.ev <- runnerEvent{kind: "term", text: "requested"}
}

func (r *directRunner) signal(sig syscall.Signal) { r.cmd.Process.Signal(sig) }

func (r *directRunner) events() <-chan runnerEvent { return r.ev }

func (r *directRunner) close() {
	if r.kill != nil {
		r.kill.Stop()
	}
}
