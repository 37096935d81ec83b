package settings

import (
	"os"
	"testing"

	"github.com/ticketing/ticketing/internal/testserver"
)

// TestMain removes the binary that the server tests build (testserver.Binary).
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}
