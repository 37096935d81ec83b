package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTextOrder builds the server as a release is built (toolchain/go-build.sh: the ordering
// linker and textorder.txt) and checks what that build is for (issue 28): the functions a node
// runs sit together at the front of its code, so that the 64 KiB windows the kernel maps around
// each page a node touches hold little else. It fails when the list has gone stale (most of its
// names no longer exist: run toolchain/gen-order.sh) or when the linker stopped applying it.
func TestTextOrder(t *testing.T) {
	b, err := os.ReadFile("textorder.txt")
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") && line != "---" {
			order = append(order, line)
		}
	}
	bin := filepath.Join(t.TempDir(), "ticketing")
	build := exec.Command("bash", "../../toolchain/go-build.sh", "-o", bin, "./cmd/ticketing")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("toolchain/go-build.sh: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "ticketing ") {
		t.Fatalf("the ordered binary does not run: %v %q", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	text := f.Section(".text")
	type fn struct{ addr, size uint64 }
	funcs := map[string]fn{}
	var fipsStart, fipsEnd uint64
	for _, s := range syms {
		switch s.Name {
		case "go:textfipsstart":
			fipsStart = s.Value
		case "go:textfipsend":
			fipsEnd = s.Value
		}
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 {
			funcs[strings.TrimSuffix(s.Name, ".abi0")] = fn{s.Value, s.Size}
		}
	}
	var found int
	var size uint64
	var listed []fn
	for _, name := range order {
		s, ok := funcs[name]
		if !ok {
			continue
		}
		found++
		if s.addr >= fipsStart && s.addr <= fipsEnd {
			continue // the FIPS module's code stays in one block, behind the rest (its own listed functions first)
		}
		size += s.size
		listed = append(listed, s)
	}
	// Alignment pads each function to 32 bytes; beyond that, nothing unlisted sits among them but
	// the FIPS module's block, which the linker puts behind the single node's functions, before
	// a cluster node's (the "---" line).
	front := text.Addr + size + size/8 + 64<<10
	if fipsStart < front {
		front += fipsEnd - fipsStart
	}
	var behind uint64
	for _, s := range listed {
		if s.addr+s.size > front {
			behind += s.size
		}
	}
	t.Logf("%d of %d listed functions in the binary: %d bytes of code, %d of them behind the first %d bytes of the text section (%d)",
		found, len(order), size, behind, front-text.Addr, text.Size)
	if found < len(order)*95/100 {
		t.Errorf("only %d of textorder.txt's %d functions are in the binary: the list is stale, run toolchain/gen-order.sh", found, len(order))
	}
	if size < 512<<10 || behind > size/100 {
		t.Errorf("the linker did not apply textorder.txt: %d bytes of its %d lie behind the front", behind, size)
	}
}
