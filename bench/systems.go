package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// server is one system under test: a child process on loopback that the harness started and
// stops by its PID.
type server struct {
	name string
	addr string // host:port the drivers connect to
	cmd  *exec.Cmd
	dir  string // its private temp dir (data, logs)
	log  *os.File
	done chan struct{} // closed when the process has exited

	mu    sync.Mutex
	admin string // Ticketing: the admin listener's address, from its log
}

// adminAddr is the admin listener's address logged by a Ticketing server ("" if none within 2 s).
func (s *server) adminAddr() string {
	for deadline := time.Now().Add(2 * time.Second); ; {
		s.mu.Lock()
		a := s.admin
		s.mu.Unlock()
		if a != "" || time.Now().After(deadline) || !s.alive() {
			return a
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mkdir(dir string) error { return os.MkdirAll(dir, 0o755) }

func (s *server) pid() int { return s.cmd.Process.Pid }

// freePort asks the kernel for a free loopback port. Another process could take it before the
// server binds it; start retries in that (rare) case.
func freePort() (int, error) { return freePortOn("127.0.0.1") }

// freePortOn returns a port on host (a loopback address) nobody listens on now.
func freePortOn(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// spawnCPUs, when set (-server-cpus), is the CPU list every server is started on (taskset -c).
var spawnCPUs string

// spawn starts name with args in dir; stdout and stderr go to dir/NAME.log (and, when
// listenLine is set, stderr is scanned for `msg=listening addr=...` first).
func spawn(name, dir string, env []string, listenLine bool, bin string, args ...string) (*server, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	if spawnCPUs != "" {
		// taskset sets the affinity and execs the server: the same process, every thread of it
		// on those CPUs.
		args = append([]string{"-c", spawnCPUs, bin}, args...)
		bin = "taskset"
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = logf
	// The child dies with the harness even if the harness is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr io.ReadCloser
	if listenLine {
		if stderr, err = cmd.StderrPipe(); err != nil {
			logf.Close()
			return nil, err
		}
	} else {
		cmd.Stderr = logf
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &server{name: name, cmd: cmd, dir: dir, log: logf, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(s.done)
	}()
	if listenLine {
		addrCh := make(chan string, 1)
		go func() {
			re := regexp.MustCompile(`msg=listening addr=(\S+)`)
			adminRe := regexp.MustCompile(`msg="admin listening" addr=(\S+)`)
			sc := bufio.NewScanner(stderr)
			found := false
			for sc.Scan() {
				line := sc.Text()
				fmt.Fprintln(logf, line)
				if m := adminRe.FindStringSubmatch(line); m != nil {
					s.mu.Lock()
					s.admin = m[1]
					s.mu.Unlock()
				}
				if m := re.FindStringSubmatch(line); m != nil && !found {
					found = true
					addrCh <- m[1]
				}
			}
			close(addrCh)
		}()
		select {
		case a, ok := <-addrCh:
			if !ok {
				s.stop()
				return nil, fmt.Errorf("%s exited before listening; see %s", name, logf.Name())
			}
			s.addr = a
		case <-time.After(15 * time.Second):
			s.stop()
			return nil, fmt.Errorf("%s did not log its listening address within 15s", name)
		}
	}
	return s, nil
}

// stop sends SIGTERM to the server's PID, then SIGKILL if it has not exited after 5 s.
func (s *server) stop() {
	if s == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
		}
	}
	s.log.Close()
}

func (s *server) alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func startTicketing(bin, dir string, extraEnv []string) (*server, error) {
	env := append([]string{
		"TICKETING_ADDR=127.0.0.1:0",
		"TICKETING_DATA_DIR=" + filepath.Join(dir, "data"),
	}, extraEnv...)
	return spawn("ticketing", dir, env, true, bin, "server")
}

func startNull(bin, dir string) (*server, error) {
	return spawn("null", dir, nil, true, bin, "-addr", "127.0.0.1:0")
}

func startRedis(dir string) (*server, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		// No persistence (the single Ticketing node keeps its table in memory too), one I/O thread
		// (the default), loopback only.
		s, err := spawn("redis", dir, nil, false, "redis-server",
			"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no",
			"--dir", dir, "--daemonize", "no", "--protected-mode", "yes", "--databases", "1",
			"--maxclients", "10000")
		if err != nil {
			return nil, err
		}
		s.addr = fmt.Sprintf("127.0.0.1:%d", port)
		if lastErr = waitRedis(s); lastErr == nil {
			return s, nil
		}
		s.stop()
	}
	return nil, lastErr
}

func waitRedis(s *server) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if !s.alive() {
			return fmt.Errorf("redis-server exited; see %s", s.log.Name())
		}
		if c, err := dialRedis(s.addr); err == nil {
			out, err := c.do("PING")
			c.Close()
			if err == nil && out == "PONG" {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("redis-server did not answer PING within 15s")
}

func startEtcd(dir string) (*server, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		cport, err := freePort()
		if err != nil {
			return nil, err
		}
		pport, err := freePort()
		if err != nil {
			return nil, err
		}
		curl := fmt.Sprintf("http://127.0.0.1:%d", cport)
		purl := fmt.Sprintf("http://127.0.0.1:%d", pport)
		data := filepath.Join(dir, fmt.Sprintf("etcd-data-%d", attempt))
		// A default single-member etcd (fsync on, as etcd is run in production).
		s, err := spawn("etcd", dir, nil, false, "etcd",
			"--name", "bench", "--data-dir", data,
			"--listen-client-urls", curl, "--advertise-client-urls", curl,
			"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
			"--initial-cluster", "bench="+purl, "--initial-cluster-state", "new",
			"--log-level", "warn", "--logger", "zap", "--quota-backend-bytes", strconv.Itoa(4<<30))
		if err != nil {
			return nil, err
		}
		s.addr = fmt.Sprintf("127.0.0.1:%d", cport)
		if lastErr = waitEtcd(s); lastErr == nil {
			return s, nil
		}
		s.stop()
	}
	return nil, lastErr
}

// newEtcdClient connects to addr: one endpoint, or a cluster's endpoints comma-separated.
func newEtcdClient(addr string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(addr, ","),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}

func waitEtcd(s *server) error {
	deadline := time.Now().Add(30 * time.Second)
	cli, err := newEtcdClient(s.addr)
	if err != nil {
		return err
	}
	defer cli.Close()
	for time.Now().Before(deadline) {
		if !s.alive() {
			return fmt.Errorf("etcd exited; see %s", s.log.Name())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Put(ctx, "/bench/ready", "1")
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("etcd did not accept a write within 30s")
}

// --- /proc readings -------------------------------------------------------------------------

// procStatusKB returns VmRSS and VmHWM of pid in KiB.
func procStatusKB(pid int) (rss, hwm int64) {
	m := procMem(pid)
	return m.rss, m.hwm
}

type memKB struct{ rss, hwm, anon, file int64 }

// procMem reads VmRSS, VmHWM, RssAnon and RssFile of pid in KiB.
func procMem(pid int) memKB {
	var m memKB
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		switch {
		case bytes.HasPrefix(line, []byte("VmRSS:")):
			m.rss = kbField(line)
		case bytes.HasPrefix(line, []byte("VmHWM:")):
			m.hwm = kbField(line)
		case bytes.HasPrefix(line, []byte("RssAnon:")):
			m.anon = kbField(line)
		case bytes.HasPrefix(line, []byte("RssFile:")):
			m.file = kbField(line)
		}
	}
	return m
}

func kbField(line []byte) int64 {
	f := strings.Fields(string(line))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.ParseInt(f[1], 10, 64)
	return n
}

// resetPeakRSS resets VmHWM to the current RSS (Linux: write 5 to clear_refs).
func resetPeakRSS(pid int) {
	os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// procCPUSeconds is utime+stime of pid (all its threads) in seconds.
func procCPUSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may contain spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return float64(ut+st) / clockTicks
}

const clockTicks = 100 // USER_HZ on Linux

// selfCPUSeconds is the harness's own user+system CPU time.
func selfCPUSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// monitor samples a server's RSS while a workload point runs and measures the CPU that the
// server and the harness used over the measured window.
type monitor struct {
	pid     int   // RSS sampled
	cpuPIDs []int // CPU counted
	stopCh  chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	maxRSS  int64
	anonAt  int64 // RssAnon and RssFile of the sample with the largest RSS
	fileAt  int64
	cpu0    float64
	self0   float64
	t0      time.Time
	cpuSrv  float64 // fraction of one core, over the window
	cpuSelf float64
}

func startMonitor(pids []int) *monitor {
	pid := pids[0]
	m := &monitor{pid: pid, cpuPIDs: pids, stopCh: make(chan struct{})}
	resetPeakRSS(pid)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			pm := procMem(pid)
			m.mu.Lock()
			if pm.rss > m.maxRSS {
				m.maxRSS, m.anonAt, m.fileAt = pm.rss, pm.anon, pm.file
			}
			m.mu.Unlock()
			select {
			case <-m.stopCh:
				return
			case <-t.C:
			}
		}
	}()
	return m
}

// windowStart and windowEnd bracket the measured part of a point for the CPU figures.
func (m *monitor) windowStart() {
	m.cpu0, m.self0, m.t0 = m.serverCPU(), selfCPUSeconds(), time.Now()
}

func (m *monitor) serverCPU() float64 {
	var s float64
	for _, p := range m.cpuPIDs {
		s += procCPUSeconds(p)
	}
	return s
}

func (m *monitor) windowEnd() {
	el := time.Since(m.t0).Seconds()
	if el > 0 {
		m.cpuSrv = (m.serverCPU() - m.cpu0) / el
		m.cpuSelf = (selfCPUSeconds() - m.self0) / el
	}
}

// stop ends sampling and returns the peak RSS in KiB (the larger of the samples and VmHWM).
func (m *monitor) stop() int64 {
	close(m.stopCh)
	m.wg.Wait()
	_, hwm := procStatusKB(m.pid)
	return max(m.maxRSS, hwm)
}
