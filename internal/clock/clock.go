// Package clock reads the clocks a lock server needs for safe restarts: CLOCK_BOOTTIME (a
// monotonic clock that keeps counting while the machine is suspended, and restarts from zero at
// boot), the kernel's boot id (which tells whether two readings come from the same boot), and
// the wall clock.
//
// A single node measures leases on BOOTTIME: a lease must run out in real time even if the
// server's machine sleeps through it, because clients elsewhere do not sleep. A cluster leader
// stamps the log's time from Go's monotonic clock instead (internal/server, cluster.stamp),
// which stops while its host is suspended: there a lease lasts longer in real time, never
// shorter, which is the safe direction (the holder's own deadline passes first), and the other
// nodes elect a new leader meanwhile, whose time goes on from the last stamp it applied.
package clock

import (
	"os"
	"strings"
	"time"
)

// Boottime returns CLOCK_BOOTTIME in nanoseconds (time since boot, including suspend). On
// systems without it, it falls back to the process's monotonic clock (see boottime_other.go).
func Boottime() int64 { return boottime() }

// BootID returns the kernel's boot id (a random id drawn at every boot), or "" when the
// system does not expose one; then every start is treated as a new boot.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Wall returns the wall clock in Unix nanoseconds.
func Wall() int64 { return time.Now().UnixNano() }
