package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
)

// The driver's own tests: a short session against a real server, and its error mapping. The
// conformance runner (tests/conformance) is what checks the client through it.

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}

// session runs the driver on pipes.
type session struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
	id  int
}

func startSession(t *testing.T) *session {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	d := newDriver(outW)
	done := make(chan int, 1)
	go func() { done <- d.run(inR); outW.Close() }()
	t.Cleanup(func() {
		inW.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the driver did not exit when stdin closed")
		}
	})
	return &session{t: t, in: inW, out: bufio.NewScanner(outR)}
}

// do sends a command and returns its reply, collecting lost events seen meanwhile.
func (s *session) do(op string, args map[string]any, events *[]map[string]any) map[string]any {
	s.t.Helper()
	s.id++
	cmd := map[string]any{"id": s.id, "op": op}
	for k, v := range args {
		cmd[k] = v
	}
	b, _ := json.Marshal(cmd)
	if _, err := s.in.Write(append(b, '\n')); err != nil {
		s.t.Fatal(err)
	}
	for s.out.Scan() {
		var m map[string]any
		if err := json.Unmarshal(s.out.Bytes(), &m); err != nil {
			s.t.Fatalf("driver wrote %q: %v", s.out.Text(), err)
		}
		if _, ok := m["event"]; ok {
			if events != nil {
				*events = append(*events, m)
			}
			continue
		}
		if m["id"] != float64(s.id) {
			s.t.Fatalf("reply %v to command %d", m, s.id)
		}
		return m
	}
	s.t.Fatal("driver output ended")
	return nil
}

func errKind(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	k, _ := e["kind"].(string)
	return k
}

func TestDriverSession(t *testing.T) {
	srv := testserver.Start(t, testserver.Config{Bin: os.Getenv("TICKETING_BIN")})
	s := startSession(t)
	if r := s.do("hello", nil, nil); r["language"] != "go" || r["ok"] != true {
		t.Fatalf("hello: %v", r)
	}
	r := s.do("connect", map[string]any{"client": "A", "endpoints": []string{srv.Addr}, "token": nil, "tls": nil}, nil)
	if sid, _ := r["session_id"].(string); len(sid) != 32 {
		t.Fatalf("connect: %v", r)
	}
	r = s.do("acquire", map[string]any{"client": "A", "key": "k", "lease_ms": 150, "wait_ms": nil, "keepalive": false, "lock": "l1"}, nil)
	if tok, _ := r["token"].(string); tok == "" || r["lease_ms"] != float64(150) {
		t.Fatalf("acquire: %v", r)
	}
	var events []map[string]any
	deadline := time.Now().Add(10 * time.Second)
	for len(events) == 0 && time.Now().Before(deadline) {
		s.do("ping", map[string]any{"client": "A"}, &events)
		time.Sleep(20 * time.Millisecond)
	}
	if len(events) != 1 || events[0]["lock"] != "l1" || events[0]["reason"] != "expired" {
		t.Fatalf("lost events: %v", events)
	}
	if r := s.do("lock_state", map[string]any{"lock": "l1"}, nil); r["lost"] != true || r["reason"] != "expired" {
		t.Fatalf("lock_state: %v", r)
	}
	if r := s.do("release", map[string]any{"lock": "l1"}, nil); errKind(r) != "lock_lost" {
		t.Fatalf("release of a lost lock: %v", r)
	}
	for _, tc := range []struct {
		op   string
		args map[string]any
		kind string
	}{
		{"acquire", map[string]any{"client": "A", "key": "", "lease_ms": 1000, "lock": "x"}, "invalid_argument"},
		{"acquire", map[string]any{"client": "A", "key": "k", "lease_ms": -5, "lock": "x"}, "invalid_argument"},
		{"acquire", map[string]any{"client": "A", "key": "k", "lease_ms": 1000, "wait_ms": -5, "lock": "x"}, "invalid_argument"},
		{"release_token", map[string]any{"client": "A", "key": "k", "token": "0"}, "invalid_argument"},
		{"release_token", map[string]any{"client": "A", "key": "k", "token": "12"}, "not_held"},
	} {
		if r := s.do(tc.op, tc.args, nil); errKind(r) != tc.kind {
			t.Errorf("%s %v: %v, want %s", tc.op, tc.args, r, tc.kind)
		}
	}
	r = s.do("try_acquire", map[string]any{"client": "A", "key": "k", "lease_ms": 60000, "lock": "l2"}, nil)
	if r["acquired"] != true {
		t.Fatalf("try_acquire: %v", r)
	}
	if r := s.do("try_acquire", map[string]any{"client": "A", "key": "k", "lease_ms": 60000, "lock": "l3"}, nil); r["acquired"] != false {
		t.Fatalf("try_acquire of a held key: %v", r)
	}
	if r := s.do("inspect", map[string]any{"client": "A", "key_hex": fmt.Sprintf("%x", "k")}, nil); r["held"] != true {
		t.Fatalf("inspect: %v", r)
	}
	if r := s.do("verify", map[string]any{"lock": "l2"}, nil); r["held"] != true {
		t.Fatalf("verify: %v", r)
	}
	if r := s.do("release", map[string]any{"lock": "l2"}, nil); r["ok"] != true {
		t.Fatalf("release: %v", r)
	}
	if r := s.do("reset", nil, nil); r["ok"] != true {
		t.Fatalf("reset: %v", r)
	}
	if r := s.do("ping", map[string]any{"client": "A"}, nil); r["ok"] != false || !strings.Contains(fmt.Sprint(r["error"]), "no client") {
		t.Fatalf("ping after reset: %v", r)
	}
	if r := s.do("exit", nil, nil); r["ok"] != true {
		t.Fatalf("exit: %v", r)
	}
}
