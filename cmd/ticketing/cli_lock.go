package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
)

// runLock is `ticketing lock KEY -- COMMAND ARGS...`: acquire, run COMMAND holding the lock with
// keep-alive, stop COMMAND before the lock can be lost, release.
//
// The guarantee: COMMAND (its whole process group) is gone before the local deadline of the
// lock, which is never later than the server's, so the server cannot have handed the lock to
// anyone else while COMMAND still runs. When the deadline minus --kill-grace is reached without a
// successful extend (or the lock is reported lost), COMMAND's process group gets SIGTERM; if it
// is still there half the grace later (at the latest half the grace before the deadline), SIGKILL.
func runLock(args []string) int {
	fs := newFlagSet("lock", "KEY [--lease D] [--wait D] [--kill-grace D] -- COMMAND [ARGS...]",
		"Take the lock on KEY, run COMMAND while holding it, then release it. COMMAND gets the\n"+
			"fencing token in $TICKETING_TOKEN_VALUE and the key in $TICKETING_KEY. The lease is kept\n"+
			"alive while COMMAND runs. If the lock is lost, or about to be (no successful extend by\n"+
			"the deadline minus --kill-grace), COMMAND's process group gets SIGTERM, then SIGKILL,\n"+
			"so that it is gone before anyone else can be granted the lock.\n\n"+
			"Exit status: COMMAND's (128+N if it died of signal N); 75 if the lock was lost while it\n"+
			"ran; 1 if the lock was not acquired (--wait); 2 usage; 3 connection or server error.\n"+
			"SIGINT, SIGTERM and SIGHUP are forwarded to COMMAND.")
	cf := addCommon(fs)
	lease := fs.Duration("lease", defaultLease, "lease, renewed every lease/3 while COMMAND runs")
	wait := &waitFlag{forever: true}
	fs.Var(wait, "wait", "how long to wait in the queue: a duration (0 = try once) or \"forever\"")
	grace := fs.Duration("kill-grace", 0, "time before the lock's deadline at which COMMAND gets SIGTERM; SIGKILL follows at half of it (default lease/4, at most lease/2)")

	// Flags may come before or after KEY; after KEY the first non-flag (or `--`) starts COMMAND.
	pos, err := parseUntilKey(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage
	}
	key, command := pos[0], pos[1:]
	if len(command) == 0 {
		fmt.Fprintf(stderr, "%s: missing COMMAND (ticketing lock KEY -- COMMAND [ARGS...])\n", fs.Name())
		fs.Usage()
		return exitUsage
	}
	if *lease <= 0 {
		fmt.Fprintf(stderr, "%s: --lease must be positive\n", fs.Name())
		return exitUsage
	}
	if *grace == 0 {
		*grace = *lease / 4
	}
	if *grace <= 0 || *grace > *lease/2 {
		// Keep-alive extends every lease/3: a larger grace would stop COMMAND before the first
		// extend had a chance (and its retry).
		fmt.Fprintf(stderr, "%s: --kill-grace must be positive and at most half the --lease\n", fs.Name())
		return exitUsage
	}

	// Signals: while waiting they cancel the acquire; while COMMAND runs they are forwarded.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := cf.dial(ctx)
	if err != nil {
		return fail(fs.Name(), err)
	}
	defer c.Close()

	acquired := make(chan struct{})
	watched := make(chan struct{})
	gotSig := make(chan os.Signal, 1)
	go func() {
		defer close(watched)
		select {
		case s := <-sigs:
			gotSig <- s
			cancel()
		case <-acquired:
		}
	}()
	lk, err := c.Acquire(ctx, key, *lease, append(wait.options(), ticketing.WithKeepAlive())...)
	close(acquired)
	<-watched
	select {
	case s := <-gotSig:
		if lk != nil {
			release(cf, fs.Name(), lk)
		}
		fmt.Fprintf(stderr, "%s: interrupted (%v) before COMMAND started\n", fs.Name(), s)
		return signalExit(s)
	default:
	}
	if err != nil {
		return fail(fs.Name(), err)
	}

	code := superviseCommand(fs.Name(), lk, command, *grace, sigs)
	if rerr := release(cf, fs.Name(), lk); rerr != nil && code == exitOK {
		code = exitError
	}
	return code
}

// parseUntilKey parses the flags before KEY and those right after it; what follows (after an
// optional `--`) is COMMAND. It returns KEY followed by COMMAND.
func parseUntilKey(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	args = fs.Args()
	if len(args) == 0 {
		fmt.Fprintf(stderr, "%s: missing KEY\n", fs.Name())
		fs.Usage()
		return nil, errors.New("missing KEY")
	}
	key := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return nil, err
	}
	return append([]string{key}, fs.Args()...), nil
}

// release releases lk at the end of `lock`, bounded by --timeout, and reports a failure.
func release(cf *common, name string, lk *ticketing.Lock) error {
	ctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
	defer cancel()
	err := lk.Release(ctx)
	switch {
	case err == nil, errors.Is(err, ticketing.ErrLockLost):
		return nil // a lost lock was reported already
	}
	fmt.Fprintf(stderr, "%s: release failed (the lock is held until its lease ends): %v\n", name, err)
	return err
}

// superviseCommand runs command while lk is held and returns the exit code of `lock`.
func superviseCommand(name string, lk *ticketing.Lock, command []string, grace time.Duration, sigs <-chan os.Signal) int {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env = append(os.Environ(),
		"TICKETING_TOKEN_VALUE="+strconv.FormatUint(lk.Token(), 10),
		"TICKETING_KEY="+lk.Key())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127
		}
		return 126
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var (
		lost               bool   // the lock was lost, or about to be, while COMMAND ran
		why                string // for the message
		termSent, killSent bool
		killAt             time.Time
		lostCh             = lk.Lost()
		timer              = time.NewTimer(time.Hour)
	)
	defer timer.Stop()
	terminate := func(reason string) {
		lost, why = true, reason
		if termSent {
			return
		}
		termSent = true
		fmt.Fprintf(stderr, "%s: %s; stopping COMMAND: SIGTERM (lock deadline in %v)\n", name, reason, time.Until(lk.Deadline()).Round(time.Millisecond))
		signalCommand(cmd.Process, syscall.SIGTERM)
		// SIGKILL half the grace later, and no later than half the grace before the deadline:
		// COMMAND gets half the grace to exit cleanly, the kernel the other half to tear it down.
		now := time.Now()
		killAt = now.Add(grace / 2)
		if last := lk.Deadline().Add(-grace / 2); last.Before(killAt) {
			killAt = last
		}
	}
	for {
		// Next wake-up: the SIGTERM point (deadline - grace), or the SIGKILL point.
		var next time.Time
		switch {
		case !termSent:
			next = lk.Deadline().Add(-grace)
		case !killSent:
			next = killAt
		}
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
		select {
		case err := <-exited:
			code := exitCode(err)
			if lost {
				fmt.Fprintf(stderr, "%s: lock on %q lost while COMMAND ran (%s); COMMAND stopped (its status %d)\n", name, lk.Key(), why, code)
				return exitLockLost
			}
			return code
		case s := <-sigs:
			signalCommand(cmd.Process, s.(syscall.Signal))
		case <-lostCh:
			lostCh = nil
			terminate(lk.Err().Error())
		case <-timer.C:
			now := time.Now()
			if !termSent && !now.Before(lk.Deadline().Add(-grace)) {
				terminate("no successful extend by the deadline minus --kill-grace")
			} else if termSent && !killSent && !now.Before(killAt) {
				killSent = true
				fmt.Fprintf(stderr, "%s: COMMAND still running; SIGKILL (lock deadline in %v)\n", name, time.Until(lk.Deadline()).Round(time.Millisecond))
				signalCommand(cmd.Process, syscall.SIGKILL)
			}
		}
	}
}

// exitCode maps COMMAND's wait error to an exit code: its status, or 128+N for signal N.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitError
}
