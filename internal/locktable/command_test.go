package locktable

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/ticketing/ticketing/wire"
)

var update = flag.Bool("update", false, "rewrite testdata/commands.json")

// commandVector is one entry of testdata/commands.json: a described entry and its exact bytes.
type commandVector struct {
	Name string `json:"name"`
	Doc  string `json:"doc"`
	Hex  string `json:"hex"`
}

func commandVectors() []commandVector {
	sid := [wire.SessionIDSize]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	var e Encoder
	var out []commandVector
	add := func(name, doc string, build func()) {
		e.Reset(1_500_000_000) // 1.5 s on the table's clock
		build()
		out = append(out, commandVector{name, doc, hex.EncodeToString(e.Bytes())})
	}
	add("attach", "ATTACH session 00..0f on connection 7 with a 5000 ms grace", func() { e.Attach(&sid, 7, 5000) })
	add("requests", "REQUESTS of session 00..0f on connection 7: ACQUIRE id 1 order-1234 30000 ms wait 5000, RELEASE id 2 token 42", func() {
		e.Requests(&sid, 7)
		e.Request(&wire.Request{Op: wire.OpAcquire, ID: 1, Key: []byte("order-1234"), Lease: 30000, WaitMs: 5000})
		e.Request(&wire.Request{Op: wire.OpRelease, ID: 2, Key: []byte("order-1234"), Token: 42})
	})
	add("detach", "DETACH session 00..0f from connection 7", func() { e.Detach(&sid, 7) })
	add("tick", "TICK", func() { e.Tick() })
	add("ceiling", "CEILING token limit 1048576, horizon 35 s", func() { e.Ceiling(1<<20, 35_000_000_000) })
	add("storage_failing", "STORAGE failing", func() { e.Storage(true) })
	add("stop", "STOP", func() { e.Stop() })
	add("seed", "SEED last token 1000", func() { e.Seed(1000) })
	add("undelivered", "UNDELIVERED session 00..0f, connection 7, request 3", func() { e.Undelivered(&sid, 7, 3) })
	state := [wire.StateIDSize]byte{0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f}
	add("init", "INIT state id 60..6f, not forced, no grant before 2 s", func() { e.Init(&state, false, 2_000_000_000) })
	add("init_forced", "INIT state id 60..6f, FORCE (a recovery or a restore), no grant before 3600 s", func() { e.Init(&state, true, 3_600_000_000_000) })
	add("node", "NODE n1 at 127.0.0.1:7070", func() { e.Node("n1", "127.0.0.1:7070") })
	add("detach_all", "DETACH_ALL", func() { e.DetachAll() })
	add("config", "CONFIG waiters per key 10000, waiters 1000000, keys 1000000, lock-delay 250 ms, sessions 20000, outcomes 4096, queued acquires 4096", func() {
		e.Config(Limits{MaxWaitersPerKey: 10_000, MaxWaitersTotal: 1_000_000, MaxLocks: 1_000_000, LockDelay: 250_000_000,
			MaxSessions: 20_000, MaxOutcomes: 4096, MaxQueued: 4096})
	})
	add("batch", "one entry of several commands: ATTACH, REQUESTS (PING id 1), TICK", func() {
		e.Attach(&sid, 8, 0)
		e.Requests(&sid, 8)
		e.Request(&wire.Request{Op: wire.OpPing, ID: 1})
		e.Tick()
	})
	return out
}

// TestCommandVectors pins the command encoding: a change that alters these bytes breaks
// replicas running different versions, and must come with a new CommandVersion.
func TestCommandVectors(t *testing.T) {
	path := filepath.Join("testdata", "commands.json")
	want := commandVectors()
	if *update {
		b, _ := json.MarshalIndent(want, "", "  ")
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []commandVector
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d vectors on file, %d generated (go test ./internal/locktable -run TestCommandVectors -update)", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("vector %s: encoding changed\n file %s\n code %s", want[i].Name, got[i].Hex, want[i].Hex)
		}
		// Every vector applies cleanly.
		raw, _ := hex.DecodeString(want[i].Hex)
		tb := New(Config{Durable: true})
		if _, err := tb.Apply(raw, nil); err != nil {
			t.Errorf("vector %s does not apply: %v", want[i].Name, err)
		}
	}
}

func TestApplyRejectsBadEntries(t *testing.T) {
	var e Encoder
	e.Reset(1)
	e.Tick()
	good := bytes.Clone(e.Bytes())
	tb := New(Config{})
	bad := bytes.Clone(good)
	bad[0] = 9
	if _, err := tb.Apply(bad, nil); !errors.Is(err, ErrCommandVersion) {
		t.Errorf("version: %v", err)
	}
	bad = bytes.Clone(good)
	bad[16] = 0x7e // unknown type, not ignorable
	if _, err := tb.Apply(bad, nil); !errors.Is(err, ErrCommandType) {
		t.Errorf("unknown type: %v", err)
	}
	bad[17] = CmdFlagIgnorable
	if _, err := tb.Apply(bad, nil); err != nil {
		t.Errorf("ignorable unknown type: %v", err)
	}
	if _, err := tb.Apply(good[:len(good)-1], nil); err == nil {
		t.Error("truncated entry applied")
	}
	bad = append(bytes.Clone(good), 0)
	if _, err := tb.Apply(bad, nil); !errors.Is(err, ErrCommandLayout) {
		t.Errorf("trailing bytes: %v", err)
	}
}

// FuzzApply: arbitrary bytes never panic Apply, and the table stays consistent.
func FuzzApply(f *testing.F) {
	for _, v := range commandVectors() {
		b, _ := hex.DecodeString(v.Hex)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tb := New(Config{Durable: true})
		tb.Apply(b, nil)
		if err := tb.check(); err != nil {
			t.Fatal(err)
		}
	})
}
