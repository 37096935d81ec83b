package main

import (
	"syscall"
	"unsafe"
)

func init() {
	platformProcAttr = func(a *syscall.SysProcAttr) {
		// If `ticketing lock` is killed (SIGKILL, OOM), COMMAND gets SIGKILL rather than running
		// on after the lease it relied on has ended.
		a.Pdeathsig = syscall.SIGKILL
		// Run in the foreground of the terminal we were started in, so that an interactive
		// COMMAND can read it (a background process group would be stopped by SIGTTIN). Ctrl-C
		// then reaches COMMAND directly.
		if inTerminalForeground() {
			a.Foreground = true
			a.Ctty = 0
		}
	}
}

// inTerminalForeground reports whether stdin is a terminal whose foreground process group is ours.
func inTerminalForeground() bool {
	var pgrp int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp)))
	return errno == 0 && int(pgrp) == syscall.Getpgrp()
}
