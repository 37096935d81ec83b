package ticketing_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
)

// readmeBlocks returns README.md's fenced blocks that follow a marker comment
// (<!-- example: Name --> or <!-- program -->), keyed by the marker's text.
func readmeBlocks(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- (example: [A-Za-z_]+|program) -->\n```go\n(.*?)```")
	blocks := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		blocks[m[1]] = m[2]
	}
	if len(blocks) == 0 {
		t.Fatal("README.md has no marked Go blocks")
	}
	return blocks
}

// TestReadmeShowsTheExamples: every Go block of README.md marked with an example's name shows
// lines of that example's body, in order, so that what the README teaches is what the examples
// (which run) do.
func TestReadmeShowsTheExamples(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "example_test.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string][]string{}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && strings.HasPrefix(fd.Name.Name, "Example") {
			body := string(src[fset.Position(fd.Body.Lbrace).Offset+1 : fset.Position(fd.Body.Rbrace).Offset])
			bodies[fd.Name.Name] = trimmedLines(body)
		}
	}
	for marker, block := range readmeBlocks(t) {
		name, ok := strings.CutPrefix(marker, "example: ")
		if !ok {
			continue
		}
		body, ok := bodies[name]
		if !ok {
			t.Errorf("README.md shows %s, which example_test.go does not have", name)
			continue
		}
		i := 0
		for _, line := range trimmedLines(block) {
			for i < len(body) && body[i] != line {
				i++
			}
			if i == len(body) {
				t.Errorf("README.md's %s shows %q, not in the example (or not in its order)", name, line)
				break
			}
			i++
		}
	}
}

func trimmedLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// TestReadmeInstall follows README.md's install steps in a fresh module outside this one (a
// replace directive to this checkout; offline: no module proxy, an empty module cache), builds
// the README's program, and runs it against the test server.
func TestReadmeInstall(t *testing.T) {
	prog, ok := readmeBlocks(t)["program"]
	if !ok {
		t.Fatal("README.md has no <!-- program --> block")
	}
	dir := t.TempDir()
	// No module proxy and an empty module cache: nothing may need a download.
	env := append(os.Environ(), "GOPROXY=off", "GOWORK=off", "GOMODCACHE="+t.TempDir(),
		"GOFLAGS=-modcacherw "+os.Getenv("GOFLAGS"))
	run := func(name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	root := testserver.RepoRoot()
	run("go", "mod", "init", "example.com/myapp")
	run("go", "mod", "edit", "-require=github.com/ticketing/ticketing/clients/go@v0.0.0",
		"-replace=github.com/ticketing/ticketing/clients/go="+filepath.Join(root, "clients", "go"),
		"-replace=github.com/ticketing/ticketing/wire="+filepath.Join(root, "wire"),
		"-replace=github.com/ticketing/ticketing="+root)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	run("go", "mod", "tidy")
	// The client is its own module: none of the server's dependencies is in the graph.
	for _, m := range strings.Fields(run("go", "list", "-m", "all")) {
		for _, server := range []string{"hashicorp", "prometheus", "porcupine", "bolt", "golang.org/x/sys"} {
			if strings.Contains(m, server) {
				t.Errorf("the module graph of an application using the client holds %s", m)
			}
		}
	}
	run("go", "build", "-o", "myapp", ".")
	env = append(env, "TICKETING_ADDR="+addr)
	if out := run(filepath.Join(dir, "myapp")); out != "done, token true\n" {
		t.Fatalf("the README's program printed %q", out)
	}
}
