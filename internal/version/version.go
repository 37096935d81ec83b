// Package version is the release this build is: the project's one version (the repository's
// VERSION file, which every client package carries too; TestVersionMatchesTheFile keeps them
// equal) and the commit the binary was built from (Go's build information).
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is the release (semantic versioning).
const Version = "0.3.0"

// Build describes the binary.
type Build struct {
	Version  string // Version
	Revision string // the commit, "" when built outside a checkout
	Modified bool   // built from a checkout with uncommitted changes
	Go       string // the Go release that built it
}

// Get reads the build information.
func Get() Build {
	b := Build{Version: Version, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	return b
}

// String is how the binary names itself: "0.3.0 (commit 1a2b3c4d5e6f, modified, go1.25.1)".
func (b Build) String() string {
	s := b.Version + " ("
	if b.Revision != "" {
		rev := b.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		s += "commit " + rev
		if b.Modified {
			s += ", modified"
		}
		s += ", "
	}
	return s + b.Go + ")"
}
