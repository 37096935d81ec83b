package testserver

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreeAddrs returns n distinct addresses on host (a loopback address) that nobody listens on,
// for servers that must know their ports before they start (a cluster's peer list).
//
// The ports are taken below the kernel's ephemeral range, not from Listen(":0"): a port the
// kernel hands out for ":0" is one it may also give, a moment later, to any outgoing
// connection's source port (a node's Raft dial from its own loopback address took a port the
// harness had just chosen for that node, and the node died with "address already in use").
// Ports below the range are only ever taken by a process that asks for them by number.
func FreeAddrs(host string, n int) ([]string, error) {
	lo, hi := portWindow()
	var out []string
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	seen := map[int]bool{}
	for tries := 0; len(out) < n; tries++ {
		if tries >= 200+20*n {
			return nil, fmt.Errorf("no %d free ports on %s in [%d, %d) after %d tries", n, host, lo, hi, tries)
		}
		port := lo + rand.IntN(hi-lo)
		if seen[port] {
			continue
		}
		seen[port] = true
		// Every listener stays open until all are chosen: the same port is never chosen twice.
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			continue
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	return out, nil
}

// FreePortRun returns a port p below the ephemeral range (see FreeAddrs) such that p, p+1, ...,
// p+run-1 are free on every host given (deploy's plans put the Raft port next to the client's).
func FreePortRun(hosts []string, run int) (int, error) {
	lo, hi := portWindow()
	for tries := 0; tries < 200; tries++ {
		port := lo + rand.IntN(hi-lo-run)
		if portsFree(hosts, port, run) {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no run of %d free ports on %v in [%d, %d)", run, hosts, lo, hi)
}

func portsFree(hosts []string, port, run int) bool {
	for _, h := range hosts {
		for p := port; p < port+run; p++ {
			ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(p)))
			if err != nil {
				return false
			}
			ln.Close()
		}
	}
	return true
}

// portWindow is [lo, hi): up to 12,000 ports just below the ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range; 32768 where it cannot be read), never below 10000.
func portWindow() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 11024 {
				hi = v
			}
		}
	}
	lo = max(hi-12000, 10000)
	return lo, hi
}
