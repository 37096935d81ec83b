package testserver

import (
	"net"
	"strconv"
	"testing"
)

func TestFreeAddrsAreBelowTheEphemeralRange(t *testing.T) {
	lo, hi := portWindow()
	addrs, err := FreeAddrs("127.0.0.1", 20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s chosen twice in %v", a, addrs)
		}
		seen[a] = true
		_, ps, _ := net.SplitHostPort(a)
		p, _ := strconv.Atoi(ps)
		if p < lo || p >= hi {
			t.Errorf("%s outside [%d, %d)", a, lo, hi)
		}
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Errorf("%s is not free: %v", a, err)
			continue
		}
		ln.Close()
	}
	port, err := FreePortRun([]string{"127.0.0.1", "127.0.0.2"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if port < lo || port+1 >= hi {
		t.Errorf("run at %d outside [%d, %d)", port, lo, hi)
	}
}
