package server

import (
	"bytes"
	"math"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
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
type expo struct {
	b []byte
	// Reused from scrape to scrape (metrics.scrapeMu): a scrape allocates nothing of its own
	// once warm, so that a scraped node's memory does not grow between collections, which the
	// request path, allocating nothing, makes rare (issue 28).
	samples []rtmetrics.Sample
	stat    [1024]byte // /proc/self/stat
	dirents []byte     // /proc/self/fd's entries
}

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
	if e.samples == nil {
		e.samples = make([]rtmetrics.Sample, len(goSamples))
		for i := range goSamples {
			e.samples[i].Name = goSamples[i].metric
		}
	}
	samples := e.samples
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
	n, err := readProc("/proc/self/stat", e.stat[:])
	if err != nil {
		return
	}
	stat := e.stat[:n]
	// The fields after the command name (which may hold spaces and parentheses): state is 0,
	// utime 11, stime 12, starttime 19, vsize 20, rss 21.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return
	}
	var f [22][]byte
	k := 0
	for field := range bytes.FieldsSeq(stat[i+1:]) {
		if k == len(f) {
			break
		}
		f[k] = field
		k++
	}
	if k < len(f) {
		return
	}
	num := func(k int) float64 { v, _ := strconv.ParseUint(string(f[k]), 10, 64); return float64(v) }
	e.family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.")
	e.float("process_cpu_seconds_total", (num(11)+num(12))/userHZ)
	e.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
	e.float("process_resident_memory_bytes", num(21)*float64(os.Getpagesize()))
	e.family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.")
	e.float("process_virtual_memory_bytes", num(20))
	if boot := bootTimeOnce(); boot > 0 {
		e.family("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
		e.float("process_start_time_seconds", float64(boot)+num(19)/userHZ)
	}
	if fds, ok := e.openFDs(); ok {
		e.family("process_open_fds", "gauge", "Number of open file descriptors.")
		e.uint("process_open_fds", uint64(fds))
	}
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil {
		e.family("process_max_fds", "gauge", "Maximum number of open file descriptors.")
		e.uint("process_max_fds", rl.Cur)
	}
}

// readProc reads a small /proc file into buf (truncated at its size).
func readProc(path string, buf []byte) (int, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer syscall.Close(fd)
	n := 0
	for n < len(buf) {
		m, err := syscall.Read(fd, buf[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}

// openFDs counts the entries of /proc/self/fd (less its own descriptor, "." and ".."), reading
// them into a buffer kept for the next scrape.
func (e *expo) openFDs() (int, bool) {
	fd, err := syscall.Open("/proc/self/fd", syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	defer syscall.Close(fd)
	if e.dirents == nil {
		e.dirents = make([]byte, 8<<10)
	}
	count := 0
	for {
		n, err := syscall.ReadDirent(fd, e.dirents)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, false
		}
		if n <= 0 {
			break
		}
		// struct linux_dirent64: ino 8, off 8, reclen 2, type 1, name.
		for b := e.dirents[:n]; len(b) >= 19; {
			reclen := int(b[16]) | int(b[17])<<8
			if reclen < 19 || reclen > len(b) {
				return 0, false
			}
			name := b[19:reclen]
			if end := bytes.IndexByte(name, 0); end >= 0 {
				name = name[:end]
			}
			if string(name) != "." && string(name) != ".." {
				count++
			}
			b = b[reclen:]
		}
	}
	return count - 1, true // less the descriptor counting them
}

var bootTimeOnce = sync.OnceValue(bootTime)

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
