package server

import (
	"bytes"
	"syscall"
	"testing"
)

// TestSockIO: the raw read and write keep syscall.Read's and syscall.Write's answers on a
// non-blocking socket (EAGAIN when empty, the bytes, 0 at the peer's close, an error on a bad
// descriptor), which conn.readFD and conn.writeFD rely on.
func TestSockIO(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := fds[0], fds[1]
	defer syscall.Close(a)
	for _, fd := range fds {
		if err := syscall.SetNonblock(fd, true); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 64)
	if n, err := sockRead(a, buf); err != syscall.EAGAIN {
		t.Fatalf("read of an empty socket = %d, %v; want EAGAIN", n, err)
	}
	if n, err := sockWrite(b, []byte("hello")); n != 5 || err != nil {
		t.Fatalf("write = %d, %v", n, err)
	}
	if n, err := sockRead(a, buf); n != 5 || err != nil || !bytes.Equal(buf[:n], []byte("hello")) {
		t.Fatalf("read = %d %q, %v", n, buf[:max(n, 0)], err)
	}
	if n, err := sockRead(a, nil); n != 0 || err != nil {
		t.Fatalf("empty read = %d, %v", n, err)
	}
	// A full socket buffer: the write is short or EAGAIN, never a wait.
	big := make([]byte, 1<<20)
	total := 0
	for i := 0; i < 64; i++ {
		n, err := sockWrite(b, big)
		if err == syscall.EAGAIN {
			break
		}
		if err != nil || n <= 0 {
			t.Fatalf("write to a filling socket = %d, %v", n, err)
		}
		total += n
	}
	if n, err := sockWrite(b, big); err != syscall.EAGAIN {
		t.Fatalf("write to a full socket = %d, %v; want EAGAIN (after %d bytes)", n, err, total)
	}
	syscall.Close(b)
	for {
		n, err := sockRead(a, big)
		if err != nil {
			t.Fatalf("read draining = %d, %v", n, err)
		}
		if n == 0 {
			break // the peer's close
		}
	}
	if _, err := sockRead(-1, buf); err != syscall.EBADF {
		t.Fatalf("read of a bad descriptor: %v; want EBADF", err)
	}
}
