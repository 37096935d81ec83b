package version

import (
	"os"
	"strings"
	"testing"
)

// The one version is the repository's VERSION file; this constant is its copy for the binary.
func TestVersionMatchesTheFile(t *testing.T) {
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != Version {
		t.Fatalf("VERSION says %q, version.Version %q", got, Version)
	}
	if s := Get().String(); !strings.HasPrefix(s, Version+" (") || !strings.Contains(s, "go1") {
		t.Fatalf("Build.String() = %q", s)
	}
}
