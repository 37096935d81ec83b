package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ticketing/ticketing/bench/internal/nullserver"
)

// The harness speaks the protocol itself, so it checks itself against the repo's vectors.
type vectorFile struct {
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

var opCodes = map[string]byte{"ACQUIRE": opAcquire, "RELEASE": opRelease, "EXTEND": 0x12, "CANCEL": 0x13, "PING": opPing, "EXPIRED": 0x20}
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
	nc, err := dialTicketing(ln.Addr().String())
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
