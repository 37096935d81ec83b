package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
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
// anyone else while COMMAND still runs. When the deadline minus --kill-grace is reached without
// a successful extend, or the lock is reported lost, COMMAND's process group gets SIGTERM; if it
// is still there half the grace later (at the latest half the grace before the deadline),
// SIGKILL. On Unix a watchdog process (this binary, re-executed) starts COMMAND and holds the
// same deadlines, so this holds even if `ticketing lock` itself is stopped (SIGSTOP) or killed.
func runLock(args []string) int {
	fs := newFlagSet("lock", "KEY [--lease D] [--wait D] [--kill-grace D] -- COMMAND [ARGS...]",
		"Take the lock on KEY, run COMMAND while holding it, then release it. COMMAND gets the\n"+
			"fencing token in $TICKETING_TOKEN_VALUE and the key in $TICKETING_KEY. The lease is kept\n"+
			"alive while COMMAND runs. If the lock is lost, or about to be (no successful extend by\n"+
			"the deadline minus --kill-grace), COMMAND's process group gets SIGTERM, then SIGKILL,\n"+
			"so that it is gone before anyone else can be granted the lock. A watchdog process does\n"+
			"the same if `ticketing lock` itself is stopped or killed.\n\n"+
			"Exit status: COMMAND's (128+N if it died of signal N); 75 if the lock was lost while it\n"+
			"ran; 1 if the lock was not acquired (--wait); 2 bad arguments; 3 cannot reach or talk to\n"+
			"the server; 4 authentication failed; 5 TLS error. SIGINT, SIGTERM and SIGHUP are forwarded\n"+
			"to COMMAND; job-control stops (SIGTSTP, SIGTTIN, SIGTTOU) are refused.")
	cf := addCommon(fs)
	lease := &durationFlag{d: defaultLease}
	fs.Var(lease, "lease", "lease, renewed every lease/3 while COMMAND runs")
	wait := &waitFlag{forever: true}
	fs.Var(wait, "wait", "how long to wait in the queue: a duration (0 = try once) or \"forever\"")
	grace := &durationFlag{}
	fs.Var(grace, "kill-grace", "time before the lock's deadline at which COMMAND gets SIGTERM; SIGKILL follows at half of it (default lease/4, at most lease/2)")

	// Flags may come before or after KEY; after KEY the first non-flag (or `--`) starts COMMAND.
	pos, err := parseUntilKey(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		printHelp(fs)
		return ExitOK
	}
	if err != nil {
		return usage(fs, "%v", err)
	}
	key, command := pos[0], pos[1:]
	if len(command) == 0 {
		return usage(fs, "missing COMMAND (ticketing lock KEY -- COMMAND [ARGS...])")
	}
	if err := errors.Join(checkKey(key), checkLease(lease.d), cf.check()); err != nil {
		return usage(fs, "%v", oneLine(err))
	}
	if grace.d == 0 {
		grace.d = lease.d / 4
	}
	if grace.d <= 0 || grace.d > lease.d/2 {
		// Keep-alive extends every lease/3: a larger grace would stop COMMAND before the first
		// extend had a chance (and its retry).
		return usage(fs, "--kill-grace %v must be positive and at most half the --lease (%v)", grace.d, lease.d/2)
	}
	opts, err := cf.options()
	if err != nil {
		return fail(fs.Name(), err)
	}

	// The watchdog starts first, before this process ignores SIGTTIN/SIGTTOU below: COMMAND, its
	// child, inherits the watchdog's signal dispositions, which must be the defaults.
	run, err := newRunner(inTerminalForeground())
	if err != nil {
		fmt.Fprintf(stderr, "%s: cannot start the watchdog: %v\n", fs.Name(), err)
		return ExitUnavailable
	}
	defer run.close()
	// A stopped `ticketing lock` would stop renewing the lease while COMMAND runs on (the
	// watchdog would then stop COMMAND): job-control stops are refused, and background terminal
	// I/O must not stop this process either.
	ignoreJobControlOutput()
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	if jobStopSignal != nil {
		signal.Notify(sigs, jobStopSignal)
	}
	defer signal.Stop(sigs)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := ticketing.Dial(ctx, opts...)
	if err != nil {
		return fail(fs.Name(), err)
	}
	defer c.Close()

	// While waiting, SIGINT, SIGTERM and SIGHUP withdraw the request.
	acquired := make(chan struct{})
	watched := make(chan struct{})
	gotSig := make(chan os.Signal, 1)
	go func() {
		defer close(watched)
		for {
			select {
			case s := <-sigs:
				if s == jobStopSignal {
					fmt.Fprintf(stderr, "%s: ignoring %s: a waiting `ticketing lock` is not suspended (interrupt it to give up)\n", fs.Name(), signalName(s))
					continue
				}
				gotSig <- s
				cancel()
				return
			case <-acquired:
				return
			}
		}
	}()
	lk, err := c.Acquire(ctx, key, lease.d, append(wait.options(), ticketing.WithKeepAlive())...)
	close(acquired)
	<-watched
	select {
	case s := <-gotSig:
		if lk != nil {
			release(c, fs.Name(), lk)
		}
		fmt.Fprintf(stderr, "%s: interrupted (%s) before COMMAND started; nothing is held\n", fs.Name(), signalName(s))
		return signalExit(s)
	default:
	}
	if err != nil {
		return fail(fs.Name(), err)
	}

	code := runCommand(fs.Name(), lk, command, grace.d, sigs, run)
	if rerr := release(c, fs.Name(), lk); rerr != nil && code == ExitOK {
		code = exitCodeOf(rerr)
	}
	return code
}

// lostReason says why lk was lost: "server restarted (the server restarted: its state id changed)".
func lostReason(lk *ticketing.Lock) string {
	var le *ticketing.LockLostError
	if errors.As(lk.Err(), &le) {
		if le.Detail != "" {
			return string(le.Reason) + ": " + le.Detail
		}
		return string(le.Reason)
	}
	return "lost"
}

// parseUntilKey parses the flags before KEY and those right after it; what follows (after an
// optional `--`) is COMMAND. It returns KEY followed by COMMAND.
func parseUntilKey(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	args = fs.Args()
	if len(args) == 0 {
		return nil, errors.New("missing KEY")
	}
	key := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return nil, err
	}
	return append([]string{key}, fs.Args()...), nil
}

// release releases lk at the end of `lock` (bounded by the request timeout) and reports a
// failure. A lock already reported lost is not reported again.
func release(c *ticketing.Client, name string, lk *ticketing.Lock) error {
	err := lk.Release(context.Background())
	switch {
	case err == nil, errors.Is(err, ticketing.ErrLockLost):
		return nil
	}
	fmt.Fprintf(stderr, "%s: release failed (the lock is held until its lease ends): %s\n", name, message(name, err))
	return err
}

// SuperviseCommand is the hidden command that runs the watchdog of `ticketing lock`.
const SuperviseCommand = "__supervise"

// runnerEvent is what the runner of COMMAND reports.
type runnerEvent struct {
	kind string // "exit", "stopped" (a job-control stop, undone), "term" and "kill" (sent), "gone" (the watchdog died), "error" (COMMAND did not start)
	code int    // exit: COMMAND's status, 128+N for signal N
	text string
}

// commandRunner starts and stops COMMAND. Deadlines are local times; the runner holds them
// itself, so that COMMAND is stopped at them even if this process stops.
type commandRunner interface {
	// start runs argv with extra environment variables; termAt and killAt are when COMMAND
	// gets SIGTERM and SIGKILL unless schedule moves them. It returns an exit status (126,
	// 127) and an error when COMMAND cannot run.
	start(argv, env []string, grace time.Duration, termAt, killAt time.Time) (int, error)
	schedule(termAt, killAt time.Time)
	terminate(killAt time.Time) // SIGTERM now, SIGKILL at killAt
	signal(sig syscall.Signal)
	events() <-chan runnerEvent
	close()
}

// runCommand runs command while lk is held and returns the exit status of `lock`.
func runCommand(name string, lk *ticketing.Lock, command []string, grace time.Duration, sigs <-chan os.Signal, run commandRunner) int {
	env := []string{"TICKETING_TOKEN_VALUE=" + strconv.FormatUint(lk.Token(), 10), "TICKETING_KEY=" + lk.Key()}
	deadline := lk.Deadline()
	if code, err := run.start(command, env, grace, deadline.Add(-grace), deadline.Add(-grace/2)); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return code
	}
	var (
		lost        bool   // the lock was lost, or about to be, while COMMAND ran
		why         string // for the message
		lostCh      = lk.Lost()
		tick        = time.NewTicker(max(min(grace/4, 250*time.Millisecond), time.Millisecond))
		warnedStops bool
	)
	defer tick.Stop()
	killAt := func() time.Time {
		// SIGKILL half the grace after SIGTERM, and no later than half the grace before the
		// deadline: COMMAND gets half the grace to exit cleanly, the kernel the other half.
		k := time.Now().Add(grace / 2)
		if last := lk.Deadline().Add(-grace / 2); last.Before(k) {
			k = last
		}
		return k
	}
	for {
		select {
		case ev, ok := <-run.events():
			if !ok {
				fmt.Fprintf(stderr, "%s: the watchdog process ended unexpectedly\n", name)
				return ExitLockLost
			}
			switch ev.kind {
			case "exit":
				if lost {
					fmt.Fprintf(stderr, "%s: lock on %s lost while COMMAND ran (%s); COMMAND was stopped (its status %d)\n", name, ticketing.FormatKey(lk.Key()), why, ev.code)
					return ExitLockLost
				}
				return ev.code
			case "stopped":
				if !warnedStops {
					fmt.Fprintf(stderr, "%s: COMMAND was stopped (%s) and has been continued: a command holding a lock is not suspended (its lease would run out, or be kept alive forever)\n", name, ev.text)
					warnedStops = true
				}
			case "term":
				if !lost {
					lost, why = true, "no successful extend by the deadline minus --kill-grace"
				}
				fmt.Fprintf(stderr, "%s: %s; stopping COMMAND: SIGTERM (lock deadline in %v)\n", name, why, time.Until(lk.Deadline()).Round(time.Millisecond))
			case "kill":
				fmt.Fprintf(stderr, "%s: COMMAND still running; SIGKILL (lock deadline in %v)\n", name, time.Until(lk.Deadline()).Round(time.Millisecond))
			case "gone":
				fmt.Fprintf(stderr, "%s: the watchdog process ended unexpectedly (%s); COMMAND was killed\n", name, ev.text)
				return ExitLockLost
			}
		case <-tick.C:
			if !lost {
				if dl := lk.Deadline(); !dl.Equal(deadline) {
					deadline = dl
					run.schedule(dl.Add(-grace), dl.Add(-grace/2))
				}
			}
		case <-lostCh:
			lostCh = nil
			if !lost {
				lost, why = true, lostReason(lk)
				run.terminate(killAt())
			}
		case s := <-sigs:
			if s == jobStopSignal {
				fmt.Fprintf(stderr, "%s: ignoring %s: the lock's keep-alive must not stop while COMMAND runs\n", name, signalName(s))
				continue
			}
			run.signal(s.(syscall.Signal))
		}
	}
}
