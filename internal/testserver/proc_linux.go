package testserver

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel SIGKILL the server if the test process dies first (a test
// binary killed by its timeout must not leave servers behind).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
