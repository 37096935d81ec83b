//go:build unix

package ticketing

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user and system) this process has used; -1 if unknown.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
