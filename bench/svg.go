package main

import (
	"fmt"
	"html"
	"math"
	"sort"
	"strings"
)

// A small SVG line chart: throughput of workload (a) against connections, one line per system,
// on a logarithmic y axis (the systems differ by orders of magnitude). No plotting dependency.

var seriesStyle = map[string]struct{ color, dash string }{
	"ticketing": {"#1f6fb4", ""},
	"redis":     {"#c0392b", ""},
	"etcd":      {"#2e8b3a", ""},
	"null":      {"#777777", "6,4"},
}

type series struct {
	name   string
	points map[int]float64
}

func (b *bench) chart() string {
	conns := append([]int(nil), b.o.conns...)
	sort.Ints(conns)
	var ss []series
	for _, sys := range b.o.systems {
		s := series{name: sys, points: map[int]float64{}}
		for _, c := range conns {
			if r := b.find(sys, "a_pipelined", c); r != nil && r.OpsPerSec > 0 {
				s.points[c] = r.OpsPerSec
			}
		}
		if len(s.points) > 0 {
			ss = append(ss, s)
		}
	}
	title := fmt.Sprintf("(a) uncontended acquire+release, pipeline depth %d, %d keys (pair = 2 ops)", b.o.depth, b.o.keys)
	sub := fmt.Sprintf("%s, %d CPUs shared by server and load generator", b.meta.Started, b.meta.CPUs)
	if b.o.repeat > 1 {
		sub += fmt.Sprintf(", median of %d runs", b.o.repeat)
	}
	return lineChart(title, sub, conns, ss)
}

func lineChart(title, subtitle string, xs []int, ss []series) string {
	const (
		W, H                     = 780, 480
		left, right, top, bottom = 90, 150, 70, 60
	)
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, v := range s.points {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi <= dlo {
		dhi = dlo + 1
	}
	y := func(v float64) float64 { return float64(top) + ph*(1-(math.Log10(v)-dlo)/(dhi-dlo)) }
	x := func(i int) float64 {
		if len(xs) == 1 {
			return float64(left) + pw/2
		}
		return float64(left) + 30 + (pw-60)*float64(i)/float64(len(xs)-1)
	}
	var s strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", W, H, W, H)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="26" font-size="15" font-weight="bold">%s</text>`+"\n", left-60, html.EscapeString(title))
	p(`<text x="%d" y="46" fill="#555">%s</text>`+"\n", left-60, html.EscapeString(subtitle))
	// Grid: decades, with 2x and 5x minor lines.
	for d := dlo; d <= dhi; d++ {
		v := math.Pow(10, d)
		yy := y(v)
		p(`<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ccc"/>`+"\n", left, yy, float64(left)+pw, yy)
		p(`<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-8, yy, axisLabel(v))
		if d < dhi {
			for _, m := range []float64{2, 5} {
				ym := y(v * m)
				p(`<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, ym, float64(left)+pw, ym)
			}
		}
	}
	p(`<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`+"\n", left, top, pw, ph)
	for i, c := range xs {
		p(`<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", x(i), float64(top)+ph+18, c)
	}
	p(`<text x="%.1f" y="%d" text-anchor="middle">connections</text>`+"\n", float64(left)+pw/2, H-14)
	p(`<text transform="translate(22,%.1f) rotate(-90)" text-anchor="middle">operations per second (log scale)</text>`+"\n", float64(top)+ph/2)
	for k, sr := range ss {
		st := seriesStyle[sr.name]
		if st.color == "" {
			st.color = "#444"
		}
		var pts []string
		for i, c := range xs {
			if v, ok := sr.points[c]; ok {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(v)))
			}
		}
		dash := ""
		if st.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, st.dash)
		}
		p(`<polyline fill="none" stroke="%s" stroke-width="2.5"%s points="%s"/>`+"\n", st.color, dash, strings.Join(pts, " "))
		for i, c := range xs {
			if v, ok := sr.points[c]; ok {
				p(`<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>`+"\n", x(i), y(v), st.color)
				// The top value at this x is labelled above its point, the others below.
				dy := 16.0
				if isTop(ss, c, v) {
					dy = -7
				}
				p(`<text x="%.1f" y="%.1f" fill="%s" font-size="11">%s</text>`+"\n", x(i)+7, y(v)+dy, st.color, kops(v))
			}
		}
		ly := float64(top) + 14 + float64(k)*22
		lx := float64(left) + pw + 16
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.5"%s/>`+"\n", lx, ly, lx+24, ly, st.color, dash)
		p(`<text x="%.1f" y="%.1f" dominant-baseline="middle">%s</text>`+"\n", lx+30, ly, html.EscapeString(sr.name))
	}
	p("</svg>\n")
	return s.String()
}

func isTop(ss []series, x int, v float64) bool {
	for _, s := range ss {
		if w, ok := s.points[x]; ok && w > v {
			return false
		}
	}
	return true
}

func axisLabel(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}
