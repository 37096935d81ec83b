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

// TestBuildFlags: the release build (gcflags.txt, issue 28) turns inlining off only in packages
// the request path does not run. For every package the server spends its time in, the last
// pattern of gcflags.txt that matches it (the go command's rule) must leave inlining on; the
// cold ones it was written for must have it off, or the file no longer does what it says.
func TestBuildFlags(t *testing.T) {
	b, err := os.ReadFile("gcflags.txt")
	if err != nil {
		t.Fatal(err)
	}
	type rule struct{ pattern, flags string }
	var rules []rule
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		pf, ok := strings.CutPrefix(line, "-gcflags=")
		pattern, flags, ok2 := strings.Cut(pf, "=")
		if !ok || !ok2 || strings.ContainsAny(line, " '\"") {
			t.Fatalf("gcflags.txt: %q is not -gcflags=PATTERN=FLAGS without spaces or quotes", line)
		}
		rules = append(rules, rule{pattern, flags})
	}
	flagsFor := func(pkg string) (string, bool) {
		got, found := "", false
		for _, r := range rules {
			base, tree := strings.CutSuffix(r.pattern, "/...")
			if r.pattern == "all" || pkg == r.pattern || (tree && (pkg == base || strings.HasPrefix(pkg, base+"/"))) {
				got, found = r.flags, true
			}
		}
		return got, found
	}
	for _, pkg := range []string{"runtime", "internal/runtime/maps", "sync", "sync/atomic", "net", "syscall",
		"time", "os", "io", "bufio", "bytes", "strings", "slices", "encoding/binary", "math/bits",
		"crypto/tls", "crypto/internal/fips140/aes/gcm", "vendor/golang.org/x/crypto/chacha20poly1305",
		"github.com/ticketing/ticketing/internal/server", "github.com/ticketing/ticketing/internal/locktable",
		"github.com/ticketing/ticketing/wire", "github.com/hashicorp/raft", "github.com/hashicorp/raft-wal",
		"github.com/hashicorp/go-msgpack/v2/codec", "github.com/armon/go-metrics"} {
		if f, _ := flagsFor(pkg); f != "" {
			t.Errorf("gcflags.txt compiles %s with %q: the request path must keep inlining", pkg, f)
		}
	}
	for _, pkg := range []string{"fmt", "flag", "encoding/json", "log/slog", "regexp", "go.etcd.io/bbolt"} {
		if f, ok := flagsFor(pkg); !ok || f != "-l" {
			t.Errorf("gcflags.txt compiles %s with %q, not -l", pkg, f)
		}
	}
}

// TestMain removes the binary that TestVersion builds (testserver.Binary).
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}
