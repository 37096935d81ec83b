//go:build linux && !race

package server

import (
	"syscall"
	"unsafe"
)

// sockRead and sockWrite are read(2) and write(2) on a connection's socket, which the net
// package keeps in non-blocking mode: they return at once (EAGAIN when there is nothing to read
// or no room), so they are made as raw system calls, without telling the scheduler a goroutine
// may block. syscall.Read and syscall.Write do tell it (entersyscall/exitsyscall on every
// call), and then the system monitor takes the processor from a thread that is merely busy in
// the kernel's TCP path and starts or wakes another thread to run the rest: under load that
// hand-off cost more than the calls themselves (server CPU per operation at 16 busy connections
// 0.78-0.86 -> 0.52-0.58 µs on a shared 2-vCPU machine; 64 connections: 11 threads -> 8;
// BENCHMARKS.md, issue 28). gVisor's netstack writes its non-blocking descriptors the same way.
// Only plain TCP connections use them (conn.readFD, conn.writeFD); TLS goes through crypto/tls.
func sockRead(fd int, p []byte) (int, error) {
	return rawIO(syscall.SYS_READ, fd, p)
}

func sockWrite(fd int, p []byte) (int, error) {
	return rawIO(syscall.SYS_WRITE, fd, p)
}

func rawIO(trap uintptr, fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, errno := syscall.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if errno != 0 {
		return -1, errno
	}
	return int(n), nil
}
