//go:build unix

package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// The watchdog of `ticketing lock`: this binary re-executed as `ticketing __supervise`, in a
// process group of its own (so that terminal job control and Ctrl-C do not reach it). It starts
// COMMAND as its child, in COMMAND's own process group, and holds the lock's deadlines: at the
// deadline minus --kill-grace it sends SIGTERM, half the grace later SIGKILL, unless `ticketing
// lock` moved the deadlines after a successful extend. So COMMAND is gone before the lock's
// deadline even if `ticketing lock` is stopped (SIGSTOP) or killed; if it dies, COMMAND gets
// SIGTERM at once. It undoes job-control stops of COMMAND (SIGCONT): a command holding a lock
// is not suspended.
//
// Protocol, one line per message. From `ticketing lock` on fd 3:
//
//	start {"argv":[...],"env":[...],"grace_ns":N,"term_at":T,"kill_at":K}
//	sched T K        new deadlines (after an extend)
//	term K           SIGTERM now, SIGKILL at K
//	signal N         forward signal N
//	(end of file)    `ticketing lock` is gone: SIGTERM now
//
// To `ticketing lock` on fd 4: "started PID", "error CODE MESSAGE", "stopped SIGNAL",
// "term WHO", "kill", "exit CODE". Times are CLOCK_BOOTTIME nanoseconds (on Linux; elsewhere
// the wall clock), which keeps counting while the machine sleeps, as the server's lease does.

// startMsg is the "start" message.
type startMsg struct {
	Argv       []string `json:"argv"`
	Env        []string `json:"env"`
	Foreground bool     `json:"foreground"`
	GraceNs    int64    `json:"grace_ns"`
	TermAt     int64    `json:"term_at"`
	KillAt     int64    `json:"kill_at"`
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT", syscall.SIGKILL: "SIGKILL",
	syscall.SIGTERM: "SIGTERM", syscall.SIGSTOP: "SIGSTOP", syscall.SIGTSTP: "SIGTSTP", syscall.SIGTTIN: "SIGTTIN",
	syscall.SIGTTOU: "SIGTTOU", syscall.SIGCONT: "SIGCONT", syscall.SIGUSR1: "SIGUSR1", syscall.SIGUSR2: "SIGUSR2",
}

// jobStopSignal is the job-control stop that `ticketing lock` refuses (Ctrl-Z).
var jobStopSignal os.Signal = syscall.SIGTSTP

// ignoreJobControlOutput keeps this process from being stopped by terminal I/O in the
// background (its COMMAND has the terminal): writes then proceed and reads fail.
func ignoreJobControlOutput() { signal.Ignore(syscall.SIGTTIN, syscall.SIGTTOU) }

// inTerminalForeground reports whether stdin is a terminal whose foreground process group is
// ours: then COMMAND runs in the foreground, so that it can read the terminal and Ctrl-C
// reaches it.
func inTerminalForeground() bool {
	var pgrp int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp)))
	return errno == 0 && int(pgrp) == syscall.Getpgrp()
}

// toBoot converts a local time to the watchdog's clock.
func toBoot(t time.Time) int64 { return bootNanos() + int64(time.Until(t)) }

// watchdog is `ticketing lock`'s side of the watchdog process.
type watchdog struct {
	cmd *exec.Cmd
	fg  bool
	ctl *os.File
	ev  chan runnerEvent
	pid chan int // the "started" answer
	mu  sync.Mutex
}

func newRunner(foreground bool) (commandRunner, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	cmd := exec.Command(self, SuperviseCommand)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{ctlR, evW} // fd 3 and 4
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	ctlR.Close()
	evW.Close()
	if err != nil {
		ctlW.Close()
		evR.Close()
		return nil, err
	}
	w := &watchdog{cmd: cmd, fg: foreground, ctl: ctlW, ev: make(chan runnerEvent, 16), pid: make(chan int, 1)}
	go w.read(evR)
	return w, nil
}

// read turns the watchdog's lines into events; "gone" if it ends without reporting COMMAND's
// exit.
func (w *watchdog) read(r *os.File) {
	defer r.Close()
	exited := false
	for line := range readLines(r) {
		verb, rest, _ := strings.Cut(line, " ")
		switch verb {
		case "started":
			pid, _ := strconv.Atoi(rest)
			w.pid <- pid
		case "error":
			code, msg, _ := strings.Cut(rest, " ")
			n, _ := strconv.Atoi(code)
			w.ev <- runnerEvent{kind: "error", code: n, text: msg}
		case "exit":
			n, _ := strconv.Atoi(rest)
			exited = true
			w.ev <- runnerEvent{kind: "exit", code: n}
		case "stopped", "term", "kill":
			w.ev <- runnerEvent{kind: verb, text: rest}
		}
	}
	err := w.cmd.Wait()
	if !exited {
		w.ev <- runnerEvent{kind: "gone", text: fmt.Sprint(err)}
	}
	close(w.ev)
}

func (w *watchdog) send(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(w.ctl, format+"\n", args...)
}

func (w *watchdog) start(argv, env []string, grace time.Duration, termAt, killAt time.Time) (int, error) {
	b, _ := json.Marshal(startMsg{Argv: argv, Env: env, Foreground: w.fg, GraceNs: int64(grace), TermAt: toBoot(termAt), KillAt: toBoot(killAt)})
	w.send("start %s", b)
	select {
	case <-w.pid:
		return 0, nil
	case ev, ok := <-w.ev:
		if ok && ev.kind == "error" {
			return ev.code, errors.New(ev.text)
		}
		return ExitUnavailable, fmt.Errorf("the watchdog process ended before starting COMMAND (%s)", ev.text)
	}
}

func (w *watchdog) schedule(termAt, killAt time.Time) {
	w.send("sched %d %d", toBoot(termAt), toBoot(killAt))
}

func (w *watchdog) terminate(killAt time.Time) { w.send("term %d", toBoot(killAt)) }

func (w *watchdog) signal(sig syscall.Signal) { w.send("signal %d", int(sig)) }

func (w *watchdog) events() <-chan runnerEvent { return w.ev }

// close ends the control stream (the watchdog exits once COMMAND has; before "start", at once)
// and waits a little for it.
func (w *watchdog) close() {
	w.mu.Lock()
	w.ctl.Close()
	w.mu.Unlock()
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case _, ok := <-w.ev:
			if !ok {
				return
			}
		case <-t.C:
			return
		}
	}
}

// RunSupervisor is the watchdog process, `ticketing __supervise` (SuperviseCommand), started
// by `ticketing lock` with its pipes on fd 3 and 4; it returns the process exit code.
func RunSupervisor() int {
	ctl, evf := os.NewFile(3, "control"), os.NewFile(4, "events")
	if ctl == nil || evf == nil {
		fmt.Fprintln(os.Stderr, "ticketing: __supervise is started by `ticketing lock`, not by hand")
		return ExitUsage
	}
	emit := func(format string, args ...any) { fmt.Fprintf(evf, format+"\n", args...) }
	// Terminal signals do not reach this process group; signals sent to it on purpose go to
	// COMMAND, stops are refused. Caught (not ignored), so that COMMAND starts with the defaults.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU)
	lines := readLines(ctl)
	first, ok := <-lines
	verb, arg, _ := strings.Cut(first, " ")
	if !ok || verb != "start" {
		return ExitOK // the lock was not acquired: nothing to run
	}
	var st startMsg
	if err := json.Unmarshal([]byte(arg), &st); err != nil || len(st.Argv) == 0 {
		emit("error %d bad start message", ExitUnavailable)
		return ExitUnavailable
	}
	path, err := exec.LookPath(st.Argv[0])
	if err != nil {
		code := 127
		if errors.Is(err, os.ErrPermission) {
			code = 126
		}
		emit("error %d %s", code, strings.ReplaceAll(err.Error(), "\n", " "))
		return ExitOK
	}
	attr := &os.ProcAttr{
		Env:   append(os.Environ(), st.Env...),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   commandProcAttr(st.Foreground),
	}
	p, err := os.StartProcess(path, st.Argv, attr)
	if err != nil {
		emit("error 126 %s", strings.ReplaceAll(err.Error(), "\n", " "))
		return ExitOK
	}
	pid := p.Pid
	emit("started %d", pid)

	statuses := make(chan syscall.WaitStatus, 4)
	go func() {
		defer close(statuses)
		for {
			var ws syscall.WaitStatus
			_, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED|syscall.WCONTINUED, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				return
			}
			statuses <- ws
			if ws.Exited() || ws.Signaled() {
				return
			}
		}
	}()

	var (
		termAt, killAt     = st.TermAt, st.KillAt
		grace              = st.GraceNs
		termSent, killSent bool
		exited             bool
		stops              []int64
		// The deadlines are boot-clock instants, which go on through a suspend where Go's timers
		// (monotonic) stop: the watchdog sleeps until the next one is due, but never longer than
		// period, so that one passed during a suspend is acted on at most period after it. A plain
		// tick of period was up to 100 ms late, out of the half grace (300 ms for 600) that
		// SIGKILL has before the deadline.
		period = time.Duration(max(min(grace/10, int64(100*time.Millisecond)), int64(time.Millisecond)))
		tick   = time.NewTimer(period)
	)
	defer tick.Stop()
	next := func() time.Duration {
		d := period
		switch now := bootNanos(); {
		case !termSent:
			d = min(d, time.Duration(termAt-now))
		case !killSent:
			d = min(d, time.Duration(killAt-now))
		}
		return max(d, 0)
	}
	group := func(sig syscall.Signal) {
		if !exited {
			syscall.Kill(-pid, sig)
		}
	}
	terminate := func(who string, kill int64) {
		killAt = min(killAt, kill)
		if termSent {
			return
		}
		termSent = true
		group(syscall.SIGTERM)
		group(syscall.SIGCONT) // a stopped process handles SIGTERM only once continued
		emit("term %s", who)
	}
	for {
		tick.Reset(next())
		select {
		case ws, ok := <-statuses:
			switch {
			case !ok:
				exited = true
				emit("exit %d", ExitUnavailable)
				return ExitOK
			case ws.Exited():
				exited = true
				emit("exit %d", ws.ExitStatus())
				return ExitOK
			case ws.Signaled():
				exited = true
				emit("exit %d", 128+int(ws.Signal()))
				return ExitOK
			case ws.Stopped():
				group(syscall.SIGCONT)
				now := bootNanos()
				stops = append(stops, now)
				for len(stops) > 0 && stops[0] < now-int64(time.Second) {
					stops = stops[1:]
				}
				emit("stopped %s", signalName(ws.StopSignal()))
				if len(stops) >= 5 {
					// Stopped again and again (a background read of the terminal): it cannot run.
					terminate("stopped repeatedly", now+grace/2)
				}
			}
		case line, ok := <-lines:
			if !ok {
				lines = nil
				terminate("ticketing lock is gone", bootNanos()+grace/2)
				continue
			}
			verb, arg, _ := strings.Cut(line, " ")
			f := strings.Fields(arg)
			num := func(i int) int64 {
				if i >= len(f) {
					return 0
				}
				n, _ := strconv.ParseInt(f[i], 10, 64)
				return n
			}
			switch verb {
			case "sched":
				if !termSent {
					termAt, killAt = num(0), num(1)
				}
			case "term":
				terminate("requested", num(0))
			case "signal":
				group(syscall.Signal(num(0)))
			}
		case s := <-sigs:
			switch s {
			case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP:
				group(s.(syscall.Signal))
			}
		case <-tick.C:
			now := bootNanos()
			if !termSent && now >= termAt {
				terminate("watchdog", killAt)
			}
			if termSent && !killSent && now >= killAt {
				killSent = true
				group(syscall.SIGKILL)
				emit("kill")
			}
		}
	}
}
