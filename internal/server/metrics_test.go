package server

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ticketing/ticketing/internal/version"
	"github.com/ticketing/ticketing/wire"
)

// startOpsServer starts a real server on 127.0.0.1 with metrics on (EnableMetrics before
// Serve, as cmd/ticketing does) and its admin listener on another free loopback port.
func startOpsServer(t *testing.T, mutate func(*Config)) (*testServer, string) {
	t.Helper()
	cfg := Default()
	cfg.Addr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.SessionGrace = 0
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	s.EnableMetrics()
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: s, addr: ln.Addr().String(), cfg: cfg, errc: make(chan error, 1)}
	go func() { ts.errc <- s.Serve(ln) }()
	go s.ServeAdmin(aln)
	t.Cleanup(func() { ts.stop(t) })
	return ts, "http://" + aln.Addr().String()
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, b)
	}
}

// gathered is what /metrics says, read with Prometheus' own text parser (so the format is
// checked too): "name{l1=v1,l2=v2}" -> metric (labels in name order).
func gathered(t *testing.T, s *Server) map[string]*dto.Metric {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(s.metrics.scrape()))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	out := map[string]*dto.Metric{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			name := f.GetName()
			if len(ls) > 0 {
				name += "{" + strings.Join(ls, ",") + "}"
			}
			out[name] = m
		}
	}
	return out
}

func (c *rawClient) expectAnswer(id uint64, st wire.Status) wire.Response {
	c.t.Helper()
	r := c.recv()
	if r.ID != id || r.Status != st {
		c.t.Fatalf("answer %+v, want id %d status %v", r, id, st)
	}
	return r
}

// TestMetricsKnownWorkload runs a known workload and checks every counter it moves, the
// histogram counts, and bucket placement for the waits and holds the test controls.
func TestMetricsKnownWorkload(t *testing.T) {
	ts, admin := startOpsServer(t, func(c *Config) { c.Tokens = []string{"secret"} })
	a := connect(t, ts.addr, "secret")
	b := connect(t, ts.addr, "secret")
	c := connect(t, ts.addr, "secret")
	// Warm up: the first grant of a 30 s lease waits for the durable restart horizon (it queues
	// behind storage and is handed off); later ones within a few seconds do not. Counted under
	// "warm", which the checks below leave alone except for the totals.
	warm := a.expectAnswerTo(acquire(1, "warm:1", 30000, wire.WaitForever), wire.StatusOK).Token
	a.expectAnswerTo(release(2, "warm:1", warm), wire.StatusOK)
	if st := dialRaw(t, ts.addr).handshake("wrong"); st != wire.StatusAuthFailed {
		t.Fatalf("wrong token: %v", st)
	}

	// order:1 — A holds it; B queues without limit; C queues for 200 ms and times out.
	tokA := a.expectAnswerTo(acquire(3, "order:1", 30000, 0), wire.StatusOK).Token
	b.send(acquire(1, "order:1", 30000, wire.WaitForever))
	waitFor(t, 5*time.Second, "B queued", func() bool { return ts.waiters() == 1 })
	queuedAt := time.Now()
	c.send(acquire(1, "order:1", 30000, 200))
	waitFor(t, 5*time.Second, "C queued", func() bool { return ts.waiters() == 2 })
	c.expectAnswer(1, wire.StatusTimedOut)
	// B waits at least 300 ms: A releases only then.
	time.Sleep(time.Until(queuedAt.Add(300 * time.Millisecond)))
	a.expectAnswerTo(release(4, "order:1", tokA), wire.StatusOK)
	tokB := b.expectAnswer(1, wire.StatusOK).Token
	if tokB != tokA+1 {
		t.Fatalf("hand-off token %d after %d", tokB, tokA)
	}
	b.expectAnswerTo(release(2, "order:1", tokB), wire.StatusOK)
	a.expectAnswerTo(release(5, "order:1", tokB), wire.StatusNotHeld)

	// job/x — held for a 100 ms lease that expires: an EXPIRED push.
	a.expectAnswerTo(acquire(6, "job/x", 100, 0), wire.StatusOK)
	if r := a.recvWithinT(5 * time.Second); r.Op != wire.OpExpired {
		t.Fatalf("want EXPIRED, got %+v", r)
	}
	a.expectAnswerTo(wire.Request{Op: wire.OpPing, ID: 7}, wire.StatusOK)
	a.expectAnswerTo(acquire(8, "job/x", 0, 0), wire.StatusInvalid) // lease 0: INVALID/LEASE

	g := gathered(t, ts.Server)
	counters := map[string]float64{
		"ticketing_grants_total{kind=immediate,prefix=order}":            1,
		"ticketing_grants_total{kind=handoff,prefix=order}":              1,
		"ticketing_grants_total{kind=immediate,prefix=job}":              1,
		"ticketing_grants_total{kind=handoff,prefix=job}":                0,
		"ticketing_lock_ends_total{prefix=order,reason=released}":        2,
		"ticketing_lock_ends_total{prefix=order,reason=expired}":         0,
		"ticketing_lock_ends_total{prefix=job,reason=expired}":           1,
		"ticketing_lock_ends_total{prefix=job,reason=released}":          0,
		"ticketing_wait_timeouts_total{prefix=order}":                    1,
		"ticketing_queued_total{prefix=order}":                           2,
		"ticketing_queued_total{prefix=job}":                             0,
		"ticketing_operations_total{op=acquire,status=ok}":               4,
		"ticketing_operations_total{op=acquire,status=timed_out}":        1,
		"ticketing_operations_total{op=acquire,status=invalid}":          1,
		"ticketing_operations_total{op=release,status=ok}":               3,
		"ticketing_operations_total{op=release,status=not_held}":         1,
		"ticketing_operations_total{op=ping,status=ok}":                  1,
		"ticketing_operations_total{op=expired,status=ok}":               1,
		"ticketing_auth_failures_total":                                  1,
		"ticketing_session_attaches_total{resumed=false}":                3,
		"ticketing_session_attaches_total{resumed=true}":                 0,
		"ticketing_slow_consumers_total":                                 0,
		"ticketing_grants_total{kind=immediate,prefix=other}":            0,
		"ticketing_lock_ends_total{prefix=order,reason=revoked}":         0,
		"ticketing_wait_timeouts_total{prefix=job}":                      0,
		"ticketing_operations_total{op=ping,status=invalid}":             -1, // never answered: no series
		"ticketing_operations_total{op=acquire,status=busy}":             -1,
		"ticketing_handshake_refusals_total{status=unsupported_version}": -1,
		"ticketing_grants_total{kind=immediate,prefix=order:1}":          -1, // the prefix stops at ':'
		"ticketing_grants_total{kind=immediate,prefix=job/x}":            -1,
		"ticketing_lock_ends_total{prefix=other,reason=released}":        0,
		"ticketing_grants_total{kind=handoff,prefix=other}":              0,
		"ticketing_queued_total{prefix=other}":                           0,
		"ticketing_wait_timeouts_total{prefix=other}":                    0,
		"ticketing_lock_ends_total{prefix=other,reason=expired}":         0,
		"ticketing_lock_ends_total{prefix=other,reason=revoked}":         0,
		"ticketing_lock_ends_total{prefix=job,reason=revoked}":           0,
		"ticketing_operations_total{op=ping,status=unsupported_version}": -1,
	}
	for name, want := range counters {
		m, ok := g[name]
		switch {
		case want < 0 && ok:
			t.Errorf("%s = %v: want no such series", name, m.GetCounter().GetValue())
		case want >= 0 && !ok:
			t.Errorf("%s: missing", name)
		case ok && m.GetCounter().GetValue() != want:
			t.Errorf("%s = %v, want %v", name, m.GetCounter().GetValue(), want)
		}
	}

	// Histograms: counts, and buckets for the durations the test controls.
	bucket := func(name string, le float64) uint64 {
		t.Helper()
		m := g[name]
		if m == nil {
			t.Fatalf("%s: missing", name)
		}
		for _, b := range m.GetHistogram().GetBucket() {
			if b.GetUpperBound() == le {
				return b.GetCumulativeCount()
			}
		}
		t.Fatalf("%s: no bucket le=%v", name, le)
		return 0
	}
	count := func(name string) uint64 { t.Helper(); return g[name].GetHistogram().GetSampleCount() }
	checks := []struct {
		what      string
		got, want uint64
	}{
		{"wait count (order)", count("ticketing_wait_seconds{prefix=order}"), 1},
		{"wait <= 0.25s (B waited >= 300 ms)", bucket("ticketing_wait_seconds{prefix=order}", 0.25), 0},
		{"wait <= 10s", bucket("ticketing_wait_seconds{prefix=order}", 10), 1},
		{"wait count (job)", count("ticketing_wait_seconds{prefix=job}"), 0},
		{"hold count (order)", count("ticketing_hold_seconds{prefix=order}"), 2},
		{"holds <= 0.1s (A held >= 300 ms)", bucket("ticketing_hold_seconds{prefix=order}", 0.1), 1},
		{"holds <= 30s", bucket("ticketing_hold_seconds{prefix=order}", 30), 2},
		{"hold count (job)", count("ticketing_hold_seconds{prefix=job}"), 1},
		{"job hold <= 0.01s (lease 100 ms)", bucket("ticketing_hold_seconds{prefix=job}", 0.01), 0},
		{"job hold <= 5s", bucket("ticketing_hold_seconds{prefix=job}", 5), 1},
		{"depth count", count("ticketing_queue_depth{prefix=order}"), 2},
		{"depth <= 1", bucket("ticketing_queue_depth{prefix=order}", 1), 1},
		{"depth <= 2", bucket("ticketing_queue_depth{prefix=order}", 2), 2},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.what, c.got, c.want)
		}
	}

	// Gauges read at scrape time.
	gauges := map[string]float64{"ticketing_connections": 3, "ticketing_sessions": 3, "ticketing_keys": 0,
		"ticketing_locks_held": 0, "ticketing_waiters": 0, "ticketing_last_token": 4, "ticketing_storage_failing": 0,
		"ticketing_metric_prefixes": 3}
	for name, want := range gauges {
		if m := g[name]; m == nil || m.GetGauge().GetValue() != want {
			t.Errorf("%s = %v, want %v", name, m.GetGauge().GetValue(), want)
		}
	}

	// The contention sketch saw order:1 queue twice, one hand-off and one timeout.
	var top struct {
		Metrics bool     `json:"metrics"`
		Keys    []TopKey `json:"keys"`
	}
	getJSON(t, admin+"/api/top", &top)
	if !top.Metrics || len(top.Keys) != 1+int(warmQueuedOf(g)) {
		t.Fatalf("top: %+v", top)
	}
	if k := top.Keys[0]; k.Key != "order:1" || k.Queued != 2 || k.Error != 0 || k.Handoffs != 1 || k.Timeouts != 1 || k.MeanWaitS < 0.3 || k.MeanWaitS > 10 {
		t.Errorf("top key: %+v", k)
	}

	// The same numbers in the exposition format.
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{
		`ticketing_grants_total{kind="handoff",prefix="order"} 1`,
		`ticketing_lock_ends_total{prefix="job",reason="expired"} 1`,
		`ticketing_wait_seconds_count{prefix="order"} 1`,
		`ticketing_auth_failures_total 1`,
		`ticketing_operations_total{op="release",status="not_held"} 1`,
		`ticketing_last_token 4`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	// And in the page's totals.
	var st Stats
	getJSON(t, admin+"/api/stats", &st)
	// The warm-up added one grant and one release, and maybe (see above) a queued hand-off.
	warmQueued := warmQueuedOf(g)
	if st.Grants != 4 || st.Handoffs != 1+warmQueued || st.Released != 3 || st.Expired != 1 || st.Timeouts != 1 || st.Queued != 2+warmQueued ||
		st.Operations != 12 || st.Wait.Count != uint64(1+warmQueued) || st.LastToken != 4 || !st.Metrics || st.Role != "single" {
		t.Errorf("stats: %+v", st)
	}
}

// TestMetricsPrefixCardinality: at most maxPrefixes prefixes get their own series; the rest,
// keys with invalid UTF-8 and over-long prefixes count as "other".
func TestMetricsPrefixCardinality(t *testing.T) {
	ts, _ := startOpsServer(t, nil)
	a := connect(t, ts.addr, "")
	id := uint64(0)
	take := func(key string) {
		id++
		tok := a.expectAnswerTo(acquire(id, key, 30000, 0), wire.StatusOK).Token
		id++
		a.expectAnswerTo(release(id, key, tok), wire.StatusOK)
	}
	for i := 0; i < maxPrefixes+8; i++ {
		take("p" + string(rune('A'+i)) + ":1")
	}
	take("\xff\xfe:x")
	take(strings.Repeat("L", maxPrefixLen+1))
	take("other:1")
	g := gathered(t, ts.Server)
	prefixes := map[string]bool{}
	for name := range g {
		if strings.HasPrefix(name, "ticketing_grants_total{kind=immediate,prefix=") {
			prefixes[strings.TrimSuffix(strings.TrimPrefix(name, "ticketing_grants_total{kind=immediate,prefix="), "}")] = true
		}
	}
	if len(prefixes) != maxPrefixes+1 || !prefixes["other"] || !prefixes["pA"] || prefixes["p"+string(rune('A'+maxPrefixes))] {
		t.Fatalf("prefixes %d: %v", len(prefixes), prefixes)
	}
	if v := g["ticketing_grants_total{kind=immediate,prefix=other}"].GetCounter().GetValue(); v != 8+3 {
		t.Fatalf("other: %v grants, want 11", v)
	}
}

// TestMetricsExposition: label values that need escaping survive Prometheus' parser; the Go
// runtime's and the process's series are there with sane values; the content type is the text
// format's.
func TestMetricsExposition(t *testing.T) {
	ts, admin := startOpsServer(t, nil)
	a := connect(t, ts.addr, "")
	weird := "q\"uo\\te\nline"
	tok := a.expectAnswerTo(acquire(1, weird+":1", 30000, 0), wire.StatusOK).Token
	a.expectAnswerTo(release(2, weird+":1", tok), wire.StatusOK)
	g := gathered(t, ts.Server)
	// (The first grant may queue behind the durable restart horizon: immediate or handoff.)
	if v := g["ticketing_grants_total{kind=immediate,prefix="+weird+"}"].GetCounter().GetValue() +
		g["ticketing_grants_total{kind=handoff,prefix="+weird+"}"].GetCounter().GetValue(); v != 1 {
		t.Errorf("grants of the escaped prefix: %v, want 1", v)
	}
	if v := g["process_resident_memory_bytes"].GetGauge().GetValue(); v < 1<<20 || v > 1<<34 {
		t.Errorf("process_resident_memory_bytes = %v", v)
	}
	if v := g["process_open_fds"].GetGauge().GetValue(); v < 3 {
		t.Errorf("process_open_fds = %v", v)
	}
	if v := g["process_start_time_seconds"].GetGauge().GetValue(); math.Abs(v-float64(time.Now().Unix())) > 3600 {
		t.Errorf("process_start_time_seconds = %v, now %d", v, time.Now().Unix())
	}
	if v := g["go_goroutines"].GetGauge().GetValue(); v < 2 {
		t.Errorf("go_goroutines = %v", v)
	}
	if v := g["go_memstats_alloc_bytes_total"].GetCounter().GetValue(); v <= 0 {
		t.Errorf("go_memstats_alloc_bytes_total = %v", v)
	}
	if _, ok := g["go_info{version="+runtime.Version()+"}"]; !ok {
		t.Errorf("go_info missing")
	}
	found := false
	for name, m := range g {
		if strings.HasPrefix(name, "ticketing_build_info{") && strings.Contains(name, "version="+version.Version) &&
			strings.Contains(name, "go_version="+runtime.Version()) && m.GetGauge().GetValue() == 1 {
			found = true
		}
	}
	if !found {
		t.Errorf("ticketing_build_info with version %s missing", version.Version)
	}
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("content type %q", ct)
	}
}

func (c *rawClient) expectAnswerTo(r wire.Request, st wire.Status) wire.Response {
	c.t.Helper()
	c.send(r)
	return c.expectAnswer(r.ID, st)
}

func (c *rawClient) recvWithinT(d time.Duration) wire.Response {
	c.t.Helper()
	r, err := c.recvWithin(d)
	if err != nil {
		c.t.Fatal(err)
	}
	return r
}

// TestRequestPathAllocsMetrics is TestRequestPathAllocs with metrics on: the observer and the
// answer counters must not allocate in steady state either.
func TestRequestPathAllocsMetrics(t *testing.T) {
	f := newPathFixture(t, 1000)
	f.s.EnableMetrics()
	for i := 0; i < 3000; i++ {
		f.step(t)
	}
	if a := testing.AllocsPerRun(5000, func() { f.step(t) }); a != 0 {
		t.Fatalf("request path with metrics allocates %v times per acquire+release", a)
	}
	// The workload was counted: 2 answers per step plus the ACKs.
	g := gathered(t, f.s)
	if v := g["ticketing_operations_total{op=release,status=ok}"].GetCounter().GetValue(); v != float64(f.i) {
		t.Fatalf("releases counted %v, want %d", v, f.i)
	}
}

// BenchmarkRequestPathMetrics is BenchmarkRequestPath with metrics on (compare the two).
func BenchmarkRequestPathMetrics(b *testing.B) {
	f := newPathFixture(b, 10000)
	f.s.EnableMetrics()
	for i := 0; i < 20000; i++ {
		f.step(b)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		f.step(b)
	}
}

// warmQueuedOf is 1 when the warm-up acquire of TestMetricsKnownWorkload queued behind storage.
func warmQueuedOf(g map[string]*dto.Metric) float64 {
	return g["ticketing_queued_total{prefix=warm}"].GetCounter().GetValue()
}
