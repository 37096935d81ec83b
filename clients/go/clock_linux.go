//go:build linux

package ticketing

import (
	"syscall"
	"time"
	"unsafe"
)

const clockBoottime = 7 // CLOCK_BOOTTIME, linux/time.h

// boottime reads CLOCK_BOOTTIME (ns); ok is false when the kernel refuses it.
func boottime() (int64, bool) {
	var ts syscall.Timespec
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockBoottime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0, false
	}
	return ts.Nano(), true
}

// bootSource measures suspend time as CLOCK_BOOTTIME's advance beyond the monotonic clock's.
type bootSource struct{ boot0 int64 }

func (b bootSource) suspended(monoElapsed func() int64) int64 {
	t, _ := boottime()
	return (t - b.boot0) - monoElapsed()
}

func newSuspendSource(start time.Time) suspendSource {
	if b, ok := boottime(); ok {
		return bootSource{boot0: b - int64(time.Since(start))}
	}
	return newWallSource(start)
}
