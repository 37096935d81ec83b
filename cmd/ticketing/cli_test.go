package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
	"github.com/ticketing/ticketing/internal/testserver"
)

// The CLI tests run the built binary (testserver.Binary) against real servers. The test binary
// doubles as the COMMAND of `ticketing lock` (see childMain).

const bound = 15 * time.Second

func TestMain(m *testing.M) {
	if mode := os.Getenv("TICKETING_TEST_CHILD"); mode != "" {
		os.Exit(childMain(mode))
	}
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}

// childMain is the COMMAND run by `ticketing lock` in the tests; it reports through files named
// by TICKETING_TEST_OUT.
//   - "env": write "TOKEN KEY" and exit with TICKETING_TEST_EXIT;
//   - "sleep": write its pid, then sleep; on SIGTERM write OUT.term and exit 143;
//   - "stubborn": like sleep, but ignore SIGTERM (only SIGKILL stops it).
func childMain(mode string) int {
	out := os.Getenv("TICKETING_TEST_OUT")
	switch mode {
	case "env":
		os.WriteFile(out, []byte(os.Getenv("TICKETING_TOKEN_VALUE")+" "+os.Getenv("TICKETING_KEY")), 0o644)
		code, _ := strconv.Atoi(os.Getenv("TICKETING_TEST_EXIT"))
		return code
	case "sleep", "stubborn":
		term := make(chan os.Signal, 1)
		if mode == "sleep" {
			signal.Notify(term, syscall.SIGTERM)
		} else {
			signal.Ignore(syscall.SIGTERM)
		}
		os.WriteFile(out+".tmp", []byte(strconv.Itoa(os.Getpid())), 0o644)
		os.Rename(out+".tmp", out)
		select {
		case <-term:
			os.WriteFile(out+".term", []byte(time.Now().Format(time.RFC3339Nano)), 0o644)
			return 143
		case <-time.After(time.Minute):
			return 0
		}
	}
	return 99
}

// cli runs the ticketing binary with args and env (TICKETING_* of the test's environment
// removed) and returns its exit code, stdout and stderr.
type cliResult struct {
	code           int
	stdout, stderr string
}

// syncBuffer is a bytes.Buffer safe to read while the process still writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func cliCmd(t *testing.T, env []string, args ...string) (*exec.Cmd, *syncBuffer, *syncBuffer) {
	t.Helper()
	bin, err := testserver.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TICKETING_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, errb := new(syncBuffer), new(syncBuffer)
	cmd.Stdout, cmd.Stderr = out, errb
	return cmd, out, errb
}

func cli(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	cmd, out, errb := cliCmd(t, env, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(bound):
		cmd.Process.Kill()
		<-done
		t.Fatalf("ticketing %v did not exit; stderr:\n%s", args, errb)
	}
	return cliResult{cmd.ProcessState.ExitCode(), out.String(), errb.String()}
}

func dialT(t *testing.T, addr string) *ticketing.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

func TestCLIRoundTrip(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{})
	env := []string{"TICKETING_ADDR=" + srv.Addr}

	r := cli(t, env, "ping")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "ok ") {
		t.Fatalf("ping: %+v", r)
	}
	r = cli(t, env, "acquire", "job", "--lease", "10s")
	if r.code != 0 {
		t.Fatalf("acquire: %+v", r)
	}
	token := strings.TrimSpace(r.stdout)
	if n, err := strconv.ParseUint(token, 10, 64); err != nil || n == 0 {
		t.Fatalf("acquire printed %q", r.stdout)
	}
	if r = cli(t, env, "acquire", "--wait", "0", "job"); r.code != 1 || !strings.Contains(r.stderr, "not acquired") {
		t.Fatalf("acquire of a held key: %+v", r)
	}
	if r = cli(t, env, "acquire", "job", "--wait", "100ms"); r.code != 1 {
		t.Fatalf("acquire with --wait: %+v", r)
	}
	if r = cli(t, env, "extend", "job", token, "--lease", "20s"); r.code != 0 {
		t.Fatalf("extend: %+v", r)
	}
	if r = cli(t, env, "inspect", "job"); r.code != 0 || !strings.Contains(r.stdout, "held=true token="+token+" ") {
		t.Fatalf("inspect: %+v", r)
	}
	if r = cli(t, env, "inspect", "--json", "job"); r.code != 0 || !strings.Contains(r.stdout, `"token":`+token) {
		t.Fatalf("inspect --json: %+v", r)
	}
	if r = cli(t, env, "release", "job", token); r.code != 0 {
		t.Fatalf("release: %+v", r)
	}
	if r = cli(t, env, "inspect", "job"); r.code != 0 || !strings.Contains(r.stdout, "held=false token=0 ") {
		t.Fatalf("inspect of a free key: %+v", r)
	}
	if r = cli(t, env, "release", "job", token); r.code != 1 || !strings.Contains(r.stderr, "not held") {
		t.Fatalf("second release: %+v", r)
	}
	if r = cli(t, env, "extend", "job", token); r.code != 1 {
		t.Fatalf("extend after release: %+v", r)
	}
	// --addr wins over TICKETING_ADDR; a comma-separated list tries each endpoint.
	if r = cli(t, []string{"TICKETING_ADDR=127.0.0.1:1"}, "ping", "--addr", "127.0.0.1:1,"+srv.Addr); r.code != 0 {
		t.Fatalf("ping with an endpoint list: %+v", r)
	}
	if r = cli(t, []string{"TICKETING_ADDR=127.0.0.1:1"}, "ping", "--timeout", "1s"); r.code != 3 || r.stderr == "" {
		t.Fatalf("ping of nothing: %+v", r)
	}
}

func TestCLIUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"acquire"}, 2, "missing KEY"},
		{[]string{"acquire", "a", "b"}, 2, "unexpected argument"},
		{[]string{"release", "k", "x"}, 2, "not a positive integer"},
		{[]string{"release", "k"}, 2, "missing TOKEN"},
		{[]string{"acquire", "--lease", "soon", "k"}, 2, "invalid value"},
		{[]string{"lock", "k"}, 2, "missing COMMAND"},
		{[]string{"lock", "k", "--lease", "1s", "--kill-grace", "600ms", "--", "true"}, 2, "kill-grace"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"acquire", "--help"}, 0, "usage: ticketing acquire KEY"},
		{[]string{"lock", "--help"}, 0, "TICKETING_TOKEN_VALUE"},
	} {
		r := cli(t, []string{"TICKETING_ADDR=127.0.0.1:1"}, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.msg)
		}
	}
}

func TestCLIAuthTLS(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{Token: "cli-token", TLS: true})
	env := []string{"TICKETING_ADDR=" + srv.Addr, "TICKETING_TOKEN=cli-token", "TICKETING_TLS_CA=" + testserver.TLSCA()}
	if r := cli(t, env, "ping"); r.code != 0 {
		t.Fatalf("ping over TLS with a token: %+v", r)
	}
	r := cli(t, env, "acquire", "k")
	if r.code != 0 {
		t.Fatalf("acquire: %+v", r)
	}
	if r := cli(t, env, "release", "k", strings.TrimSpace(r.stdout)); r.code != 0 {
		t.Fatalf("release: %+v", r)
	}
	bad := []string{"TICKETING_ADDR=" + srv.Addr, "TICKETING_TOKEN=wrong", "TICKETING_TLS_CA=" + testserver.TLSCA()}
	if r := cli(t, bad, "ping"); r.code != 3 || !strings.Contains(r.stderr, "authentication failed") {
		t.Fatalf("wrong token: %+v", r)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("cli-token\n"), 0o600)
	viaFile := []string{"TICKETING_TOKEN_FILE=" + tokenFile}
	if r := cli(t, viaFile, "ping", "--addr", srv.Addr, "--tls-ca", testserver.TLSCA()); r.code != 0 {
		t.Fatalf("token file and flags: %+v", r)
	}
}

func TestCLILockPassesTokenAndExitCode(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{})
	c := dialT(t, srv.Addr)
	out := filepath.Join(t.TempDir(), "env")
	self, _ := os.Executable()
	env := []string{"TICKETING_ADDR=" + srv.Addr, "TICKETING_TEST_CHILD=env", "TICKETING_TEST_OUT=" + out, "TICKETING_TEST_EXIT=7"}
	r := cli(t, env, "lock", "batch", "--lease", "5s", "--", self)
	if r.code != 7 {
		t.Fatalf("lock: exit %d, want the command's 7; %+v", r.code, r)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	tok, key, _ := strings.Cut(string(b), " ")
	if n, err := strconv.ParseUint(tok, 10, 64); err != nil || n == 0 || key != "batch" {
		t.Fatalf("the command saw TICKETING_TOKEN_VALUE=%q TICKETING_KEY=%q", tok, key)
	}
	// Released on exit.
	lk, err := c.TryAcquire(ctxT(t), "batch", time.Second)
	if err != nil {
		t.Fatalf("key not released after lock: %v", err)
	}
	if n, _ := strconv.ParseUint(tok, 10, 64); lk.Token() <= n {
		t.Errorf("token %d after the command's %d", lk.Token(), n)
	}
	lk.Release(ctxT(t))

	// A missing command: 127, and the lock is released.
	if r := cli(t, []string{"TICKETING_ADDR=" + srv.Addr}, "lock", "batch", "--", "/nonexistent/command"); r.code != 127 {
		t.Fatalf("missing command: %+v", r)
	}
	// Not acquired: 1, the command does not run.
	holder, err := c.TryAcquire(ctxT(t), "batch", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(out)
	if r := cli(t, env, "lock", "batch", "--wait", "0", "--", self); r.code != 1 {
		t.Fatalf("lock of a held key: %+v", r)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("the command ran without the lock")
	}
	holder.Release(ctxT(t))
}
