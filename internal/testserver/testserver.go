// Package testserver builds the ticketing binary once per test process and runs real servers on
// loopback for integration tests (the Go client's and the CLI's). It also offers Proxy, a TCP
// relay a test can cut to simulate a network partition.
//
// Typical use:
//
//	func TestMain(m *testing.M) { code := m.Run(); testserver.Cleanup(); os.Exit(code) }
//
//	func TestX(t *testing.T) {
//		srv := testserver.Start(t, testserver.Config{})
//		... srv.Addr ...
//	}
package testserver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StartTimeout bounds how long Start waits for the server's "listening" log line.
const StartTimeout = 30 * time.Second

// StopTimeout bounds how long Stop waits after SIGTERM before it sends SIGKILL.
const StopTimeout = 15 * time.Second

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

// RepoRoot is the module root (the directory holding go.mod), found from this file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Binary builds ./cmd/ticketing once per process (into a temporary directory removed by
// Cleanup) and returns the path of the executable.
func Binary() (string, error) {
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "ticketing-bin-")
		if buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "ticketing")
		cmd := exec.Command("go", "build", "-o", buildBin, "./cmd/ticketing")
		cmd.Dir = RepoRoot()
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/ticketing: %v\n%s", err, out)
		}
	})
	return buildBin, buildErr
}

// Cleanup removes the binary built by Binary. Call it from TestMain after m.Run.
func Cleanup() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

// TLSCert, TLSKey and TLSCA are the test-only TLS files of testdata/tls: a certificate for
// localhost/127.0.0.1/::1 and the CA that signed it.
func TLSCert() string { return filepath.Join(RepoRoot(), "testdata", "tls", "server.pem") }
func TLSKey() string  { return filepath.Join(RepoRoot(), "testdata", "tls", "server.key") }
func TLSCA() string   { return filepath.Join(RepoRoot(), "testdata", "tls", "ca.pem") }

// Config describes a server to start. The zero value is a plain TCP server without auth on a
// free loopback port with a fresh data directory.
type Config struct {
	Addr    string   // listen address; default "127.0.0.1:0" (a free port)
	DataDir string   // default: a new temporary directory
	Token   string   // TICKETING_TOKEN; "" = no auth
	TLS     bool     // serve TLS with testdata/tls/server.pem
	Env     []string // extra KEY=VALUE settings (TICKETING_LOCK_DELAY=..., TICKETING_MAX_LEASE=...)
}

// Server is a running ticketing server process.
type Server struct {
	Addr    string // host:port it listens on
	DataDir string
	cfg     Config
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error

	mu  sync.Mutex
	log bytes.Buffer // everything it wrote to stderr
}

// Start starts a server and waits until it listens. With a *testing.T it fails the test on error
// and registers Stop (and the server's log on failure) with t.Cleanup.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	s, err := StartProcess(cfg)
	if err != nil {
		t.Fatalf("testserver: %v", err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("server %s log:\n%s", s.Addr, s.Log())
		}
	})
	return s
}

// StartProcess is Start without a testing.TB (for TestMain and examples). An empty DataDir gets
// a temporary directory that the caller owns.
func StartProcess(cfg Config) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.DataDir == "" {
		if cfg.DataDir, err = os.MkdirTemp("", "ticketing-data-"); err != nil {
			return nil, err
		}
	}
	s := &Server{DataDir: cfg.DataDir, cfg: cfg}
	if err := s.start(bin, cfg.Addr); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) start(bin, addr string) error {
	cmd := exec.Command(bin, "server")
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TICKETING_") {
			env = append(env, kv)
		}
	}
	env = append(env, "TICKETING_ADDR="+addr, "TICKETING_DATA_DIR="+s.cfg.DataDir)
	if s.cfg.Token != "" {
		env = append(env, "TICKETING_TOKEN="+s.cfg.Token)
	}
	if s.cfg.TLS {
		env = append(env, "TICKETING_TLS_CERT="+TLSCert(), "TICKETING_TLS_KEY="+TLSKey())
	}
	cmd.Env = append(env, s.cfg.Env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	s.exited = make(chan struct{})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			s.log.WriteString(line)
			s.log.WriteByte('\n')
			s.mu.Unlock()
			if !sent && strings.Contains(line, "msg=listening") {
				if a := field(line, "addr"); a != "" {
					found <- a
					sent = true
				}
			}
		}
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	select {
	case a := <-found:
		s.Addr = a
		return nil
	case <-s.exited:
		return fmt.Errorf("server exited before listening (%v); log:\n%s", s.waitErr, s.Log())
	case <-time.After(StartTimeout):
		s.Kill()
		return fmt.Errorf("server did not report listening within %v; log:\n%s", StartTimeout, s.Log())
	}
}

// field extracts key=value (value possibly quoted) from a log/slog text line.
func field(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		if j := strings.Index(v[1:], `"`); j >= 0 {
			return v[1 : j+1]
		}
		return ""
	}
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}

// PID is the server's process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Log returns what the server wrote to stderr so far.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// Exited is closed when the server process has exited.
func (s *Server) Exited() <-chan struct{} { return s.exited }

// Stop sends SIGTERM to the server's process (by PID) and waits for it to exit (SIGKILL after StopTimeout).
// It returns the process's exit error (nil for a clean exit). Stopping twice is harmless.
func (s *Server) Stop() error {
	select {
	case <-s.exited:
		return s.waitErr
	default:
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		_ = s.cmd.Process.Kill() // no SIGTERM on this platform
	}
	select {
	case <-s.exited:
		return s.waitErr
	case <-time.After(StopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return errors.New("testserver: server did not stop on SIGTERM; killed")
	}
}

// Kill sends SIGKILL (a crash) and waits for the process to exit.
func (s *Server) Kill() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Restart stops the server (if it runs) and starts it again on the same address and data
// directory.
func (s *Server) Restart() error {
	if err := s.Stop(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return err
		}
	}
	bin, err := Binary()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.log.WriteString("--- restart ---\n")
	s.mu.Unlock()
	// The port was just released; retry briefly in case the kernel has not freed it yet.
	deadline := time.Now().Add(5 * time.Second)
	for {
		err = s.start(bin, s.Addr)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
