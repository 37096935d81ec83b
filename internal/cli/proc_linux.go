package cli

import (
	"syscall"
	"unsafe"
)

// commandProcAttr puts COMMAND in its own process group (signals reach everything it started),
// in the terminal's foreground when `ticketing lock` was, and has it killed if the watchdog
// dies (SIGKILL, OOM).
func commandProcAttr(foreground bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Foreground: foreground, Ctty: 0, Pdeathsig: syscall.SIGKILL}
}

// bootNanos is CLOCK_BOOTTIME in nanoseconds: monotonic, and counting while the machine sleeps.
func bootNanos() int64 {
	var ts syscall.Timespec
	const clockBoottime = 7
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockBoottime, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}
