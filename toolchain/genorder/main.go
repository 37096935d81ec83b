// Command genorder writes the server's text order (cmd/ticketing/textorder.txt): the functions a
// single node runs, from start-up through a busy request path and the admin page, which the
// release build's linker places together at the front of the binary (toolchain/README.md).
//
//	genorder -bin PLAIN -cover DIR[,DIR...] [-faults FILE] [-then DIR[,DIR...]] -o ORDER
//	genorder -faults-of PERF -ordered BIN -order ORDER
//
// PLAIN is the server built with the release flags and the ordinary linker (its symbol table
// names every function); DIR is a GOCOVERDIR written by a coverage build of the same source
// (go build -cover -coverpkg=all) while it ran; FILE lists functions seen faulting a page of
// the ordered binary outside its front (toolchain/gen-order.sh records them with perf), added
// at the end, then the functions that ran in the -then coverage data (a cluster's nodes) that
// are not listed yet: a single node's front stays as it is, a cluster node's code follows it. The
// second form prints the functions of BIN (built with ORDER) that the addresses
// of PERF (`perf script -F addr` of page faults) fall in, if ORDER does not name them. The list is: every function of the runtime and its internal packages (no coverage
// build instruments them), every package initialiser (all run at start), each function the
// coverage data shows running with its closures, generic instances and method values, the
// assembly functions of the packages those belong to (coverage does not see them; the large
// cryptographic ones are left out), the compiler's type equality functions, then FILE's names.
package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

func main() {
	bin := flag.String("bin", "", "the server built with the release flags and the ordinary linker")
	cover := flag.String("cover", "", "GOCOVERDIR folders of the coverage build's runs, comma-separated")
	faults := flag.String("faults", "", "optional file of function names to add at the end")
	then := flag.String("then", "", "optional GOCOVERDIR folders of a second tier (a cluster's nodes), listed after the rest")
	out := flag.String("o", "", "the order file to write")
	faultsOf := flag.String("faults-of", "", "perf script -F addr output of page faults of the ordered binary")
	ordered := flag.String("ordered", "", "the binary built with -order")
	order := flag.String("order", "", "the order file the binary was built with")
	flag.Parse()
	if *faultsOf != "" {
		if err := unlisted(*faultsOf, *ordered, *order); err != nil {
			fmt.Fprintln(os.Stderr, "genorder:", err)
			os.Exit(1)
		}
		return
	}
	if *bin == "" || *cover == "" || *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*bin, *cover, *faults, *then, *out); err != nil {
		fmt.Fprintln(os.Stderr, "genorder:", err)
		os.Exit(1)
	}
}

type symbol struct {
	name string
	addr uint64
	size uint64
}

func run(bin, cover, faults, then, out string) error {
	syms, err := functions(bin)
	if err != nil {
		return err
	}
	hot, err := covered(cover)
	if err != nil {
		return err
	}
	var order []string
	seen := make(map[string]bool)
	add := func(name string) {
		if !seen[name] {
			seen[name] = true
			order = append(order, name)
		}
	}
	for _, s := range syms {
		// The runtime's packages, and the assembly bodies with no package (memeqbody, ...).
		if runtimePkg(pkgOf(s.name)) || !strings.ContainsAny(s.name, "./:") {
			add(s.name)
		}
	}
	for _, s := range syms {
		if isInit(s.name) {
			add(s.name)
		}
	}
	for _, s := range syms {
		for _, k := range sourceKeys(s.name) {
			if hot[k] {
				add(s.name)
				break
			}
		}
	}
	for _, s := range syms {
		p := pkgOf(s.name)
		if (strings.HasSuffix(s.name, ".abi0") || strings.HasPrefix(s.name, "_rt0_")) && !strings.HasPrefix(p, "crypto/") && !strings.HasPrefix(p, "vendor/golang.org/x/crypto/") {
			add(s.name)
		}
	}
	for _, s := range syms {
		if strings.HasPrefix(s.name, "type:.eq.") || strings.HasPrefix(s.name, "type:.hash.") {
			add(s.name)
		}
	}
	if faults != "" {
		b, err := os.ReadFile(faults)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				add(line)
			}
		}
	}
	front := len(order) // the FIPS module's block goes here, behind the single node's functions
	if then != "" {
		next, err := covered(then)
		if err != nil {
			return err
		}
		for _, s := range syms {
			for _, k := range sourceKeys(s.name) {
				if next[k] {
					add(s.name)
					break
				}
			}
		}
	}
	size := make(map[string]uint64, len(syms))
	for _, s := range syms {
		size[s.name] = s.size
	}
	// The linker names an assembly function without its ABI suffix (the symbol table adds it);
	// the order then places its Go-ABI wrapper, if any, beside it.
	var names []string
	var total uint64
	written := make(map[string]bool)
	for i, n := range order {
		if i == front && front < len(order) {
			names = append(names, "---")
		}
		total += size[n]
		if n = strings.TrimSuffix(n, ".abi0"); !written[n] {
			written[n] = true
			names = append(names, n)
		}
	}
	var w bytes.Buffer
	fmt.Fprintf(&w, "# The server's text order: the functions a single node runs, placed first by the release\n")
	fmt.Fprintf(&w, "# build's linker, then (after ---, where the FIPS module's block goes) what a cluster node adds.\n")
	fmt.Fprintf(&w, "# Generated by toolchain/gen-order.sh; do not edit. %d functions, %d bytes.\n", len(names), total)
	for _, n := range names {
		w.WriteString(n)
		w.WriteByte('\n')
	}
	fmt.Fprintf(os.Stderr, "genorder: %d functions (%d bytes of code) of %d\n", len(names), total, len(syms))
	return os.WriteFile(out, w.Bytes(), 0o644)
}

// unlisted prints the functions the faulting addresses fall in that the order does not name.
func unlisted(faults, bin, order string) error {
	syms, err := functions(bin)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(order)
	if err != nil {
		return err
	}
	listed := make(map[string]bool)
	for _, line := range strings.Split(string(b), "\n") {
		listed[strings.TrimSpace(line)] = true
	}
	pf, err := os.ReadFile(faults)
	if err != nil {
		return err
	}
	printed := make(map[string]bool)
	for _, f := range strings.Fields(string(pf)) {
		a, err := strconv.ParseUint(f, 16, 64)
		if err != nil {
			continue
		}
		i := sort.Search(len(syms), func(i int) bool { return syms[i].addr > a }) - 1
		if i < 0 || a >= syms[i].addr+syms[i].size {
			continue
		}
		if n := strings.TrimSuffix(syms[i].name, ".abi0"); !listed[n] && !printed[n] {
			printed[n] = true
			fmt.Println(n)
		}
	}
	return nil
}

// functions lists the binary's functions in address order, from its ELF symbol table.
func functions(bin string) ([]symbol, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	es, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("%s: %w (build it without -ldflags=-s)", bin, err)
	}
	var syms []symbol
	for _, s := range es {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 {
			syms = append(syms, symbol{s.Name, s.Value, s.Size})
		}
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].addr < syms[j].addr })
	return syms, nil
}

// covered returns the source keys (package.Func, package.Type.Method, package.*Type.Method) of
// every function the coverage data shows running.
func covered(dirs string) (map[string]bool, error) {
	cmd := exec.Command("go", "tool", "covdata", "func", "-i", dirs)
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go tool covdata func: %w", err)
	}
	hot := make(map[string]bool)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || f[0] == "total:" || !strings.HasSuffix(f[len(f)-1], "%") || f[len(f)-1] == "0.0%" {
			continue
		}
		file, _, ok := strings.Cut(f[0], ":")
		slash := strings.LastIndexByte(file, '/')
		if !ok || slash < 0 {
			continue
		}
		pkg := escapePath(file[:slash])
		hot[pkg+"."+stripBrackets(f[1])] = true
	}
	return hot, sc.Err()
}

// escapePath writes an import path as the linker names it: dots in its last element as %2e.
func escapePath(p string) string {
	i := strings.LastIndexByte(p, '/')
	return p[:i+1] + strings.ReplaceAll(p[i+1:], ".", "%2e")
}

// pkgOf returns a symbol's package path: up to the first dot after the last slash.
func pkgOf(name string) string {
	i := strings.LastIndexByte(name, '/')
	if j := strings.IndexAny(name, "[("); j >= 0 && j < i {
		i = strings.LastIndexByte(name[:j], '/')
	}
	j := strings.IndexByte(name[i+1:], '.')
	if j < 0 {
		return name
	}
	return name[:i+1+j]
}

func runtimePkg(p string) bool {
	return p == "runtime" || strings.HasPrefix(p, "internal/runtime/") || p == "internal/bytealg" ||
		p == "internal/abi" || p == "internal/cpu" || p == "sync/atomic" || p == "internal/chacha8rand" ||
		p == "internal/stringslite" || p == "internal/goarch" || p == "internal/sync"
}

// isInit reports a package initialiser, its closures and the compiler's map initialisers
// (pkg.init, pkg.init.0, pkg.init.0.func1, pkg.map.init.0): all of them run at start.
func isInit(name string) bool {
	rest := strings.TrimPrefix(name, pkgOf(name))
	return rest == ".init" || strings.HasPrefix(rest, ".init.") || strings.HasPrefix(rest, ".map.init.")
}

var suffixRE = regexp.MustCompile(`(\.(func|gowrap|deferwrap)[0-9]+|-range[0-9]+|-fm|\.abi0)+$`)

// sourceKey maps a function symbol to the coverage key of the source function it comes from:
// generic instances lose their type arguments, closures, range-over-func bodies, method values
// and ABI wrappers map to their enclosing function, (*T).M becomes *T.M.
func sourceKeys(name string) []string {
	pkg := pkgOf(name)
	rest := strings.TrimPrefix(name, pkg+".")
	rest = stripBrackets(rest)
	for {
		r := suffixRE.ReplaceAllString(rest, "")
		if r == rest {
			break
		}
		rest = r
	}
	if strings.HasPrefix(rest, "(*") {
		if i := strings.Index(rest, ")."); i > 0 {
			rest = "*" + rest[2:i] + "." + rest[i+2:]
		}
	}
	// What is left is F, T.M or *T.M; an inlined function's closure (F.G.func1, now F.G)
	// belongs to F, so the first part alone is a key too.
	parts := strings.Split(rest, ".")
	keys := []string{pkg + "." + parts[0]}
	if len(parts) > 1 {
		keys = append(keys, pkg+"."+parts[0]+"."+parts[1])
	}
	return keys
}

// stripBrackets removes every bracketed type argument list, nested brackets included.
func stripBrackets(s string) string {
	var b strings.Builder
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
			continue
		case ']':
			if depth > 0 {
				depth--
				continue
			}
		}
		if depth == 0 {
			b.WriteByte(s[i])
		}
	}
	return b.String()
}
