//go:build unix && !linux

package cli

import (
	"syscall"
	"time"
)

// commandProcAttr puts COMMAND in its own process group (signals reach everything it started),
// in the terminal's foreground when `ticketing lock` was. (No death signal outside Linux: if the
// watchdog is killed, COMMAND runs on; docs/cli.md says so.)
func commandProcAttr(foreground bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Foreground: foreground, Ctty: 0}
}

// bootNanos is the wall clock outside Linux (no portable CLOCK_BOOTTIME): the watchdog's
// deadlines move if the clock is stepped; docs/cli.md says so.
func bootNanos() int64 { return time.Now().UnixNano() }
