//go:build !linux || race

package server

import "syscall"

// sockRead and sockWrite: see sockio_linux.go. Elsewhere, and under the race detector (which
// learns the order a socket gives its two ends from syscall.Read's and syscall.Write's
// annotations), the ordinary calls.
func sockRead(fd int, p []byte) (int, error)  { return syscall.Read(fd, p) }
func sockWrite(fd int, p []byte) (int, error) { return syscall.Write(fd, p) }
