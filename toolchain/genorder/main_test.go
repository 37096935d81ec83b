package main

import (
	"slices"
	"testing"
)

// The symbol names the linker gives, mapped to the coverage keys of the source functions they
// come from.
func TestSourceKeys(t *testing.T) {
	for _, c := range []struct {
		sym  string
		want []string
	}{
		{"bufio.NewReaderSize", []string{"bufio.NewReaderSize"}},
		{"bufio.(*Reader).Read", []string{"bufio.*Reader", "bufio.*Reader.Read"}},
		{"net/netip.Addr.String", []string{"net/netip.Addr", "net/netip.Addr.String"}},
		{"github.com/ticketing/ticketing/internal/server.(*conn).serve.func2", []string{
			"github.com/ticketing/ticketing/internal/server.*conn", "github.com/ticketing/ticketing/internal/server.*conn.serve"}},
		{"slices.SortFunc[go.shape.struct { Name string; V []int }]", []string{"slices.SortFunc"}},
		{"internal/sync.(*HashTrieMap[go.shape.*internal/abi.Type,go.shape.interface {}]).Load", []string{
			"internal/sync.*HashTrieMap", "internal/sync.*HashTrieMap.Load"}},
		{"os.(*File).Read-fm", []string{"os.*File", "os.*File.Read"}},
		{"gopkg.in/yaml%2ev3.Unmarshal", []string{"gopkg.in/yaml%2ev3.Unmarshal"}},
		{"syscall.rawSyscallNoError.abi0", []string{"syscall.rawSyscallNoError"}},
		{"time.Sleep.deferwrap1", []string{"time.Sleep"}},
		{"iter.Pull.func1-range2", []string{"iter.Pull"}},
	} {
		if got := sourceKeys(c.sym); !slices.Equal(got, c.want) {
			t.Errorf("sourceKeys(%q) = %q, want %q", c.sym, got, c.want)
		}
	}
}

func TestPkgAndInit(t *testing.T) {
	for sym, pkg := range map[string]string{
		"runtime.mallocgc":                        "runtime",
		"github.com/hashicorp/raft.(*Raft).Apply": "github.com/hashicorp/raft",
		"internal/sync.(*HashTrieMap[go.shape.*internal/abi.Type,go.shape.interface {}]).Load": "internal/sync",
		"gopkg.in/yaml%2ev3.Unmarshal": "gopkg.in/yaml%2ev3",
		"memeqbody":                    "memeqbody",
	} {
		if got := pkgOf(sym); got != pkg {
			t.Errorf("pkgOf(%q) = %q, want %q", sym, got, pkg)
		}
	}
	for sym, want := range map[string]bool{
		"crypto/tls.init": true, "crypto/tls.init.0": true, "syscall.init.OnceFunc.func3": true,
		"time.map.init.0": true, "crypto/tls.initDefaults": false, "os.(*File).init": false,
	} {
		if got := isInit(sym); got != want {
			t.Errorf("isInit(%q) = %v", sym, got)
		}
	}
}
