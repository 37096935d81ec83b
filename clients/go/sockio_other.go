//go:build !linux || race

package ticketing

import "syscall"

// Elsewhere, and under the race detector (which learns the order a socket gives its two ends
// from syscall.Read's and syscall.Write's annotations), a connection reads and writes through
// net.Conn (sockio_linux.go).
const rawSockets = false

const (
	sysRead  = 0
	sysWrite = 1
)

func rawIO(trap uintptr, fd int, p []byte) (int, syscall.Errno) { return 0, syscall.EINVAL }
