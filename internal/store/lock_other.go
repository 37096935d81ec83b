//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package store

import (
	"fmt"
	"os"
	"path/filepath"
)

// lockDir only opens dir/tokens.lock: this platform has no flock, so two
// allocators on one directory are not detected here.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return f, nil
}
