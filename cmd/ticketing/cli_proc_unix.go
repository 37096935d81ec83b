//go:build unix

package main

import (
	"os"
	"syscall"
)

// platformProcAttr adds what a platform offers beyond process groups (Linux: a death signal and
// terminal foreground).
var platformProcAttr = func(*syscall.SysProcAttr) {}

// childProcAttr puts COMMAND in its own process group, so that signals reach everything it
// started (a shell's children too).
func childProcAttr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	platformProcAttr(a)
	return a
}

// signalCommand sends sig to COMMAND's process group (its pid is the group id).
func signalCommand(p *os.Process, sig syscall.Signal) {
	if err := syscall.Kill(-p.Pid, sig); err != nil {
		_ = p.Signal(sig)
	}
}
