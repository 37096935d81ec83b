//go:build !linux

package server

import "syscall"

// sockRead and sockWrite: see sockio_linux.go. Elsewhere the ordinary calls.
func sockRead(fd int, p []byte) (int, error)  { return syscall.Read(fd, p) }
func sockWrite(fd int, p []byte) (int, error) { return syscall.Write(fd, p) }
