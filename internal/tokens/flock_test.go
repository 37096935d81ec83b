//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package tokens

import (
	"errors"
	"testing"
)

// Built only where the data directory is locked with flock (lock_flock.go).
func TestOpenLocksDirectory(t *testing.T) {
	dir := t.TempDir()
	a := mustOpen(t, dir, 4)
	if _, err := Open(dir, 4); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	a.Close()
	a.Close() // idempotent
	b := mustOpen(t, dir, 4)
	defer b.Close()
	if b.Next() <= 4 {
		t.Fatal("token not above the previous block")
	}
}
