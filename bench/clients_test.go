package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRegistry: the committed registry parses, and names the rows the issue asks for.
func TestRegistry(t *testing.T) {
	reg, err := loadRegistry("clients.registry")
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]*clientEntry{}
	for _, e := range reg {
		by[e.Name] = e
	}
	for _, n := range []string{"go-raw", "go", "redsync", "rust", "c", "cpp", "java", "java-async", "kotlin", "redisson",
		"csharp", "ruby", "redlock-rb", "python", "python-asyncio", "redis-py", "redis-py-asyncio", "js", "node-redlock", "rust-redis"} {
		if by[n] == nil {
			t.Errorf("registry has no row %q", n)
		}
	}
	if e := by["cpp"]; e == nil || e.Folder != "clients/c/bench" || strings.Join(e.Args, " ") != "--api cpp" || !has(e.Targets, "raw") {
		t.Errorf("cpp row: %+v", e)
	}
	if e := by["python"]; e == nil || e.Incumbent != "redis-py" || !has(e.Targets, "incumbent") {
		t.Errorf("python row: %+v", e)
	}
	if e := by["redis-py-asyncio"]; e == nil || e.Against != "redis" || strings.Join(e.Args, " ") != "--api asyncio" {
		t.Errorf("redis-py-asyncio row: %+v", e)
	}
	if by["go-raw"].Folder != "" || by["go-raw"].Against != "ticketing" {
		t.Errorf("go-raw row: %+v", by["go-raw"])
	}
	// The harness's own folders follow the contract (the others are their helpers').
	for _, n := range []string{"go", "redsync"} {
		for _, sc := range []string{"bench-build.sh", "bench-run.sh"} {
			if _, err := os.Stat(filepath.Join("..", by[n].Folder, sc)); err != nil {
				t.Errorf("%s: %v", n, err)
			}
		}
	}
	sel, err := selectClients(reg, []string{"go", "go-raw"})
	if err != nil || len(sel) != 2 || sel[0].Name != "go" {
		t.Errorf("select go,go-raw: %v %v", sel, err)
	}
	if _, err := selectClients(reg, []string{"cobol"}); err == nil || !strings.Contains(err.Error(), "unknown client") {
		t.Errorf("unknown name: %v", err)
	}
	if all, _ := selectClients(reg, []string{"all"}); len(all) != len(reg) {
		t.Errorf("all: %d rows, want %d", len(all), len(reg))
	}
}

func TestParseRegistryErrors(t *testing.T) {
	head := "| name | label | folder | against | args | incumbent | targets |\n|---|---|---|---|---|---|---|\n"
	for _, c := range []struct{ rows, want string }{
		{"| a | A | x | ticketing | |\n", "columns"},
		{"| a | A | x | mysql | | | |\n", "against"},
		{"| a | A | x | ticketing | | b | |\n", "incumbent \"b\""},
		{"| a | A | x | ticketing | | | incumbent |\n", "no incumbent"},
		{"| a | A | x | ticketing | | | fast |\n", "target"},
		{"| a | A | - | ticketing | | | |\n", "only go-raw"},
		{"| a | A | x | ticketing | | | |\n| a | A | y | redis | | | |\n", "repeated"},
		{"# nothing\n", "no rows"},
	} {
		if _, err := parseRegistry(head + c.rows); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error with %q", c.rows, err, c.want)
		}
	}
	reg, err := parseRegistry(head + "| go-raw | | - | ticketing | | | |\n| p | P | x/y | ticketing | --api sync  -v | r | incumbent, raw |\n| r | R | z | redis | | | |\n")
	if err != nil {
		t.Fatal(err)
	}
	if p := reg[1]; strings.Join(p.Args, " ") != "--api sync -v" || strings.Join(p.Targets, ",") != "incumbent,raw" || reg[0].Label != "go-raw" {
		t.Errorf("parsed: %+v %+v", reg[0], p)
	}
}

// TestBuildFolderSkips: a folder without the scripts, a build that fails (its last stderr line is
// the reason) and a build that does not finish are reasons to skip, not errors.
func TestBuildFolderSkips(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	if why := buildFolder(dir, "clients/x/bench", out, time.Minute); why != "no bench-build.sh in clients/x/bench" {
		t.Errorf("no scripts: %q", why)
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("bench-build.sh", "echo compiling\necho 'cargo not found (no Rust toolchain)' >&2\nexit 1\n")
	if why := buildFolder(dir, "x", out, time.Minute); why != "no bench-run.sh in x" {
		t.Errorf("no run script: %q", why)
	}
	write("bench-run.sh", "exit 0\n")
	if why := buildFolder(dir, "x", out, time.Minute); why != "build failed: cargo not found (no Rust toolchain)" {
		t.Errorf("failed build: %q", why)
	}
	write("bench-build.sh", "sleep 5\n")
	if why := buildFolder(dir, "x", out, 200*time.Millisecond); !strings.Contains(why, "did not finish") {
		t.Errorf("slow build: %q", why)
	}
	write("bench-build.sh", "test -d \"$1\" && touch \"$1/prog\"\n")
	if why := buildFolder(dir, "x", out, time.Minute); why != "" {
		t.Errorf("good build: %q", why)
	}
	if _, err := os.Stat(filepath.Join(out, "prog")); err != nil {
		t.Errorf("the build did not get OUTDIR: %v", err)
	}
}

// TestClientRecords: per-round ratios against go-raw and against the incumbent at the same
// caller count; a skipped program gets a record with its reason, and the targets say "not
// measured" for it and for a program whose incumbent was skipped.
func TestClientRecords(t *testing.T) {
	head := "| name | label | folder | against | args | incumbent | targets |\n|---|---|---|---|---|---|---|\n"
	reg, err := parseRegistry(head + `| go-raw | raw | - | ticketing | | | |
| py | Python | clients/python/bench | ticketing | --api sync | redis-py | incumbent |
| redis-py | redis-py | bench/incumbents/redis-py | redis | | | |
| rb | Ruby | clients/ruby/bench | ticketing | | redlock | incumbent |
| redlock | redlock | bench/incumbents/redlock | redis | | | |
| cpp | C++ | clients/c/bench | ticketing | --api cpp | | raw |
`)
	if err != nil {
		t.Fatal(err)
	}
	var progs []*clientProg
	for _, e := range reg {
		progs = append(progs, &clientProg{e: e})
	}
	progs[4].skipped = "no bench-build.sh in bench/incumbents/redlock"
	progs[5].skipped = "build failed: cmake not found"
	run := func(round int, pairs, cpu float64) *clientRun {
		return &clientRun{round: round, pairsPerSec: pairs, clientCPU: cpu, serverCPU: 0.5}
	}
	runs := map[clientKey][]*clientRun{
		{"go-raw", 1}:    {run(0, 10000, 0.2), run(1, 5000, 0.1), run(2, 10000, 0.2)},
		{"py", 1}:        {run(0, 3000, 0.5), run(1, 1500, 0.25), run(2, 2000, 0.5)},
		{"redis-py", 1}:  {run(0, 2000, 0.5), run(1, 1000, 0.5), run(2, 2000, 0.5)},
		{"rb", 1}:        {run(0, 1000, 0.5)},
		{"go-raw", 16}:   {run(0, 50000, 0.5)},
		{"py", 16}:       {run(0, 4000, 1)},
		{"redis-py", 16}: {run(0, 5000, 1)},
	}
	progs[3].failed = []string{"16 callers, round 1: rb: no result line"}
	recs := clientRecords(progs, []int{1, 16}, runs, 3)
	find := func(name string, n int) *Record {
		for _, r := range recs {
			if r.Client == name && r.Callers == n {
				return r
			}
		}
		t.Fatalf("no record %s at %d", name, n)
		return nil
	}
	py := find("py", 1)
	// rounds: 3000/2000, 1500/1000, 2000/2000 -> 1.5, 1.5, 1.0: median 1.5; vs raw 0.3, 0.3, 0.2
	if py.VsIncumbentPairs != 1.5 || py.VsRawPairs != 0.3 || py.PairsPerSec != 2000 || py.CPUPerPairUS != 166.667 {
		t.Errorf("py at 1: %+v", py)
	}
	if py.ServerCPUPerPairUS != 250 || py.System != "ticketing" || py.Incumbent != "redis-py" {
		t.Errorf("py at 1: server CPU per pair %v, system %s", py.ServerCPUPerPairUS, py.System)
	}
	if r := find("py", 16); r.VsIncumbentPairs != 0.8 || r.VsRawPairs != 0.08 {
		t.Errorf("py at 16: %+v", r)
	}
	if r := find("redlock", 1); r.Skipped != "no bench-build.sh in bench/incumbents/redlock" {
		t.Errorf("skipped incumbent: %+v", r)
	}
	if r := find("rb", 1); r.VsIncumbentPairs != 0 || r.PairsPerSec != 1000 {
		t.Errorf("rb at 1: %+v", r)
	}
	if r := find("rb", 16); !strings.Contains(r.Skipped, "every run failed") || r.FailedRuns != 1 {
		t.Errorf("rb at 16: %+v", r)
	}

	b := &bench{o: &options{callers: []int{1, 16}, repeat: 3, clientDuration: 3 * time.Second, workloads: map[string]bool{"clients": true}},
		meta: &Meta{CPUs: 2}, records: recs, progs: progs}
	tg := b.clientTargets()
	for _, want := range []string{
		"| clients: Python >= 1.5x redis-py at 1 caller | 1.50x (2,000 vs 2,000 pairs/s) | met |",
		"| clients: Python >= 1.5x redis-py at 16 callers | 0.80x (4,000 vs 5,000 pairs/s) | NOT met |",
		"| clients: Ruby >= 1.5x redlock at 1 caller | not measured: redlock skipped: no bench-build.sh in bench/incumbents/redlock | not measured |",
		"| clients: C++ >= 0.9x go-raw at 1 caller | not measured: build failed: cmake not found | not measured |",
		"| clients: C++ >= 0.5x go-raw at 16 callers |",
	} {
		if !strings.Contains(tg, want) {
			t.Errorf("targets lack %q:\n%s", want, tg)
		}
	}
	md := b.clientsMarkdown()
	for _, want := range []string{
		"| client (API) | 1 caller | × raw | × incumbent | CPU µs/pair | 16 callers | × raw | × incumbent | CPU µs/pair |",
		"| Python `py` (incumbent: redis-py) | 2,000 | 0.30 | 1.50 | 166.67 | 4,000 | 0.08 | 0.80 | 250.00 |",
		"| C++ `cpp` | skipped: build failed: cmake not found | | | | skipped: build failed: cmake not found | | | |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
}

func TestCPUAt(t *testing.T) {
	t0 := time.Unix(100, 0)
	s := []cpuSample{{t0, 1, 10}, {t0.Add(time.Second), 2, 12}, {t0.Add(2 * time.Second), 4, 12}}
	for _, c := range []struct {
		at       time.Duration
		cli, srv float64
	}{{-time.Second, 1, 10}, {500 * time.Millisecond, 1.5, 11}, {1500 * time.Millisecond, 3, 12}, {5 * time.Second, 4, 12}} {
		if cl, sv := cpuAt(s, t0.Add(c.at)); cl != c.cli || sv != c.srv {
			t.Errorf("at %v: %v, %v; want %v, %v", c.at, cl, sv, c.cli, c.srv)
		}
	}
}

func TestTooManyErrors(t *testing.T) {
	if tooManyErrors(1000, 10) || !tooManyErrors(1000, 11) || tooManyErrors(0, 0) || !tooManyErrors(0, 1) {
		t.Error("the 1% bound")
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567", -4500: "-4,500"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}

// TestKeepAwake: -client-keep-awake's busy loops run at nice 19 while the workload measures and
// are all gone once it stops.
func TestKeepAwake(t *testing.T) {
	pids, stop, err := keepAwake(2)
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) != 2 {
		stop()
		t.Fatalf("%d busy loops, want 2", len(pids))
	}
	for _, p := range pids {
		// nice(1) sets the priority, then execs sh: poll until it has (bounded).
		ni := ""
		for deadline := time.Now().Add(5 * time.Second); ni != "19" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			out, err := exec.Command("ps", "-o", "ni=", "-p", strconv.Itoa(p)).Output()
			if err != nil {
				break
			}
			ni = strings.TrimSpace(string(out))
		}
		if ni != "19" {
			t.Errorf("busy loop %d at nice %q, want 19", p, ni)
		}
	}
	stop()
	for _, p := range pids {
		if syscall.Kill(p, 0) == nil {
			t.Errorf("busy loop %d still running after stop", p)
		}
	}
}
