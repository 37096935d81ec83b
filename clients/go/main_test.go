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

func TestMain(m *testing.M) {
	srv, err := testserver.StartProcess(testserver.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
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
