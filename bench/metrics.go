package main

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Workload "metrics": the request path's throughput ((a), one connection count) with the
// server's metrics off and on, interleaved, every run on a fresh server. With metrics on, the
// harness scrapes the admin listener's /metrics once a second during the point, as a
// monitoring system would, so that the cost of exposition is counted too.
//
// The setting that turns metrics on comes from -metrics-env; "auto" looks for a flag whose
// name contains "metrics" in `ticketing server -h` and uses the opposite of its default value.
// When the server has no such setting the workload is reported as skipped.

// metricsSettings returns the environment for metrics on and off, or why there is none.
func (b *bench) metricsSettings() (on, off []string, why string) {
	o := b.o
	switch o.metricsEnv {
	case "":
		return nil, nil, "-metrics-env is empty"
	case "auto":
	default:
		return splitList(o.metricsEnv), splitList(o.metricsOffEnv), ""
	}
	out, _ := exec.Command(o.tkBin, "server", "-h").CombinedOutput()
	name, def, found := findMetricsSetting(string(out))
	if !found {
		return nil, nil, "the server has no metrics setting yet (no flag named *metrics* in `ticketing server -h`)"
	}
	opposite := map[string]string{"false": "true", "true": "false", "off": "on", "on": "off", "0": "1", "1": "0",
		"no": "yes", "yes": "no", "disabled": "enabled", "enabled": "disabled"}
	flip, ok := opposite[strings.ToLower(def)]
	if !ok {
		return nil, nil, fmt.Sprintf("%s has default %q: give -metrics-env and -metrics-off-env", name, def)
	}
	if def == "true" || def == "on" || def == "1" || def == "yes" || def == "enabled" {
		return []string{name + "=" + def}, []string{name + "=" + flip}, ""
	}
	return []string{name + "=" + flip}, []string{name + "=" + def}, ""
}

var settingRe = regexp.MustCompile(`(?m)^\s+-([a-z0-9-]*metrics[a-z0-9-]*)\b[^\n]*\n[^\n]*\(env (TICKETING_[A-Z0-9_]+), default "([^"]*)"\)`)

// findMetricsSetting finds a server setting named *metrics* in `ticketing server -h` output:
// its environment variable and default.
func findMetricsSetting(help string) (env, def string, ok bool) {
	m := settingRe.FindStringSubmatch(help)
	if m == nil {
		return "", "", false
	}
	return m[2], m[3], true
}

func (b *bench) workloadMetrics() error {
	o := b.o
	on, off, why := b.metricsSettings()
	if why != "" {
		logf("(metrics) skipped: %s", why)
		b.records = append(b.records, &Record{System: "ticketing", Workload: "a_metrics", Connections: o.metricsConns,
			Pipeline: o.depth, Keys: o.keys, Skipped: why})
		return nil
	}
	keys := makeKeys("key", o.keys)
	base := append([]string(nil), o.tkEnv...)
	settings := map[string][]string{
		"off": append(append(append([]string(nil), base...), "TICKETING_ADMIN_ADDR=127.0.0.1:0"), off...),
		"on":  append(append(append([]string(nil), base...), "TICKETING_ADMIN_ADDR=127.0.0.1:0"), on...),
	}
	runs := map[string][]*pointResult{}
	scraped := map[string]string{}
	for rep := 0; rep < o.repeat; rep++ {
		for _, mode := range []string{"off", "on"} {
			srv, err := b.startTicketingWith(settings[mode])
			if err != nil {
				return fmt.Errorf("(metrics) %s: %w", mode, err)
			}
			ws, err := pipelineWorkersAt("ticketing", srv.addr, o.metricsConns, o.depth, keys, "", false)
			if err != nil {
				srv.stop()
				return err
			}
			var scr *scraper
			if mode == "on" {
				scr = startScraper(srv.adminAddr())
			}
			res, err := runPoint(srv.target(), ws, o.warmup, o.duration, o.drain, false)
			if scr != nil {
				scraped[mode] = scr.stop()
			}
			srv.stop()
			if err != nil {
				return fmt.Errorf("(metrics) %s: %w", mode, err)
			}
			logf("(metrics) run %d/%d  metrics %-3s conns=%d  %12.0f ops/s  %s", rep+1, o.repeat, mode, o.metricsConns, res.opsPerSec(), scraped[mode])
			runs[mode] = append(runs[mode], res)
		}
	}
	for _, mode := range []string{"off", "on"} {
		rs := runs[mode]
		sorted := append([]*pointResult(nil), rs...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].opsPerSec() < sorted[j].opsPerSec() })
		r := b.pointRecord("ticketing", "a_metrics", o.metricsConns, o.depth, o.keys, sorted[len(sorted)/2])
		r.OpsPerSec = median(rs)
		for _, x := range rs {
			r.Runs = append(r.Runs, round1(x.opsPerSec()))
		}
		r.RunsMetric = "ops_per_sec"
		r.OpsCounting = "one acquire+release pair = 2 ops"
		r.Metrics = mode
		r.Setting = strings.Join(settings[mode][len(base):], " ")
		if mode == "on" {
			r.Note = "admin /metrics scraped once a second during the point: " + scraped[mode]
		}
		b.records = append(b.records, r)
	}
	return nil
}

// startTicketingWith starts a Ticketing node (not tracked as b's "ticketing") with env.
func (b *bench) startTicketingWith(env []string) (*server, error) {
	b.mu.Lock()
	b.seq++
	dir := fmt.Sprintf("%s/ticketing-m-%d", b.tmp, b.seq)
	b.mu.Unlock()
	if err := mkdir(dir); err != nil {
		return nil, err
	}
	return startTicketing(b.o.tkBin, dir, env)
}

// scraper GETs /metrics once a second.
type scraper struct {
	stopCh   chan struct{}
	wg       sync.WaitGroup
	ok, fail atomic.Int64
	bytes    atomic.Int64
	lastErr  atomic.Value
}

func startScraper(admin string) *scraper {
	s := &scraper{stopCh: make(chan struct{})}
	if admin == "" {
		s.lastErr.Store("no admin address in the server's log")
		return s
	}
	cl := &http.Client{Timeout: 2 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-s.stopCh:
				return
			case <-t.C:
			}
			resp, err := cl.Get("http://" + admin + "/metrics")
			if err != nil {
				s.fail.Add(1)
				s.lastErr.Store(err.Error())
				continue
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				s.fail.Add(1)
				s.lastErr.Store(resp.Status)
				continue
			}
			s.ok.Add(1)
			s.bytes.Store(n)
		}
	}()
	return s
}

// stop ends scraping and says how it went.
func (s *scraper) stop() string {
	close(s.stopCh)
	s.wg.Wait()
	msg := fmt.Sprintf("%d scrapes OK (%d bytes each), %d failed", s.ok.Load(), s.bytes.Load(), s.fail.Load())
	if e, _ := s.lastErr.Load().(string); e != "" {
		msg += " (" + e + ")"
	}
	return msg
}
