package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing/ticketing/bench/internal/nullserver"
)

func (v *vectorFile) handshake(t *testing.T, name string) []byte {
	for _, h := range v.Handshake {
		if h.Name == name {
			b, err := hex.DecodeString(h.Hex)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatalf("no handshake vector %s", name)
	return nil
}

// fakeHandshake plays the server's side of the handshake on nc with the given frames, and
// returns the HELLO it read.
func fakeHandshake(t *testing.T, nc net.Conn, challenge, welcome []byte) []byte {
	hello := make([]byte, helloLen)
	if _, err := io.ReadFull(nc, hello); err != nil {
		t.Error(err)
		return nil
	}
	if _, err := nc.Write(challenge); err != nil {
		return hello
	}
	if welcome == nil {
		return hello
	}
	auth := make([]byte, authLen)
	if _, err := io.ReadFull(nc, auth); err != nil {
		t.Error(err)
		return hello
	}
	nc.Write(welcome)
	return hello
}

func TestHandshakeVectors(t *testing.T) {
	v := loadVectors(t)
	sid := [16]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	for _, tc := range []struct{ challenge, welcome string }{
		{"challenge_no_auth", "welcome_no_auth"}, {"challenge_no_auth", "welcome_resumed"},
	} {
		c, s := net.Pipe()
		helloCh := make(chan []byte, 1)
		go func() { helloCh <- fakeHandshake(t, s, v.handshake(t, tc.challenge), v.handshake(t, tc.welcome)) }()
		w, err := handshakeClient(c, sid, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", tc.welcome, err)
		}
		hello := <-helloCh
		// the HELLO up to its nonce (random) is the vector's
		if want := v.handshake(t, "hello"); !bytes.Equal(hello[:24], want[:24]) {
			t.Errorf("HELLO % x, want % x", hello[:24], want[:24])
		}
		if w.graceMs != 5000 || hex.EncodeToString(w.stateID[:]) != "606162636465666768696a6b6c6d6e6f" || w.resumed != (tc.welcome == "welcome_resumed") {
			t.Errorf("%s: decoded %+v", tc.welcome, w)
		}
		c.Close()
		s.Close()
	}
	for name, hint := range map[string]string{"challenge_not_leader": "127.0.0.2:7070", "challenge_not_leader_unknown": ""} {
		c, s := net.Pipe()
		go fakeHandshake(t, s, v.handshake(t, name), nil)
		_, err := handshakeClient(c, sid, 5*time.Second)
		var nl *notLeaderError
		if !errors.As(err, &nl) || nl.hint != hint {
			t.Errorf("%s: got %v, want NOT_LEADER with hint %q", name, err, hint)
		}
		c.Close()
		s.Close()
	}
	for _, name := range []string{"challenge_busy_connections", "challenge_unsupported_version"} {
		c, s := net.Pipe()
		go fakeHandshake(t, s, v.handshake(t, name), nil)
		if _, err := handshakeClient(c, sid, 5*time.Second); err == nil || !strings.Contains(err.Error(), "status") {
			t.Errorf("%s: got %v", name, err)
		}
		c.Close()
		s.Close()
	}
}

func TestResponseData(t *testing.T) {
	for _, v := range loadVectors(t).Responses {
		if v.Name != "goaway_leader_hint" && v.Name != "not_leader" {
			continue
		}
		b, _ := hex.DecodeString(v.Hex)
		var resp response
		data, err := readResponseData(bufio.NewReader(bytes.NewReader(b)), &resp, nil)
		if err != nil || string(data) != "127.0.0.2:7070" {
			t.Errorf("%s: %q %v", v.Name, data, err)
		}
	}
}

// strictServer is a fake Ticketing node that checks the session rules a bench connection
// follows: request ids increase from 1, at most one ACK in flight, an ACK at least every 1,024
// answers, and every ACK's token x safe (no RELEASE still unanswered below it) and current (above
// every RELEASE answered before the previous ACK's answer). It holds RELEASE answers back until
// a read finds nothing more (2 ms), so that RELEASEs are in flight when ACKs are computed.
type strictServer struct {
	t        *testing.T
	acks     atomic.Int64
	answers  atomic.Int64
	problems chan string
}

func (s *strictServer) serve(nc net.Conn, challenge, welcome []byte) {
	defer nc.Close()
	fakeHandshake(s.t, nc, challenge, welcome)
	fail := func(format string, args ...any) {
		select {
		case s.problems <- fmt.Sprintf(format, args...):
		default:
		}
	}
	r := bufio.NewReader(nc)
	var lastID, token uint64
	unanswered := map[uint64]bool{} // RELEASEs not answered yet
	var held []uint64               // RELEASE answers held back
	var floor uint64                // the next ACK's token must exceed this
	sinceAck := 0
	var out []byte
	answer := func(op byte, id, tok uint64) {
		out = appendRequest(out, op, id, tok, 0, 0, nil) // same 32-byte layout as an answer (status 0)
		sinceAck++
		s.answers.Add(1)
	}
	for {
		nc.SetReadDeadline(time.Now().Add(2 * time.Millisecond))
		h, err := r.Peek(hdrLen)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && len(h) == 0 {
				for _, id := range held {
					delete(unanswered, id)
					answer(opRelease, id, 0)
				}
				held = held[:0]
				if len(out) > 0 {
					if _, err := nc.Write(out); err != nil {
						return
					}
					out = out[:0]
				}
				continue
			}
			return
		}
		l := int(be.Uint32(h))
		frame := make([]byte, 4+l)
		if _, err := io.ReadFull(r, frame); err != nil {
			return
		}
		op, id, tok := frame[4], be.Uint64(frame[8:]), be.Uint64(frame[16:])
		if id <= lastID || (lastID == 0 && id != 1) {
			fail("request id %d after %d", id, lastID)
		}
		lastID = id
		switch op {
		case opAcquire:
			token++
			answer(opAcquire, id, token)
		case opRelease:
			unanswered[id] = true
			held = append(held, id)
		case opAck:
			for rid := range unanswered {
				if rid < tok {
					fail("ACK(%d) while RELEASE %d is unanswered", tok, rid)
				}
			}
			if tok <= floor {
				fail("ACK(%d): every RELEASE up to %d was answered before the previous ACK's answer", tok, floor)
			}
			if tok > id {
				fail("ACK(%d) above its own id %d", tok, id)
			}
			if sinceAck > 1024 {
				fail("%d answers before an ACK", sinceAck)
			}
			s.acks.Add(1)
			for _, hid := range held { // answers written before this ACK's
				delete(unanswered, hid)
				answer(opRelease, hid, 0)
			}
			held = held[:0]
			floor = lastID // every id up to here is answered once the ACK's answer is written
			for rid := range unanswered {
				floor = min(floor, rid-1)
			}
			sinceAck = 0
			answer(opAck, id, 0)
		default:
			fail("unexpected op %#x", op)
		}
		if r.Buffered() == 0 && len(out) > 0 { // ACQUIRE answers go out at once
			if _, err := nc.Write(out); err != nil {
				return
			}
			out = out[:0]
		}
	}
}

// runStrict runs system's driver (2 connections, depth 7: ACKs fall in either kind of batch)
// against a strictServer that answers the handshake with challenge and welcome, and fails t on
// the first rule broken.
func runStrict(t *testing.T, system string, challenge, welcome []byte, dur time.Duration) (*strictServer, *pointResult) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := &strictServer{t: t, problems: make(chan string, 1)}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(nc, challenge, welcome)
		}
	}()
	ws, err := pipelineWorkersAt(system, ln.Addr().String(), 2, 7, makeKeys("key", 64), "", false)
	if err != nil {
		t.Fatal(err)
	}
	res, err := runPoint(target{name: "fake", pids: []int{os.Getpid()}}, ws, 0, dur, 2*time.Second, true)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-s.problems:
		t.Fatal(p)
	default:
	}
	return s, res
}

func TestPipeFollowsSessionRules(t *testing.T) {
	v := loadVectors(t)
	s, res := runStrict(t, "ticketing", v.handshake(t, "challenge_no_auth"), v.handshake(t, "welcome_no_auth"), 700*time.Millisecond)
	// The rules need a few ACKs, not a rate: 1,000 ops (about 3,500 on a 2-vCPU machine with a
	// load average of 19, where 4,000 failed) already carry several.
	if res.ops < 1000 || s.acks.Load() < 5 || res.errs != 0 || res.acqHist.TotalCount() == 0 {
		t.Fatalf("%d ops, %d errors, %d ACKs, %d acquires timed: the run did not exercise the rules",
			res.ops, res.errs, s.acks.Load(), res.acqHist.TotalCount())
	}
}

func TestFindMetricsSetting(t *testing.T) {
	help := "  -max-output value\n    \tbytes queued (env TICKETING_MAX_OUTPUT, default \"4194304\")\n" +
		"  -admin-addr value\n    \tadmin listener (health, readiness, cluster membership, metrics): host:port (env TICKETING_ADMIN_ADDR, default \"\")\n" +
		"  -metrics value\n    \trecord request metrics (env TICKETING_METRICS, default \"false\")\n"
	env, def, ok := findMetricsSetting(help)
	if !ok || env != "TICKETING_METRICS" || def != "false" {
		t.Fatalf("got %q %q %v", env, def, ok)
	}
	if _, _, ok := findMetricsSetting(help[:strings.Index(help, "  -metrics")]); ok {
		t.Fatal("found a metrics setting in help without one")
	}
}

func TestFailoverStats(t *testing.T) {
	ms, med, lo, hi, failed := failoverStats([]failoverTrial{{ms: 900}, {ms: 1200}, {ms: -1}, {ms: 700}, {ms: 1500}})
	if len(ms) != 5 || med != 1050 || lo != 700 || hi != 1500 || failed != 1 {
		t.Fatalf("%v %v %v %v %v", ms, med, lo, hi, failed)
	}
}

// The harness speaks the protocol itself, so it checks itself against the repo's vectors.
type vectorFile struct {
	Handshake []struct {
		Name           string
		SessionIDHex   string `json:"session_id_hex"`
		SessionGraceMs uint32 `json:"session_grace_ms"`
		StateIDHex     string `json:"state_id_hex"`
		DataHex        string `json:"data_hex"`
		Hex            string
	}
	Requests []struct {
		Name   string
		Fields struct {
			Op      string `json:"op"`
			Flags   int    `json:"flags"`
			ID      string `json:"id"`
			Token   string `json:"token"`
			LeaseMs uint32 `json:"lease_ms"`
			WaitMs  uint32 `json:"wait_ms"`
			KeyHex  string `json:"key_hex"`
		}
		Hex string
	}
	Responses []struct {
		Name   string
		Fields struct {
			Op      string `json:"op"`
			Status  string `json:"status"`
			ID      string `json:"id"`
			Token   string `json:"token"`
			LeaseMs uint32 `json:"lease_ms"`
			Detail  uint32 `json:"detail"`
			DataHex string `json:"data_hex"`
		}
		Hex string
	}
}

func loadVectors(t *testing.T) *vectorFile {
	b, err := os.ReadFile("../protocol/vectors.json")
	if err != nil {
		t.Fatalf("protocol vectors not found: %v", err)
	}
	var v vectorFile
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return &v
}

var opCodes = map[string]byte{"ACQUIRE": opAcquire, "RELEASE": opRelease, "EXTEND": 0x12, "CANCEL": 0x13, "PING": opPing,
	"INSPECT": 0x15, "ACK": opAck, "EXPIRED": opExpired, "GOAWAY": opGoaway}
var statusCodes = map[string]byte{"OK": 0, "TIMED_OUT": 1, "NOT_HELD": 2, "INVALID": 3, "NOT_LEADER": 4, "BUSY": 5,
	"SHUTTING_DOWN": 6, "AUTH_FAILED": 7, "UNSUPPORTED_VERSION": 8, "CANCELLED": 9}

func u64(t *testing.T, s string) uint64 {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRequestVectors(t *testing.T) {
	for _, v := range loadVectors(t).Requests {
		op, ok := opCodes[v.Fields.Op]
		if !ok || v.Fields.Flags != 0 {
			continue
		}
		key, _ := hex.DecodeString(v.Fields.KeyHex)
		got := appendRequest(nil, op, u64(t, v.Fields.ID), u64(t, v.Fields.Token), v.Fields.LeaseMs, v.Fields.WaitMs, key)
		if hex.EncodeToString(got) != v.Hex {
			t.Errorf("%s: got %x want %s", v.Name, got, v.Hex)
		}
	}
}

func TestResponseVectors(t *testing.T) {
	n := 0
	for _, v := range loadVectors(t).Responses {
		op, ok := opCodes[v.Fields.Op]
		if !ok {
			continue
		}
		b, _ := hex.DecodeString(v.Hex)
		b = append(b, 0xAA) // the next frame's first byte must stay unread
		r := bufio.NewReader(bytes.NewReader(b))
		var resp response
		if err := readResponse(r, &resp); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if resp.op != op || resp.status != statusCodes[v.Fields.Status] || resp.id != u64(t, v.Fields.ID) ||
			resp.token != u64(t, v.Fields.Token) || resp.lease != v.Fields.LeaseMs || resp.detail != v.Fields.Detail {
			t.Errorf("%s: decoded %+v", v.Name, resp)
		}
		if r.Buffered() != 1 {
			t.Errorf("%s: %d bytes left, want 1", v.Name, r.Buffered())
		}
		n++
	}
	if n < 10 {
		t.Fatalf("only %d response vectors checked", n)
	}
}

func TestNullServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go nullserver.Serve(ln)
	nc, _, err := dialTicketing(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	var buf []byte
	for i := 1; i <= 100; i++ {
		buf = appendRequest(buf, opAcquire, uint64(i), 0, 1000, 0, keyName("key", i))
	}
	if _, err := nc.Write(buf); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(nc)
	for i := 1; i <= 100; i++ {
		var resp response
		if err := readResponse(r, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.op != opAcquire || resp.status != stOK || resp.id != uint64(i) {
			t.Fatalf("answer %d: %+v", i, resp)
		}
	}
}

func TestRESP(t *testing.T) {
	got := string(appendSetNX(nil, []byte("k"), []byte("tok"), []byte("30000")))
	want := "*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\ntok\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n"
	if got != want {
		t.Fatalf("SET: %q", got)
	}
	in := "+OK\r\n$-1\r\n:1\r\n:-3\r\n-ERR bad\r\n$5\r\nhello\r\n*2\r\n$1\r\na\r\n:7\r\n+PONG\r\n"
	r := bufio.NewReader(strings.NewReader(in))
	type want1 struct {
		kind byte
		n    int64
		nil  bool
		str  string
	}
	for i, w := range []want1{{'+', 0, false, "OK"}, {'$', -1, true, ""}, {':', 1, false, ""}, {':', -3, false, ""},
		{'-', 0, false, "ERR bad"}, {'$', 5, false, "hello"}, {'*', 2, false, ""}, {'+', 0, false, "PONG"}} {
		var rp reply
		if err := readReply(r, &rp); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if rp.kind != w.kind || rp.nil != w.nil || string(rp.str) != w.str || (w.kind != '+' && w.kind != '-' && rp.n != w.n) {
			t.Fatalf("reply %d: %+v", i, rp)
		}
	}
}

func TestSlotKeysDisjoint(t *testing.T) {
	keys := makeKeys("key", 1000)
	seen := map[string]int{}
	const S = 64 * 2
	for g := 0; g < S; g++ {
		ks := slotKeys(keys, g, S)
		if len(ks) == 0 {
			t.Fatalf("slot %d has no key", g)
		}
		for _, k := range ks {
			if prev, dup := seen[string(k)]; dup {
				t.Fatalf("key %s in slots %d and %d", k, prev, g)
			}
			seen[string(k)] = g
		}
	}
	if len(seen) != len(keys) {
		t.Fatalf("%d of %d keys used", len(seen), len(keys))
	}
}

func TestChartIsWellFormedSVG(t *testing.T) {
	svg := lineChart("t <&>", "sub", []int{1, 16, 64}, []series{
		{"ticketing", map[int]float64{1: 2e5, 16: 1.2e6, 64: 1.1e6}},
		{"etcd", map[int]float64{16: 4000, 64: 4100}},
	})
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("bad SVG: %v", err)
		}
	}
	if !strings.Contains(svg, "1.20M") || !strings.Contains(svg, "polyline") {
		t.Fatal("chart lacks its points")
	}
}

func TestParseRedisBenchmarkCSV(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"` + "\n" +
		`"SET key:__rand_int__ tok NX PX 30000","412371.12","3.647","0.464","3.599","4.847","5.519","7.359"` + "\n"
	if got := parseRedisBenchmarkCSV(out); got != 412371.12 {
		t.Fatalf("got %v", got)
	}
}

// TestPrevPipeSpeaksTheEarlierProtocol: system prev's driver completes the handshake of the
// protocol before v1 final (40-byte CHALLENGE and WELCOME) and never sends ACK.
func TestPrevPipeSpeaksTheEarlierProtocol(t *testing.T) {
	challenge, welcome := make([]byte, 40), make([]byte, 40)
	be.PutUint32(challenge, 36)
	challenge[4], challenge[6] = opChallenge, 1
	be.PutUint32(welcome, 36)
	welcome[4] = opWelcome
	s, res := runStrict(t, "prev", challenge, welcome, 500*time.Millisecond)
	if res.ops < 1000 || res.errs != 0 || s.acks.Load() != 0 {
		t.Fatalf("%d ops, %d errors, %d ACKs: want over 1,000 ops, no errors, no ACK", res.ops, res.errs, s.acks.Load())
	}
}

// TestPingRTT: the round-trip bound of (a) at one connection is measured with each system's
// PING (floor.go): the Ticketing protocol's on the null server, RESP's on a server that answers
// it like Redis (and an error when it does not), none for etcd.
func TestPingRTT(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go nullserver.Serve(ln)
	rtt, ok, err := pingRTT("null", ln.Addr().String())
	if err != nil || !ok || rtt <= 0 {
		t.Fatalf("null: %v %v %v", rtt, ok, err)
	}

	resp := func(answer string) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					r := bufio.NewReader(c)
					for {
						line, err := r.ReadString('\n')
						if err != nil || line != "PING\r\n" {
							return
						}
						if _, err := c.Write([]byte(answer)); err != nil {
							return
						}
					}
				}()
			}
		}()
		return l.Addr().String()
	}
	if rtt, ok, err := pingRTT("redis", resp("+PONG\r\n")); err != nil || !ok || rtt <= 0 {
		t.Fatalf("redis: %v %v %v", rtt, ok, err)
	}
	if _, _, err := pingRTT("redis", resp("-ERR no\r\n")); err == nil {
		t.Fatal("a wrong answer to PING was taken")
	}
	if _, ok, err := pingRTT("etcd", "127.0.0.1:1"); ok || err != nil {
		t.Fatalf("etcd: %v %v", ok, err)
	}
}
