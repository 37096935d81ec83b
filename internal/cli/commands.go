package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
)

func runAcquire(args []string) int {
	fs := newFlagSet("acquire", "KEY [--lease D] [--wait D]",
		"Take the lock on KEY and print its fencing token. The lock stays held after the command\n"+
			"exits, until 'ticketing release KEY TOKEN' or until the lease runs out. Waits in the\n"+
			"key's FIFO queue (--wait); exit status 1 when it was not acquired in time.")
	cf := addCommon(fs)
	lease := &durationFlag{d: defaultLease}
	fs.Var(lease, "lease", "lease: the server takes the lock back after this long unless extended")
	wait := &waitFlag{forever: true}
	fs.Var(wait, "wait", "how long to wait in the queue: a duration (0 = try once) or \"forever\"")
	pos, code, ok := parseCommand(fs, args, "KEY")
	if !ok {
		return code
	}
	if err := errors.Join(checkKey(pos[0]), checkLease(lease.d), cf.check()); err != nil {
		return usage(fs, "%v", oneLine(err))
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		lk, err := c.Acquire(ctx, pos[0], lease.d, wait.options()...)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, lk.Token())
		return nil
	})
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

func runRelease(args []string) int {
	fs := newFlagSet("release", "KEY TOKEN",
		"Release the lock on KEY held with TOKEN; the next waiter gets it at once.\n"+
			"Exit status 1 when TOKEN does not hold KEY (expired, released, wrong): nothing changed.")
	cf := addCommon(fs)
	pos, code, ok := parseCommand(fs, args, "KEY", "TOKEN")
	if !ok {
		return code
	}
	token, err := parseToken(pos[1])
	if err := errors.Join(checkKey(pos[0]), err, cf.check()); err != nil {
		return usage(fs, "%v", oneLine(err))
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		return c.Release(ctx, pos[0], token)
	})
}

func runExtend(args []string) int {
	fs := newFlagSet("extend", "KEY TOKEN [--lease D]",
		"Set the lease of the lock on KEY held with TOKEN to --lease from now (it may shorten it).\n"+
			"Exit status 1 when TOKEN does not hold KEY.")
	cf := addCommon(fs)
	lease := &durationFlag{d: defaultLease}
	fs.Var(lease, "lease", "the new lease, from now")
	pos, code, ok := parseCommand(fs, args, "KEY", "TOKEN")
	if !ok {
		return code
	}
	token, err := parseToken(pos[1])
	if err := errors.Join(checkKey(pos[0]), err, checkLease(lease.d), cf.check()); err != nil {
		return usage(fs, "%v", oneLine(err))
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		_, err := c.Extend(ctx, pos[0], token, lease.d)
		return err
	})
}

func runPing(args []string) int {
	fs := newFlagSet("ping", "", "Connect (handshake and auth included), send PING, and print the round trip.")
	cf := addCommon(fs)
	_, code, ok := parseCommand(fs, args)
	if !ok {
		return code
	}
	if err := cf.check(); err != nil {
		return usage(fs, "%v", err)
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		start := time.Now()
		if err := c.Ping(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ok %v\n", time.Since(start).Round(time.Microsecond))
		return nil
	})
}

func runInspect(args []string) int {
	fs := newFlagSet("inspect", "KEY [--json]",
		"Show whether KEY is held, the lease left, how long it has been held, how many acquires\n"+
			"wait, and the lock-delay left. Changes nothing. The holder's token is shown only to\n"+
			"its holder, so `inspect` shows token=0 for a lock another client holds.")
	cf := addCommon(fs)
	asJSON := fs.Bool("json", false, "print a JSON object")
	showWaiters := addWaitersFlags(fs, func() string { return cf.addr }) // top.go: --waiters, from the admin listener
	pos, code, ok := parseCommand(fs, args, "KEY")
	if !ok {
		return code
	}
	if err := errors.Join(checkKey(pos[0]), cf.check()); err != nil {
		return usage(fs, "%v", oneLine(err))
	}
	return cf.call(fs.Name(), func(ctx context.Context, c *ticketing.Client) error {
		info, err := c.Inspect(ctx, pos[0])
		if err != nil {
			return err
		}
		printKeyInfo(info, *asJSON)
		return showWaiters(ctx, pos[0], *asJSON)
	})
}

func printKeyInfo(info ticketing.KeyInfo, asJSON bool) {
	if asJSON {
		b, _ := json.Marshal(map[string]any{
			"key": info.Key, "held": info.Held, "token": info.Token, "waiters": info.Waiters,
			"lease_left_ms": info.LeaseLeft.Milliseconds(), "held_for_ms": info.HeldFor.Milliseconds(),
			"lock_delay_left_ms": info.LockDelayLeft.Milliseconds(), "startup_wait": info.Startup,
		})
		fmt.Fprintln(stdout, string(b))
		return
	}
	startup := ""
	if info.Startup {
		startup = " startup_wait=true (the server grants nothing before lock_delay_left has passed)"
	}
	fmt.Fprintf(stdout, "key=%s held=%t token=%d lease_left=%v held_for=%v waiters=%d lock_delay_left=%v%s\n",
		strconv.Quote(info.Key), info.Held, info.Token, info.LeaseLeft, info.HeldFor, info.Waiters, info.LockDelayLeft, startup)
}

// readLines sends every line of r to the returned channel, which is closed at EOF.
func readLines(r io.Reader) <-chan string {
	ch := make(chan string, 16)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}
