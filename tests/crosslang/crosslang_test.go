//go:build crosslang

// Package crosslang checks that clients written in different languages queue fairly on one key.
// It needs the Python venv and the built JS client, so it runs from `make test` after their
// set-up (make test-crosslang), behind the crosslang build tag.
package crosslang

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
	"github.com/ticketing/ticketing/internal/testserver"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}

// waiter is one client process (or goroutine) waiting on the key.
type waiter struct {
	lang    string
	lines   chan string // "granted N", "released"
	release func()
}

func startProcess(t *testing.T, lang string, argv ...string) *waiter {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s waiter: %v", lang, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	w := &waiter{lang: lang, lines: make(chan string, 4), release: func() { io.WriteString(stdin, "release\n") }}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
	}()
	return w
}

func startGo(t *testing.T, addr, key string) *waiter {
	w := &waiter{lang: "go", lines: make(chan string, 4)}
	rel := make(chan struct{})
	w.release = func() { close(rel) }
	go func() {
		defer close(w.lines)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
		if err != nil {
			w.lines <- "error " + err.Error()
			return
		}
		defer c.Close()
		lk, err := c.Acquire(ctx, key, time.Minute)
		if err != nil {
			w.lines <- "error " + err.Error()
			return
		}
		w.lines <- fmt.Sprintf("granted %d", lk.Token())
		select {
		case <-rel:
		case <-ctx.Done():
		}
		lk.Release(ctx)
		w.lines <- "released"
	}()
	return w
}

func next(t *testing.T, w *waiter, d time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-w.lines:
		if !ok {
			t.Fatalf("%s waiter exited", w.lang)
		}
		return l
	case <-time.After(d):
		t.Fatalf("%s waiter: nothing within %v", w.lang, d)
	}
	return ""
}

// Go, Python and Node waiters queue on one key and are granted in arrival order, each with a
// larger token than the one before.
func TestCrossLanguageFIFO(t *testing.T) {
	root := testserver.RepoRoot()
	python := filepath.Join(root, "clients", "python", ".venv", "bin", "python")
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("python venv missing (run clients/python/test.sh first): %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "clients", "js", "dist", "esm", "index.js")); err != nil {
		t.Fatalf("JS client not built (run clients/js/test.sh first): %v", err)
	}
	srv := testserver.Start(t, testserver.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const key = "xlang-order-1234"
	holder, err := c.Acquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	here, _ := os.Getwd()
	order := []string{"python", "node", "go", "node", "python", "go"}
	var ws []*waiter
	for i, lang := range order {
		switch lang {
		case "go":
			ws = append(ws, startGo(t, srv.Addr, key))
		case "python":
			ws = append(ws, startProcess(t, lang, python, filepath.Join(here, "waiter.py"), srv.Addr, key))
		case "node":
			ws = append(ws, startProcess(t, lang, "node", filepath.Join(here, "waiter.mjs"), srv.Addr, key))
		}
		// Arrival order is the order the server queued them: wait until this one is queued.
		deadline := time.Now().Add(30 * time.Second)
		for {
			info, err := c.Inspect(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if info.Waiters == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s waiter %d not queued (queue length %d)", lang, i, info.Waiters)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	last := holder.Token()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i, w := range ws {
		line := next(t, w, 30*time.Second)
		tok, err := strconv.ParseUint(strings.TrimPrefix(line, "granted "), 10, 64)
		if !strings.HasPrefix(line, "granted ") || err != nil {
			t.Fatalf("waiter %d (%s): %q", i, w.lang, line)
		}
		if tok <= last {
			t.Fatalf("waiter %d (%s): token %d not above %d", i, w.lang, tok, last)
		}
		last = tok
		// Nobody behind it has been granted while it holds the lock.
		for _, o := range ws[i+1:] {
			select {
			case l := <-o.lines:
				t.Fatalf("%s waiter granted out of turn: %q", o.lang, l)
			default:
			}
		}
		t.Logf("granted in turn: %d %s token %d", i, w.lang, tok)
		w.release()
		if l := next(t, w, 30*time.Second); l != "released" {
			t.Fatalf("waiter %d (%s): %q", i, w.lang, l)
		}
	}
}
