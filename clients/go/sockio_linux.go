//go:build linux && !race

package ticketing

import (
	"syscall"
	"unsafe"
)

// rawIO is read(2) or write(2) on a connection's socket, which the net package keeps in
// non-blocking mode: it returns at once (EAGAIN when there is nothing to read or no room), so it
// is made as a raw system call, without telling the scheduler the goroutine may block.
// syscall.Read and syscall.Write (under net.Conn's Read and Write) do tell it, and under load
// the runtime then hands the processor of a thread busy in the kernel's TCP path to another
// thread. The server reads and writes its sockets the same way (internal/server/sockio_linux.go).
func rawIO(trap uintptr, fd int, p []byte) (int, syscall.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	n, _, errno := syscall.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), 0
}

// rawSockets: a plain TCP connection reads and writes with rawIO.
const rawSockets = true

const (
	sysRead  = syscall.SYS_READ
	sysWrite = syscall.SYS_WRITE
)
