//go:build !linux

package deploytest

import "syscall"

// killWithParent: no death signal outside Linux; Node's cleanup stops the server.
func killWithParent() *syscall.SysProcAttr { return nil }
