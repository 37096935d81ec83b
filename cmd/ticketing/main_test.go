package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ticketing/ticketing/internal/deploy/deploytest"
	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/internal/version"
)

// `ticketing version` and `ticketing --version` name the release (issue 30, defect 5).
func TestVersion(t *testing.T) {
	bin := deploytest.Binary(t)
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(bin, arg).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "ticketing "+version.Version+" (") {
			t.Errorf("ticketing %s: %v %q", arg, err, out)
		}
	}
}

// TestMain removes the binary that TestVersion builds (testserver.Binary).
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}
