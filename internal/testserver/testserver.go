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

// Cleanup removes the binary built by Binary and the generated test certificates. Call it
// from TestMain after m.Run.
func Cleanup() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	if tlsDir != "" {
		os.RemoveAll(tlsDir)
	}
}

// TLSCert, TLSKey and TLSCA are test-only TLS files, generated once per process (GenerateTLS)
// into a temporary directory that Cleanup removes: a certificate for localhost/127.0.0.1/::1
// and the CA that signed it. No private key is committed to the repository.
func TLSCert() string { return defaultTLS().ServerCert }
func TLSKey() string  { return defaultTLS().ServerKey }
func TLSCA() string   { return defaultTLS().CA }

var (
	tlsOnce  sync.Once
	tlsDir   string
	tlsFiles *TLSFiles
)

// DefaultTLS returns the process's generated test certificates (see TLSCert), including the
// client certificate and its CA for mutual TLS.
func DefaultTLS() *TLSFiles { return defaultTLS() }

func defaultTLS() *TLSFiles {
	tlsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ticketing-tls-")
		if err == nil {
			tlsDir = dir
			tlsFiles, err = GenerateTLS(dir)
		}
		if err != nil {
			panic("testserver: generating test certificates: " + err.Error())
		}
	})
	return tlsFiles
}

// Config describes a server to start. The zero value is a plain TCP server without auth on a
// free loopback port with a fresh data directory.
type Config struct {
	Addr    string   // listen address; default "127.0.0.1:0" (a free port)
	DataDir string   // default: a new temporary directory
	Token   string   // TICKETING_TOKEN; "" = no auth
	TLS     bool     // serve TLS with TLSCert and TLSKey (generated test certificates)
	Env     []string // extra KEY=VALUE settings (TICKETING_LOCK_DELAY=..., TICKETING_MAX_LEASE=...)

	// Bin is the ticketing binary to run; default: Binary() (built from this checkout).
	Bin string
	// TLSCert and TLSKey, when set, serve TLS with these PEM files (see GenerateTLS) instead of
	// the process's default ones; TLSClientCA (TICKETING_TLS_CLIENT_CA) requires client
	// certificates.
	TLSCert, TLSKey, TLSClientCA string
}

// Server is a running ticketing server process.
type Server struct {
	Addr    string // host:port it listens on
	DataDir string
	cfg     Config
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	exitAt  time.Time // when the process was seen to exit (valid once exited is closed)
	frozen  bool      // SIGSTOP sent and no SIGCONT since

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
	bin, err := cfg.binary()
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
	dieWithParent(cmd)
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
	switch {
	case s.cfg.TLSCert != "":
		env = append(env, "TICKETING_TLS_CERT="+s.cfg.TLSCert, "TICKETING_TLS_KEY="+s.cfg.TLSKey)
	case s.cfg.TLS:
		env = append(env, "TICKETING_TLS_CERT="+TLSCert(), "TICKETING_TLS_KEY="+TLSKey())
	}
	if s.cfg.TLSClientCA != "" {
		env = append(env, "TICKETING_TLS_CLIENT_CA="+s.cfg.TLSClientCA)
	}
	cmd.Env = append(env, s.cfg.Env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	s.mu.Lock()
	s.cmd, s.exited, s.frozen = cmd, exited, false
	s.mu.Unlock()
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
		s.exitAt = time.Now()
		close(exited)
	}()
	select {
	case a := <-found:
		s.Addr = a
		return nil
	case <-exited:
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

// PID is the server's process id (of the current process after a restart).
func (s *Server) PID() int { return s.proc().Process.Pid }

func (s *Server) proc() *exec.Cmd {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd
}

func (s *Server) exitedCh() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exited
}

// Log returns what the server wrote to stderr so far.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// Exited is closed when the server process has exited (the current process, after a restart).
func (s *Server) Exited() <-chan struct{} { return s.exitedCh() }

// ExitedAt is when the current process was seen to exit; zero while it runs.
func (s *Server) ExitedAt() time.Time {
	select {
	case <-s.exitedCh():
		return s.exitAt
	default:
		return time.Time{}
	}
}

// Stop sends SIGTERM to the server's process (by PID) and waits for it to exit (SIGKILL after StopTimeout).
// It returns the process's exit error (nil for a clean exit). Stopping twice is harmless. A
// frozen server is resumed (SIGCONT) so that it can handle the SIGTERM.
func (s *Server) Stop() error {
	return s.StopWithin(StopTimeout)
}

// StopWithin is Stop with its own bound before SIGKILL.
func (s *Server) StopWithin(d time.Duration) error {
	cmd, exited := s.proc(), s.exitedCh()
	select {
	case <-exited:
		return s.waitErr
	default:
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		_ = cmd.Process.Kill() // no SIGTERM on this platform
	}
	s.thaw(cmd)
	select {
	case <-exited:
		return s.waitErr
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-exited
		return errors.New("testserver: server did not stop on SIGTERM; killed")
	}
}

// Kill sends SIGKILL (a crash) and waits for the process to exit.
func (s *Server) Kill() {
	cmd, exited := s.proc(), s.exitedCh()
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Freeze stops the server process with SIGSTOP: it keeps its sockets but answers nothing (a
// frozen or half-dead server). Where /proc exists it returns once every thread of the process
// is stopped (the signal takes effect asynchronously). Thaw resumes it.
func (s *Server) Freeze() error {
	cmd := s.proc()
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	s.mu.Lock()
	s.frozen = true
	s.mu.Unlock()
	return waitStopped(cmd.Process.Pid, 5*time.Second)
}

// waitStopped polls /proc until every thread of pid is in state T (stopped); without /proc it
// returns at once.
func waitStopped(pid int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		if err != nil || len(tasks) == 0 {
			return nil // no /proc: nothing to wait for
		}
		stopped := true
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // the thread ended
			}
			// The state follows the ")" that ends the command name.
			if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
				stopped = false
				break
			}
		}
		if stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testserver: process %d not stopped %v after SIGSTOP", pid, within)
		}
		time.Sleep(time.Millisecond)
	}
}

// Thaw resumes a server stopped by Freeze (SIGCONT).
func (s *Server) Thaw() error { return s.thaw(s.proc()) }

func (s *Server) thaw(cmd *exec.Cmd) error {
	s.mu.Lock()
	frozen := s.frozen
	s.frozen = false
	s.mu.Unlock()
	if !frozen {
		return nil
	}
	return cmd.Process.Signal(syscall.SIGCONT)
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
	return s.Respawn()
}

// Respawn starts the server again on the same address and data directory after it has exited
// (Stop, Kill, or a crash); it fails if the process still runs.
func (s *Server) Respawn() error {
	select {
	case <-s.exitedCh():
	default:
		return errors.New("testserver: Respawn while the server runs")
	}
	bin, err := s.cfg.binary()
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

func (cfg *Config) binary() (string, error) {
	if cfg.Bin != "" {
		return cfg.Bin, nil
	}
	return Binary()
}
