//go:build !unix

package main

import (
	"os"
	"syscall"
)

func childProcAttr() *syscall.SysProcAttr { return nil }

// signalCommand delivers sig to COMMAND; without process groups or SIGTERM, anything but an
// interrupt kills it.
func signalCommand(p *os.Process, sig syscall.Signal) {
	if sig == syscall.SIGINT {
		if p.Signal(os.Interrupt) == nil {
			return
		}
	}
	_ = p.Kill()
}
