package main

import (
	"fmt"
	"strings"
)

// The clients workload's report: one row per registry program, a column group per caller count,
// a details table, and the targets.

func (b *bench) findClient(name string, callers int) *Record {
	for _, r := range b.records {
		if r.Workload == "client_callers" && r.Client == name && r.Callers == callers {
			return r
		}
	}
	return nil
}

func callersWord(n int) string {
	if n == 1 {
		return "1 caller"
	}
	return fmt.Sprintf("%d callers", n)
}

// thousands formats x as an integer with commas.
func thousands(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

func intsJoin(v []int) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, " and ")
}

func xRatio(v float64) string {
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("%.2f", v)
}

func (b *bench) clientsMarkdown() string {
	o := b.o
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	rounds := fmt.Sprintf("%d rounds", o.repeat)
	if o.repeat == 1 {
		rounds = "1 round"
	}
	w("### Clients: acquire+release pairs/s through one client object, %s concurrent callers, %v counted per run after 1 s of warm-up, %s interleaved, fresh server per run%s\n\n",
		intsJoin(o.callers), o.clientDuration, rounds, b.loadNote("clients"))
	w("| client (API) |")
	for _, n := range o.callers {
		w(" %s | × raw | × incumbent | CPU µs/pair |", callersWord(n))
	}
	w("\n|---|")
	for range o.callers {
		w("---:|---:|---:|---:|")
	}
	w("\n")
	for _, p := range b.progs {
		e := p.e
		name := fmt.Sprintf("%s `%s`", e.Label, e.Name)
		if e.Incumbent != "" {
			name += " (incumbent: " + e.Incumbent + ")"
		}
		if e.Against == "redis" {
			name += ", on Redis"
		}
		w("| %s |", name)
		for _, n := range o.callers {
			r := b.findClient(e.Name, n)
			if r == nil || r.Skipped != "" {
				why := "not run"
				if r != nil {
					why = r.Skipped
				}
				w(" skipped: %s | | | |", strings.ReplaceAll(why, "|", "/"))
				continue
			}
			w(" %s | %s | %s | %.2f |", thousands(r.PairsPerSec), xRatio(r.VsRawPairs), xRatio(r.VsIncumbentPairs), r.CPUPerPairUS)
		}
		w("\n")
	}
	w("\n× raw, × incumbent: the median over the rounds of the program's pairs/s divided by go-raw's (or its incumbent's) in the same round at the same caller count. CPU µs/pair: the program's own CPU (all its threads, from /proc, over the counted window only: start-up and warm-up excluded) per pair; go-raw's is the harness's. ")
	if o.serverCPUs != "" {
		w("The servers ran on CPUs %s only (taskset), the programs on the CPUs the harness was started on.\n\n", o.serverCPUs)
	} else {
		w("The program and the server share the machine's %d CPUs (no pinning), so a program that needs more CPU per pair leaves less to the server.\n\n", b.meta.CPUs)
	}
	w("<details><summary>Every run, server CPU per pair, errors</summary>\n\n")
	w("| client | callers | runs (pairs/s) | client CPU cores | server CPU µs/pair | CPU/pair × raw | errors | failed runs | program |\n|---|---:|---|---:|---:|---:|---:|---:|---|\n")
	for _, n := range o.callers {
		for _, p := range b.progs {
			r := b.findClient(p.e.Name, n)
			if r == nil || r.Skipped != "" {
				continue
			}
			w("| %s | %d | %s | %.2f | %.2f | %s | %d | %d | %s |\n", r.Client, n, kopsList(r.Runs), r.ClientCPU, r.ServerCPUPerPairUS,
				xRatio(r.VsRawCPUPerPair), r.Errors, r.FailedRuns, strings.ReplaceAll(r.Note, "|", "/"))
		}
	}
	w("\n</details>\n\n")
	return s.String()
}

// clientTargets are the targets (clients.registry's targets column), one row each.
func (b *bench) clientTargets() string {
	o := b.o
	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	for _, p := range b.progs {
		e := p.e
		for _, n := range o.callers {
			r := b.findClient(e.Name, n)
			if has(e.Targets, "raw") && (n == 1 || n == 16) {
				want := 0.9
				if n == 16 {
					want = 0.5
				}
				w("| clients: %s >= %.1fx go-raw at %s | %s | %s |\n", e.Label, want, callersWord(n), b.clientFigure(r, "go-raw", n, r != nil && r.VsRawPairs > 0, func() float64 { return r.VsRawPairs }),
					targetVerdict(r != nil && r.VsRawPairs > 0, r != nil && r.VsRawPairs >= want))
			}
			if has(e.Targets, "incumbent") {
				want := 1.0
				if n == 1 || n == 16 {
					want = 1.5
				}
				w("| clients: %s >= %.1fx %s at %s | %s | %s |\n", e.Label, want, e.Incumbent, callersWord(n), b.clientFigure(r, e.Incumbent, n, r != nil && r.VsIncumbentPairs > 0, func() float64 { return r.VsIncumbentPairs }),
					targetVerdict(r != nil && r.VsIncumbentPairs > 0, r != nil && r.VsIncumbentPairs >= want))
			}
		}
	}
	return s.String()
}

// clientFigure is a target row's figure: the ratio and both pairs/s, or why there is none.
func (b *bench) clientFigure(r *Record, ref string, n int, ok bool, v func() float64) string {
	rr := b.findClient(ref, n)
	switch {
	case r == nil:
		return "not run"
	case r.Skipped != "":
		return "not measured: " + strings.ReplaceAll(r.Skipped, "|", "/")
	case rr == nil || rr.Skipped != "":
		why := "not run"
		if rr != nil {
			why = rr.Skipped
		}
		return fmt.Sprintf("not measured: %s skipped: %s", ref, strings.ReplaceAll(why, "|", "/"))
	case !ok:
		return "not measured: no round with both"
	}
	return fmt.Sprintf("%.2fx (%s vs %s pairs/s)", v(), thousands(r.PairsPerSec), thousands(rr.PairsPerSec))
}

func targetVerdict(measured, ok bool) string {
	if !measured {
		return "not measured"
	}
	return yesNo(ok)
}
