package ticketing_test

import (
	"fmt"
	"os"
	"testing"

	ticketing "github.com/ticketing/ticketing/clients/go"
	"github.com/ticketing/ticketing/internal/testserver"
)

// addr is the shared test server's address; the examples connect to it.
var addr string

// TestMain starts one real server (built from this tree by internal/testserver) for the examples
// and the integration tests, on a free loopback port. TICKETING_BIN names the binary; default:
// built from this checkout.
func TestMain(m *testing.M) {
	srv, err := testserver.StartProcess(testserver.Config{Bin: os.Getenv("TICKETING_BIN")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "ticketing tests: cannot start the test server:", err)
		testserver.Cleanup()
		os.Exit(1)
	}
	addr = srv.Addr
	ticketing.SetSharedServer(addr)
	code := m.Run()
	srv.Stop()
	os.RemoveAll(srv.DataDir)
	testserver.Cleanup()
	os.Exit(code)
}
