// Package packaging checks what every client package says about itself against the project:
// one version (the repository's VERSION file) and one license (Apache-2.0) everywhere.
package packaging

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// versionIn is where each package records its version: the file, and a pattern whose first
// group is the version. Every match in the file must be the project's version (a POM names its
// parent's version in each module).
var versionIn = []struct{ file, pattern string }{
	{"clients/python/pyproject.toml", `(?m)^version = "([^"]+)"`},
	{"clients/js/package.json", `(?m)^  "version": "([^"]+)"`},
	{"clients/rust/Cargo.toml", `(?m)^version = "([^"]+)"`},
	{"clients/rust/dev/Cargo.toml", `(?m)^version = "([^"]+)"`},
	{"clients/ruby/lib/ticketing/version.rb", `VERSION = "([^"]+)"`},
	{"clients/csharp/src/Ticketing/Ticketing.csproj", `<Version>([^<]+)</Version>`},
	{"clients/c/CMakeLists.txt", `project\(ticketing VERSION ([0-9.]+)`},
	{"clients/java/pom.xml", `(?s)<artifactId>ticketing-parent</artifactId>\s*<version>([^<]+)</version>`},
	{"clients/java/core/pom.xml", `(?s)<parent>.*?<version>([^<]+)</version>.*?</parent>`},
	{"clients/java/kotlin/pom.xml", `(?s)<parent>.*?<version>([^<]+)</version>.*?</parent>`},
	{"internal/version/version.go", `const Version = "([^"]+)"`},
}

func TestEveryPackageCarriesTheProjectVersion(t *testing.T) {
	want := strings.TrimSpace(read(t, "VERSION"))
	for _, v := range versionIn {
		ms := regexp.MustCompile(v.pattern).FindAllStringSubmatch(read(t, v.file), -1)
		if len(ms) == 0 {
			t.Errorf("%s: no version found (pattern %s)", v.file, v.pattern)
		}
		for _, m := range ms {
			if m[1] != want {
				t.Errorf("%s says version %s, VERSION says %s", v.file, m[1], want)
			}
		}
	}
}

// Every package says Apache-2.0 in its metadata and ships the license text.
func TestEveryPackageCarriesTheLicense(t *testing.T) {
	license := read(t, "LICENSE")
	if !strings.Contains(license, "Apache License") || !strings.Contains(license, "Version 2.0") {
		t.Fatal("LICENSE is not the Apache License 2.0")
	}
	for file, says := range map[string]string{
		"clients/python/pyproject.toml":                 `license = "Apache-2.0"`,
		"clients/js/package.json":                       `"license": "Apache-2.0"`,
		"clients/rust/Cargo.toml":                       `license = "Apache-2.0"`,
		"clients/ruby/ticketing.gemspec":                `"Apache-2.0"`,
		"clients/csharp/src/Ticketing/Ticketing.csproj": `<PackageLicenseExpression>Apache-2.0</PackageLicenseExpression>`,
		"clients/java/pom.xml":                          `<name>Apache-2.0</name>`,
	} {
		if !strings.Contains(read(t, file), says) {
			t.Errorf("%s does not say %s", file, says)
		}
	}
	for _, dir := range []string{"clients/python", "clients/js", "clients/rust", "clients/ruby", "clients/csharp", "clients/c", "clients/java", "clients/go", "wire"} {
		if got := read(t, filepath.Join(dir, "LICENSE")); got != license {
			t.Errorf("%s/LICENSE differs from the repository's LICENSE", dir)
		}
	}
}

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
