//go:build !linux

package ticketing

import "syscall"

// Elsewhere a connection reads and writes through net.Conn (sockio_linux.go).
const rawSockets = false

const (
	sysRead  = 0
	sysWrite = 1
)

func rawIO(trap uintptr, fd int, p []byte) (int, syscall.Errno) { return 0, syscall.EINVAL }
