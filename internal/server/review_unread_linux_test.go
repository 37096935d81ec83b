package server

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// reviewUnread is the number of bytes received on nc's socket and not yet read (SIOCINQ).
func reviewUnread(t *testing.T, nc net.Conn) int {
	rc, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ierr error
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || ierr != nil {
		t.Fatal(err, ierr)
	}
	return n
}
