package conformance

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
)

func TestMain(m *testing.M) {
	if os.Getenv(stubDriverEnv) == "1" {
		os.Exit(runStubDriver(os.Stdin, os.Stdout, os.Stderr))
	}
	code := m.Run()
	testserver.Cleanup()
	os.Exit(code)
}

func repoRoot() string { return testserver.RepoRoot() }

// testBinary is this test binary, which runs as the stub driver when started with
// TICKETING_CONFORMANCE_STUB=1.
func testBinary() string {
	if p, err := os.Executable(); err == nil {
		return p
	}
	return os.Args[0]
}

// driverSpec is a driver found (or named) for this run.
type driverSpec struct {
	name string
	argv []string
	env  []string // extra environment
	// optional: found by discovery (no TICKETING_CONFORMANCE_DRIVERS), so a driver whose client
	// is not built yet is skipped with a line saying how to build it, not failed: a plain
	// `go test ./...` on a fresh checkout runs the drivers that need no set-up (go, cli).
	// make test-conformance names every driver, so there a driver that does not start fails.
	optional bool
}

// knownOrder is the order of drivers in reports; others follow by name.
var knownOrder = []string{"go", "python", "js", "cli", "rust", "c", "java", "ruby", "csharp", "stub"}

func sortDrivers(names []string) {
	rank := func(n string) int {
		for i, k := range knownOrder {
			if k == n {
				return i
			}
		}
		return len(knownOrder)
	}
	sort.Slice(names, func(i, j int) bool {
		ri, rj := rank(names[i]), rank(names[j])
		if ri != rj {
			return ri < rj
		}
		return names[i] < names[j]
	})
}

// discoverDrivers lists the drivers of this run: every executable clients/*/conformance-driver
// and cli (built into dir), or exactly those named by TICKETING_CONFORMANCE_DRIVERS (where
// "stub" names the runner's own stub driver).
func discoverDrivers(dir string) ([]driverSpec, error) {
	found := map[string]driverSpec{}
	paths, _ := filepath.Glob(filepath.Join(repoRoot(), "clients", "*", "conformance-driver"))
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			name := filepath.Base(filepath.Dir(p))
			found[name] = driverSpec{name: name, argv: []string{p}}
		}
	}
	want := map[string]bool{}
	named := false
	if v := strings.TrimSpace(os.Getenv("TICKETING_CONFORMANCE_DRIVERS")); v != "" {
		named = true
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				want[n] = true
			}
		}
	} else {
		for n := range found {
			want[n] = true
		}
		want["cli"] = true
	}
	var names []string
	for n := range want {
		names = append(names, n)
	}
	sortDrivers(names)
	var specs []driverSpec
	for _, n := range names {
		switch {
		case n == "cli":
			bin := filepath.Join(dir, "cli-driver")
			cmd := exec.Command("go", "build", "-o", bin, "./tests/conformance/cli")
			cmd.Dir = repoRoot()
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("building the cli driver: %v\n%s", err, out)
			}
			specs = append(specs, driverSpec{name: "cli", argv: []string{bin}})
		case n == "stub" || strings.HasPrefix(n, "stub-"): // stub-2, stub-3...: more copies, to load the runner
			specs = append(specs, driverSpec{name: n, argv: []string{testBinary()}, env: []string{stubDriverEnv + "=1"}})
		default:
			spec, ok := found[n]
			if !ok {
				return nil, fmt.Errorf("driver %q named in TICKETING_CONFORMANCE_DRIVERS: no executable clients/%s/conformance-driver", n, n)
			}
			spec.optional = !named && n != "go"
			specs = append(specs, spec)
		}
	}
	return specs, nil
}

// selectedScenarios applies TICKETING_CONFORMANCE_SCENARIOS.
func selectedScenarios() ([]scenario, error) {
	v := strings.TrimSpace(os.Getenv("TICKETING_CONFORMANCE_SCENARIOS"))
	if v == "" {
		return scenarios, nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(v, ",") {
		want[strings.TrimSpace(n)] = true
	}
	var out []scenario
	for _, sc := range scenarios {
		if want[sc.name] {
			out = append(out, sc)
			delete(want, sc.name)
		}
	}
	for n := range want {
		return nil, fmt.Errorf("TICKETING_CONFORMANCE_SCENARIOS: no scenario %q", n)
	}
	return out, nil
}

func parallelism() int {
	if n, err := strconv.Atoi(os.Getenv("TICKETING_CONFORMANCE_PARALLEL")); err == nil && n > 0 {
		return n
	}
	return 3
}

// serverBinary is TICKETING_BIN, or the binary built from this checkout.
func serverBinary(t *testing.T) string {
	if bin := os.Getenv("TICKETING_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	bin, err := testserver.Binary()
	if err != nil {
		t.Fatalf("building the server: %v", err)
	}
	return bin
}

// targetKinds are the server targets the runner can run scenarios against, by the name
// TICKETING_CONFORMANCE_TARGET selects (default "single"; "cluster" names "cluster3").
var targetKinds = map[string]func(bin string, certs *testserver.TLSFiles) targetFactory{
	"single":   newSingleNodeFactory,
	"cluster3": newClusterFactory,
}

func TestConformance(t *testing.T) {
	kind := os.Getenv("TICKETING_CONFORMANCE_TARGET")
	switch kind {
	case "":
		kind = "single"
	case "cluster":
		kind = "cluster3"
	}
	runConformance(t, kind)
}

// runConformance runs the selected scenarios against the selected drivers on targets of kind,
// and prints the summary table (also to TICKETING_CONFORMANCE_REPORT when set).
func runConformance(t *testing.T, kind string) {
	runStart := time.Now()
	newFactory, ok := targetKinds[kind]
	if !ok {
		t.Fatalf("no target kind %q", kind)
	}
	bin := serverBinary(t)
	dir := t.TempDir()
	certs, err := testserver.GenerateTLS(dir)
	if err != nil {
		t.Fatalf("test certificates: %v", err)
	}
	env := &runEnv{bin: bin, certs: certs, newTarget: newFactory(bin, certs), kind: kind}
	list, err := selectedScenarios()
	if err != nil {
		t.Fatal(err)
	}
	specs, err := discoverDrivers(dir)
	if err != nil {
		t.Fatal(err)
	}
	drivers, specs := startDrivers(t, specs, bin)
	defer func() {
		var wg sync.WaitGroup
		for _, d := range drivers {
			wg.Add(1)
			go func() { defer wg.Done(); d.stop() }()
		}
		wg.Wait()
	}()

	res := newResults(specs, list)
	runScenarios(t, env, drivers, list, res)
	res.total = time.Since(runStart)
	summary := res.table(env.kind)
	fmt.Print(summary) // shown with -v and when the run fails
	if path := os.Getenv("TICKETING_CONFORMANCE_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(summary), 0o644); err != nil {
			t.Errorf("writing the report: %v", err)
		}
	}
}

// startDrivers starts every driver at once; one that fails to start or answer hello fails the
// run (and is reported FAIL in every scenario), unless it is optional: then it is left out of
// the run (the specs returned) with one line saying how to build it.
func startDrivers(t *testing.T, specs []driverSpec, bin string) (map[string]*driver, []driverSpec) {
	var mu sync.Mutex
	drivers := map[string]*driver{}
	skipped := map[string]bool{}
	var wg sync.WaitGroup
	for _, sp := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := startDriver(sp.name, sp.argv, driverEnv(bin, sp.env...))
			if err != nil && sp.optional {
				t.Logf("driver %s skipped: it did not start (%v); build its client first (bash clients/%s/test.sh), or run make test-conformance, which builds and runs every driver", sp.name, err, sp.name)
				mu.Lock()
				skipped[sp.name] = true
				mu.Unlock()
				return
			}
			if err != nil {
				t.Errorf("driver %s did not start: %v", sp.name, err)
				return
			}
			t.Logf("driver %s: %s %s, features %v", d.name, d.language, d.version, sortedKeys(d.features))
			mu.Lock()
			drivers[sp.name] = d
			mu.Unlock()
		}()
	}
	wg.Wait()
	kept := specs[:0:0]
	for _, sp := range specs {
		if !skipped[sp.name] {
			kept = append(kept, sp)
		}
	}
	return drivers, kept
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// runScenarios runs the per-driver scenarios (drivers in parallel, each driver's scenarios one
// after another; an exclusive scenario runs alone), then the cross scenarios.
func runScenarios(t *testing.T, env *runEnv, drivers map[string]*driver, list []scenario, res *results) {
	var gate sync.RWMutex // exclusive scenarios take it for writing
	sem := make(chan struct{}, parallelism())
	t.Run("drivers", func(t *testing.T) {
		for _, name := range res.drivers {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				d := drivers[name]
				if d == nil {
					for _, sc := range list {
						res.set(name, sc.name, result{status: statusFail, note: noteNotStarted})
					}
					t.Errorf("driver %s did not start", name)
					return
				}
				sem <- struct{}{}
				defer func() { <-sem }()
				for _, sc := range list {
					if sc.cross {
						continue
					}
					if !applicable(res, env, d, sc) {
						continue
					}
					t.Run(sc.name, func(t *testing.T) {
						if sc.exclusive {
							gate.Lock()
							defer gate.Unlock()
						} else {
							gate.RLock()
							defer gate.RUnlock()
						}
						runOne(t, env, sc, res, d)
					})
				}
			})
		}
	})
	for _, sc := range list {
		if !sc.cross {
			continue
		}
		var part []*driver
		for _, name := range res.drivers {
			d := drivers[name]
			if d == nil {
				continue
			}
			if applicable(res, env, d, sc) {
				part = append(part, d)
			}
		}
		if len(part) == 0 {
			continue
		}
		t.Run("cross/"+sc.name, func(t *testing.T) { runOne(t, env, sc, res, part...) })
	}
}

// applicable records n/a for a scenario the driver or the target cannot run.
func applicable(res *results, env *runEnv, d *driver, sc scenario) bool {
	if missing := d.hasAll(sc.needs); len(missing) > 0 {
		res.set(d.name, sc.name, result{status: statusNA, note: "lacks " + strings.Join(missing, ", ")})
		return false
	}
	if sc.single && env.kind != "single" {
		res.set(d.name, sc.name, result{status: statusNA, note: "single node only"})
		return false
	}
	if sc.clusterOnly && env.kind == "single" {
		res.set(d.name, sc.name, result{status: statusNA, note: "cluster only"})
		return false
	}
	return true
}

// runOne runs a scenario and reports a failure with the step log, the drivers' stderr and the
// server's log.
func runOne(t *testing.T, env *runEnv, sc scenario, res *results, ds ...*driver) {
	body := sc.run
	if sc.cluster != nil && env.kind != "single" {
		body = sc.cluster
	}
	s := newS(sc.name, env, ds...)
	s.execute(body)
	dur := time.Since(s.start)
	var first string
	if n := s.unplannedElections(); s.failed() && n > 0 {
		// The cluster changed leader on its own (a leader starved past its 75 ms leader lease
		// on a loaded machine) while the scenario ran, and it failed: run it once more, and
		// say so in the summary. A failure without such a change, or a second one, stands.
		first = fmt.Sprintf("failed during %d leader changes the runner did not cause: %s", n, s.failures[0])
		t.Logf("scenario %s %s; running it once more. Its report:\n%s", sc.name, first, s.report(ds))
		clusterStats.reruns.Add(1)
		s = newS(sc.name, env, ds...)
		s.execute(body)
		dur += time.Since(s.start)
	}
	st := result{status: statusPass, dur: dur, rerun: first != "", note: first}
	if s.failed() {
		st.status = statusFail
		st.note = s.failures[0]
		if n := s.unplannedElections(); n > 0 {
			st.note = fmt.Sprintf("[%d leader changes the runner did not cause] %s", n, st.note)
		}
		if first != "" {
			st.note = "twice; the first time " + first + "; the second: " + st.note
		}
		t.Error(s.report(ds))
	}
	for _, d := range ds {
		res.set(d.name, sc.name, st)
	}
}

// report is the failure report of a scenario.
func (s *S) report(ds []*driver) string {
	var b strings.Builder
	names := make([]string, len(ds))
	for i, d := range ds {
		names[i] = d.name
	}
	fmt.Fprintf(&b, "scenario %s with %s FAILED after %v:\n", s.name, strings.Join(names, ", "), time.Since(s.start).Round(time.Millisecond))
	for _, f := range s.failures {
		fmt.Fprintf(&b, "  - %s\n", f)
	}
	fmt.Fprintf(&b, "step log:\n%s\n", indent(s.log.String()))
	for _, d := range ds {
		fmt.Fprintf(&b, "driver %s stderr during the scenario (last 80 lines):\n%s\n", d.name, indent(d.stderrSince(s.start, 80)))
	}
	s.mu.Lock()
	proxies := s.proxies
	s.mu.Unlock()
	for i, p := range proxies {
		var lines []string
		for _, c := range p.Conns() {
			for _, l := range frameLines(c, fmt.Sprintf("#%d", i+1)) {
				lines = append(lines, fmt.Sprintf("%8.3fs  %s", l.at.Sub(s.start).Seconds(), l.text))
			}
		}
		if len(lines) > 300 {
			lines = append([]string{fmt.Sprintf("... (%d frames before)", len(lines)-300)}, lines[len(lines)-300:]...)
		}
		fmt.Fprintf(&b, "frames through proxy #%d (%s):\n%s\n", i+1, p.Addr, indent(strings.Join(lines, "\n")))
	}
	if n := s.unplannedElections(); n > 0 {
		fmt.Fprintf(&b, "the cluster had %d leader changes the runner did not cause (a leader that lost its quorum for a leader lease: a loaded machine); see the node logs\n", n)
	}
	logs := s.serverLogs()
	if lines := strings.Split(logs, "\n"); len(lines) > 120 {
		logs = strings.Join(append([]string{"..."}, lines[len(lines)-120:]...), "\n")
	}
	fmt.Fprintf(&b, "server log (tail):\n%s\n", indent(logs))
	return b.String()
}

func indent(s string) string {
	if s == "" {
		return "    (empty)"
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}
