package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ticketing/ticketing/internal/testserver"
)

// TestDocsCommandLinesParse: every command line of docs/operations.md, docs/cluster.md and
// README.md (in their fenced code blocks) that runs `ticketing` (or bin/ticketing) is one the
// real binary accepts: its command, subcommand, flags, flag values and positional arguments.
//
// How, and why not only `--help` appended: the binary's exit status 2 means bad arguments for
// every command (docs/cli.md, "Exit status"), and every command parses all its arguments before
// it connects anywhere. So each line runs as written, with TICKETING_ADDR and
// TICKETING_ADMIN_ADDR naming closed local ports: a line that parses stops at its first
// connection attempt (status 3, or healthcheck's 1) and nothing is done; a line that does not
// parse exits 2. `--help` alone would prove less: `cluster bogus --help` exits 0, and flag
// parsing stops at --help, before the positional arguments are counted. `deploy` needs no
// server: its lines must print (status 0; 1 only when a file named on the line, which lives on
// the operator's machine, is missing here). `server` lines would start a server, so they run
// with `--help` appended: that parses the line's TICKETING_* variables (the settings read them
// before the flags) and its flags, and every variable the line sets must be one the server's
// help names.
func TestDocsCommandLinesParse(t *testing.T) {
	root := testserver.RepoRoot()
	closed, err := testserver.FreeAddrs("127.0.0.1", 2)
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"TICKETING_ADDR=" + closed[0], "TICKETING_ADMIN_ADDR=" + closed[1]}
	serverHelp := cli(t, nil, "server", "--help")
	if serverHelp.code != 0 {
		t.Fatalf("ticketing server --help: exit %d %s", serverHelp.code, serverHelp.stderr)
	}
	minimum := map[string]int{"docs/operations.md": 4, "docs/cluster.md": 2, "README.md": 4}
	for _, file := range []string{"docs/operations.md", "docs/cluster.md", "README.md"} {
		text, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		lines, err := docCommandLines(string(text))
		if err != nil {
			t.Errorf("%s: %v", file, err)
		}
		if len(lines) < minimum[file] {
			t.Errorf("%s: %d command lines found, at least %d expected (is the extraction broken?)", file, len(lines), minimum[file])
		}
		for _, l := range lines {
			where := fmt.Sprintf("%s:%d: %s", file, l.line, l.text)
			if len(l.args) == 0 {
				t.Errorf("%s: no command", where)
				continue
			}
			t.Logf("%s", where)
			switch l.args[0] {
			case "server", "serve":
				r := cli(t, l.env, append(l.args, "--help")...)
				if r.code != 0 {
					t.Errorf("%s\n  with --help: exit %d: %s", where, r.code, r.stderr)
				}
				for _, kv := range l.env {
					name, _, _ := strings.Cut(kv, "=")
					if strings.HasPrefix(name, "TICKETING_") && !regexp.MustCompile(`\b`+name+`\b`).MatchString(serverHelp.stdout+serverHelp.stderr) {
						t.Errorf("%s\n  sets %s, which `ticketing server --help` does not name", where, name)
					}
				}
			case "deploy":
				r := cli(t, l.env, l.args...)
				missingFile := r.code == 1 && regexp.MustCompile(`--(token-file|cluster-secret-file).*no such file`).MatchString(r.stderr)
				if r.code != 0 && !missingFile || r.code == 0 && strings.TrimSpace(r.stdout) == "" {
					t.Errorf("%s\n  exit %d: %s", where, r.code, r.stderr)
				}
			default:
				r := cli(t, append(env, l.env...), l.args...)
				if r.code == ExitUsage {
					t.Errorf("%s\n  exit 2 (bad arguments): %s", where, r.stderr)
				}
			}
		}
	}
}

// docLine is one command line found in a document: the line it starts on, its text, the
// variables set before the command, and the arguments after `ticketing`.
type docLine struct {
	line int
	text string
	env  []string
	args []string
}

var envAssignRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// docCommandLines finds the command lines of the fenced code blocks of a Markdown text. In a
// block where some lines start with a prompt (`$ `), only those are commands (the rest is their
// output); elsewhere every line is. Lines ending in `\` continue on the next; `# ...` is a
// comment; a pipe or a redirection ends the command.
func docCommandLines(text string) ([]docLine, error) {
	var out []docLine
	var errs []string
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(strings.TrimSpace(lines[i]), "```") {
			continue
		}
		start := i + 1
		end := start
		for end < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[end]), "```") {
			end++
		}
		block := lines[start:end]
		i = end
		prompted := false
		for _, l := range block {
			prompted = prompted || strings.HasPrefix(strings.TrimSpace(l), "$ ")
		}
		for j := 0; j < len(block); j++ {
			first := j
			l := strings.TrimSpace(block[j])
			if prompted {
				if !strings.HasPrefix(l, "$ ") {
					continue
				}
				l = strings.TrimPrefix(l, "$ ")
			}
			for strings.HasSuffix(l, `\`) && j+1 < len(block) {
				j++
				l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(block[j])
			}
			words, err := shellWords(l)
			if err != nil {
				if strings.Contains(l, "ticketing ") {
					errs = append(errs, fmt.Sprintf("line %d: %s: %v", start+first+1, l, err))
				}
				continue
			}
			var env []string
			for len(words) > 0 && envAssignRE.MatchString(words[0]) {
				env, words = append(env, words[0]), words[1:]
			}
			if len(words) == 0 || (words[0] != "ticketing" && words[0] != "bin/ticketing") {
				continue
			}
			out = append(out, docLine{line: start + first + 1, text: l, env: env, args: words[1:]})
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("lines that cannot be checked:\n%s", strings.Join(errs, "\n"))
	}
	return out, nil
}

// shellWords splits a command line as a POSIX shell would, for plain commands: quotes and
// backslashes, a comment, and the end of the command at an unquoted |, ;, &, < or >. Unquoted
// $ and ` (expansions) are refused: such a line cannot be checked as written.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !inWord:
			return words, nil
		case strings.IndexByte("|;&<>", c) >= 0:
			flush()
			return words, nil
		case c == '$' || c == '`':
			return nil, fmt.Errorf("an unquoted %c", c)
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated '")
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			for i++; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '$' || line[i] == '`' {
					return nil, fmt.Errorf("an expansion in double quotes")
				}
				if line[i] == '\\' && i+1 < len(line) && strings.IndexByte("\"\\$`", line[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(line[i])
			}
			if i >= len(line) {
				return nil, fmt.Errorf("unterminated \"")
			}
			inWord = true
		case c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
			inWord = true
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words, nil
}

// TestShellWords: the splitter reads the lines the docs use as a shell would.
func TestShellWords(t *testing.T) {
	for in, want := range map[string]string{
		`ticketing deploy --only systemd                    # one output only`:    `ticketing|deploy|--only|systemd`,
		`bin/ticketing lock daily-batch -- sh -c 'echo "token $X"; sleep 2'`:      `bin/ticketing|lock|daily-batch|--|sh|-c|echo "token $X"; sleep 2`,
		`A=1 B="x y" ticketing server`:                                            `A=1|B=x y|ticketing|server`,
		`ticketing deploy --only systemd > /etc/systemd/system/ticketing.service`: `ticketing|deploy|--only|systemd`,
		`ticketing acquire a\ b --lease=30s`:                                      `ticketing|acquire|a b|--lease=30s`,
	} {
		got, err := shellWords(in)
		if err != nil || strings.Join(got, "|") != want {
			t.Errorf("%s: %q %v, want %s", in, got, err, want)
		}
	}
	if _, err := shellWords(`ticketing release k "$TOKEN"`); err == nil {
		t.Error("an expansion was not refused")
	}
}
