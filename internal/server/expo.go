package server

import (
	"math"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"syscall"
)

// The Prometheus text exposition format, version 0.0.4, written by hand: the server needs a
// handful of counters, gauges and histograms, and the client library (with the protobuf runtime
// it brings) cost the process about 2 MB of resident memory for it. The format's rules, as
// Prometheus parses them: a family is "# HELP", "# TYPE" and then all of its samples together;
// label values escape \, " and newline; HELP escapes \ and newline; a histogram is cumulative
// name_bucket{le=...} samples ending with le="+Inf", then name_sum and name_count. The tests
// parse what this writes with Prometheus' own parser (TestMetricsKnownWorkload).

const expoContentType = "text/plain; version=0.0.4; charset=utf-8"

// expo accumulates one scrape.
type expo struct{ b []byte }

// family starts a family; its samples must follow before the next family.
func (e *expo) family(name, typ, help string) {
	e.b = append(e.b, "# HELP "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = appendEscaped(e.b, help, false)
	e.b = append(e.b, "\n# TYPE "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = append(e.b, typ...)
	e.b = append(e.b, '\n')
}

// labels writes {k1="v1",...} from name, value pairs (none: nothing), with extra (a final
// pair such as le="0.5") when extra is not empty.
func (e *expo) labels(kv []string, extraName, extraValue string) {
	if len(kv) == 0 && extraName == "" {
		return
	}
	e.b = append(e.b, '{')
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.label(kv[i], kv[i+1])
	}
	if extraName != "" {
		if len(kv) > 0 {
			e.b = append(e.b, ',')
		}
		e.label(extraName, extraValue)
	}
	e.b = append(e.b, '}')
}

func (e *expo) label(name, value string) {
	e.b = append(e.b, name...)
	e.b = append(e.b, `="`...)
	e.b = appendEscaped(e.b, value, true)
	e.b = append(e.b, '"')
}

// float writes one sample with a float value; kv are label name, value pairs in name order.
func (e *expo) float(name string, v float64, kv ...string) {
	e.b = append(e.b, name...)
	e.labels(kv, "", "")
	e.b = append(e.b, ' ')
	e.b = appendFloat(e.b, v)
	e.b = append(e.b, '\n')
}

// uint writes one sample with a whole value (exact beyond 2^53, unlike a float).
func (e *expo) uint(name string, v uint64, kv ...string) {
	e.b = append(e.b, name...)
	e.labels(kv, "", "")
	e.b = append(e.b, ' ')
	e.b = strconv.AppendUint(e.b, v, 10)
	e.b = append(e.b, '\n')
}

// histogram writes one histogram: counts[i] observations fell at or below bounds[i] and above
// the bound before (not cumulative), counts[len(bounds)] above the last bound.
func (e *expo) histogram(name string, bounds []float64, counts []uint64, n uint64, sum float64, kv ...string) {
	var cum uint64
	for i := 0; i <= len(bounds); i++ {
		le := "+Inf"
		if i < len(bounds) {
			le = string(appendFloat(nil, bounds[i]))
		}
		cum += counts[i]
		e.b = append(e.b, name...)
		e.b = append(e.b, "_bucket"...)
		e.labels(kv, "le", le)
		e.b = append(e.b, ' ')
		e.b = strconv.AppendUint(e.b, cum, 10)
		e.b = append(e.b, '\n')
	}
	e.float(name+"_sum", sum, kv...)
	e.uint(name+"_count", n, kv...)
}

// appendFloat formats v as Prometheus does: shortest round-trip form, +Inf, -Inf, NaN.
func appendFloat(b []byte, v float64) []byte {
	switch {
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case math.IsNaN(v):
		return append(b, "NaN"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// appendEscaped escapes \ and newline, and " too in a label value.
func appendEscaped(b []byte, s string, quote bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quote:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// The Go runtime's and the process's series, under the names the Prometheus Go client gives
// them (a subset: what an operator of this server looks at), read from runtime/metrics (no
// stop-the-world, unlike runtime.ReadMemStats) and /proc.

var goSamples = []struct {
	metric, name, typ, help string
}{
	{"/sched/goroutines:goroutines", "go_goroutines", "gauge", "Number of goroutines that currently exist."},
	{"/sched/gomaxprocs:threads", "go_sched_gomaxprocs_threads", "gauge", "The current runtime.GOMAXPROCS setting."},
	{"/memory/classes/heap/objects:bytes", "go_memstats_heap_alloc_bytes", "gauge", "Number of heap bytes allocated and currently in use."},
	{"/gc/heap/allocs:bytes", "go_memstats_alloc_bytes_total", "counter", "Total number of bytes allocated in heap until now, even if released already."},
	{"/gc/heap/allocs:objects", "go_memstats_mallocs_total", "counter", "Total number of heap objects allocated, both live and gc-ed."},
	{"/gc/heap/frees:objects", "go_memstats_frees_total", "counter", "Total number of heap objects frees."},
	{"/memory/classes/heap/stacks:bytes", "go_memstats_stack_inuse_bytes", "gauge", "Number of bytes obtained from system for stack allocator."},
	{"/gc/heap/goal:bytes", "go_memstats_next_gc_bytes", "gauge", "Number of heap bytes when next garbage collection will take place."},
	{"/memory/classes/total:bytes", "go_memstats_sys_bytes", "gauge", "Number of bytes obtained from system."},
	{"/gc/cycles/total:gc-cycles", "go_gc_cycles_total", "counter", "Count of all completed GC cycles."},
}

// writeRuntime writes the go_* and process_* series.
func (e *expo) writeRuntime() {
	samples := make([]rtmetrics.Sample, len(goSamples))
	for i := range goSamples {
		samples[i].Name = goSamples[i].metric
	}
	rtmetrics.Read(samples)
	e.family("go_info", "gauge", "Information about the Go environment.")
	e.float("go_info", 1, "version", runtime.Version())
	for i, g := range goSamples {
		if samples[i].Value.Kind() != rtmetrics.KindUint64 {
			continue // not in this Go version
		}
		e.family(g.name, g.typ, g.help)
		e.uint(g.name, samples[i].Value.Uint64())
	}
	e.family("go_threads", "gauge", "Number of OS threads created.")
	n, _ := runtime.ThreadCreateProfile(nil)
	e.uint("go_threads", uint64(n))
	e.writeProcess()
}

// userHZ is the unit of the CPU times in /proc/PID/stat: sysconf(_SC_CLK_TCK), 100 on every
// Linux architecture Go supports.
const userHZ = 100

// writeProcess writes the process_* series from /proc (nothing where there is no /proc).
func (e *expo) writeProcess() {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return
	}
	// The fields after the command name (which may hold spaces and parentheses): state is 0,
	// utime 11, stime 12, starttime 19, vsize 20, rss 21.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 22 {
		return
	}
	num := func(k int) float64 { v, _ := strconv.ParseUint(f[k], 10, 64); return float64(v) }
	e.family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.")
	e.float("process_cpu_seconds_total", (num(11)+num(12))/userHZ)
	e.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
	e.float("process_resident_memory_bytes", num(21)*float64(os.Getpagesize()))
	e.family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.")
	e.float("process_virtual_memory_bytes", num(20))
	if boot := bootTime(); boot > 0 {
		e.family("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
		e.float("process_start_time_seconds", float64(boot)+num(19)/userHZ)
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		e.family("process_open_fds", "gauge", "Number of open file descriptors.")
		e.uint("process_open_fds", uint64(len(fds)))
	}
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil {
		e.family("process_max_fds", "gauge", "Maximum number of open file descriptors.")
		e.uint("process_max_fds", rl.Cur)
	}
}

// bootTime is the kernel's boot time in Unix seconds (/proc/stat btime), 0 if unknown.
func bootTime() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			t, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return t
		}
	}
	return 0
}
