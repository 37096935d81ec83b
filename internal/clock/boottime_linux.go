//go:build linux

package clock

import (
	"syscall"
	"unsafe"
)

const clockBoottime = 7 // CLOCK_BOOTTIME, linux/time.h

func boottime() int64 {
	var ts syscall.Timespec
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockBoottime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return monotonic()
	}
	return ts.Nano()
}
