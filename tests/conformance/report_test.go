package conformance

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// noteNotStarted marks every scenario of a driver that did not start.
const noteNotStarted = "driver did not start"

const (
	statusPass = "pass"
	statusFail = "FAIL"
	statusNA   = "n/a"
)

type result struct {
	status string
	note   string // FAIL: the first failure; n/a: why; a rerun: why the first run failed
	dur    time.Duration
	rerun  bool // the first run failed during a leader change the runner did not cause
}

// results is the driver x scenario table of a run.
type results struct {
	drivers   []string
	scenarios []scenario
	total     time.Duration

	mu    sync.Mutex
	cells map[string]map[string]result // driver -> scenario -> result
}

func newResults(specs []driverSpec, list []scenario) *results {
	r := &results{scenarios: list, cells: map[string]map[string]result{}}
	for _, sp := range specs {
		r.drivers = append(r.drivers, sp.name)
		r.cells[sp.name] = map[string]result{}
	}
	return r
}

func (r *results) set(driver, scenario string, res result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cells[driver][scenario] = res
}

// table renders the summary: one row per scenario, one column per driver, then the n/a reasons
// and the failures' first lines.
func (r *results) table(kind string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "conformance summary: target %s, %d drivers, %d scenarios, %v in all\n",
		kind, len(r.drivers), len(r.scenarios), r.total.Round(100*time.Millisecond))
	width := len("scenario")
	for _, sc := range r.scenarios {
		if len(sc.name) > width {
			width = len(sc.name)
		}
	}
	fmt.Fprintf(&b, "%-*s", width+2, "scenario")
	for _, d := range r.drivers {
		fmt.Fprintf(&b, "%-8s", d)
	}
	b.WriteString("\n")
	counts := map[string]int{}
	for _, sc := range r.scenarios {
		fmt.Fprintf(&b, "%-*s", width+2, sc.name)
		for _, d := range r.drivers {
			cell, ok := r.cells[d][sc.name]
			st := cell.status
			if !ok {
				st = "-" // not run (the run ended early)
			}
			counts[st]++
			if cell.rerun {
				st += "*"
			}
			fmt.Fprintf(&b, "%-8s", st)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "%-*s", width+2, "seconds")
	for _, d := range r.drivers {
		var sum time.Duration
		for _, c := range r.cells[d] {
			sum += c.dur
		}
		fmt.Fprintf(&b, "%-8.1f", sum.Seconds())
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "%d pass, %d FAIL, %d n/a", counts[statusPass], counts[statusFail], counts[statusNA])
	if counts["-"] > 0 {
		fmt.Fprintf(&b, ", %d not run", counts["-"])
	}
	b.WriteString("\n")
	if kind != "single" {
		fmt.Fprintf(&b, "%d clusters started; %d leader changes the runner did not cause (a leader that lost its quorum for a leader lease under load); %d scenarios run again after failing during one (marked *)\n",
			clusterStats.started.Load(), clusterStats.unplanned.Load(), clusterStats.reruns.Load())
	}
	var notes []string
	for _, d := range r.drivers {
		na := map[string][]string{}
		for _, sc := range r.scenarios {
			if c := r.cells[d][sc.name]; c.status == statusNA {
				na[c.note] = append(na[c.note], sc.name)
			}
		}
		var reasons []string
		for reason := range na {
			reasons = append(reasons, reason)
		}
		sort.Strings(reasons)
		for _, reason := range reasons {
			notes = append(notes, fmt.Sprintf("n/a %s (%s): %s", d, reason, strings.Join(na[reason], ", ")))
		}
	}
	for _, d := range r.drivers {
		if len(r.scenarios) > 0 && r.cells[d][r.scenarios[0].name].note == noteNotStarted {
			notes = append(notes, fmt.Sprintf("FAIL %s: %s (every scenario)", d, noteNotStarted))
			continue
		}
		for _, sc := range r.scenarios {
			if c := r.cells[d][sc.name]; c.status == statusFail {
				notes = append(notes, fmt.Sprintf("FAIL %s/%s: %s", d, sc.name, clip(c.note, 200)))
			} else if c.rerun {
				notes = append(notes, fmt.Sprintf("pass* %s/%s: passed on its second run; the first: %s", d, sc.name, clip(c.note, 200)))
			}
		}
	}
	for _, n := range notes {
		b.WriteString(n + "\n")
	}
	return b.String()
}
