// Command nullserver is the benchmark's null server (see internal/nullserver): the I/O limit.
// It listens on -addr (loopback), logs `msg=listening addr=HOST:PORT` to stderr, and stops on
// SIGINT/SIGTERM.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/ticketing/ticketing/bench/internal/nullserver"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nullserver:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "level=INFO msg=listening addr=%s\n", ln.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		ln.Close()
	}()
	nullserver.Serve(ln)
}
