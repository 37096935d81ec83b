package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

// TestLinkedPackages: packages that one library or another pulled into the binary without the
// server ever calling them stay out. A Go binary runs every linked package's initialisers and the
// kernel maps the binary in 64 KiB windows around what runs, so each of them cost resident memory
// in every process (issue 28; third_party/go-msgpack and third_party/armon-go-metrics are the two
// trimmed libraries that linked them). The admin listener is internal/adminhttp, not net/http.
func TestLinkedPackages(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(gobin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	linked := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		linked[p] = true
	}
	if !linked["github.com/hashicorp/raft"] || !linked["crypto/tls"] {
		t.Fatalf("go list -deps does not list the server's own dependencies:\n%s", out)
	}
	for _, p := range []string{"net/http", "net/rpc", "encoding/gob", "html/template", "text/template", "go/parser"} {
		if linked[p] {
			t.Errorf("%s is linked into the binary (go list -deps ./cmd/ticketing; find who imports it with go list -deps -f '{{.ImportPath}}: {{.Imports}}')", p)
		}
	}
}

// TestMain removes the binary that TestVersion builds (testserver.Binary).
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}
