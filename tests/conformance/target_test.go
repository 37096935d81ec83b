package conformance

import (
	"os"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
)

// Target is the server side of a scenario: one node now, a 3-node cluster later (issue 11 adds
// a cluster target and runs the same scenarios through it for Go and one other client). Every
// method acts on all of the target's processes and waits until it has taken effect.
type Target interface {
	// Kind names the target in reports: "single" (one node), later "cluster3".
	Kind() string
	// Endpoints are the client addresses (host:port), in the order clients should try them.
	Endpoints() []string
	// Stop stops every node gracefully (SIGTERM) and waits for the processes to exit.
	Stop() error
	// Kill stops every node with SIGKILL (a crash) and waits for the processes to exit.
	Kill()
	// Restart starts the stopped or killed nodes again on the same addresses and data
	// directories, and waits until they listen.
	Restart() error
	// Freeze stops every node with SIGSTOP; Thaw resumes them with SIGCONT.
	Freeze() error
	Thaw() error
	// Exited is closed when the processes stopped by the last Stop or Kill have exited.
	Exited() <-chan struct{}
	// Log is what the nodes wrote to stderr (for failure reports).
	Log() string
	// Close stops everything and removes what the target created.
	Close()
}

// targetConfig is what a scenario asks of its server.
type targetConfig struct {
	Token    string   // shared auth token; "" = none
	TLS      bool     // serve TLS with the run's test certificates
	ClientCA bool     // with TLS: require client certificates (mutual TLS)
	Env      []string // extra settings, KEY=VALUE
}

// targetFactory starts a target; the runner has one per target kind.
type targetFactory func(cfg targetConfig) (Target, error)

// singleNode is one server process (internal/testserver).
type singleNode struct {
	srv     *testserver.Server
	dataDir string
}

// defaultServerEnv are the settings of every conformance server (SCENARIOS.md): a restarted
// node grants at once, so a restart scenario does not wait out earlier leases.
var defaultServerEnv = []string{"TICKETING_STARTUP_GRACE=0"}

// newSingleNodeFactory makes targets running bin with the run's certificates.
func newSingleNodeFactory(bin string, certs *testserver.TLSFiles) targetFactory {
	return func(cfg targetConfig) (Target, error) {
		dir, err := os.MkdirTemp("", "ticketing-conformance-data-")
		if err != nil {
			return nil, err
		}
		sc := testserver.Config{Bin: bin, DataDir: dir, Token: cfg.Token,
			Env: append(append([]string(nil), defaultServerEnv...), cfg.Env...)}
		if cfg.TLS {
			sc.TLSCert, sc.TLSKey = certs.ServerCert, certs.ServerKey
			if cfg.ClientCA {
				sc.TLSClientCA = certs.ClientCA
			}
		}
		srv, err := testserver.StartProcess(sc)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		return &singleNode{srv: srv, dataDir: dir}, nil
	}
}

func (n *singleNode) Kind() string            { return "single" }
func (n *singleNode) Endpoints() []string     { return []string{n.srv.Addr} }
func (n *singleNode) Stop() error             { return n.srv.Stop() }
func (n *singleNode) Kill()                   { n.srv.Kill() }
func (n *singleNode) Restart() error          { return n.srv.Respawn() }
func (n *singleNode) Freeze() error           { return n.srv.Freeze() }
func (n *singleNode) Thaw() error             { return n.srv.Thaw() }
func (n *singleNode) Exited() <-chan struct{} { return n.srv.Exited() }
func (n *singleNode) Log() string             { return n.srv.Log() }

func (n *singleNode) Close() {
	n.srv.StopWithin(5 * time.Second)
	os.RemoveAll(n.dataDir)
}
