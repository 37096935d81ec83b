package deploytest

import "syscall"

// killWithParent has the server killed when the test process dies.
func killWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
