package conformance

import (
	"os"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
)

// Target is the server side of a scenario: one node (singleNode) or a 3-node Raft cluster
// (clusterTarget, target_cluster_test.go). Every method waits until it has taken effect.
type Target interface {
	// Kind names the target in reports: "single" (one node) or "cluster3".
	Kind() string
	// Endpoints are the client addresses (host:port), in the order clients should try them.
	Endpoints() []string
	// Leader is the client address that serves clients now (the node itself on a single
	// node; on a cluster the leader, waiting for an election if there is none).
	Leader() (string, error)
	// MinLease is the shortest lease the target accepts (1 ms on one node; on a cluster what a
	// failover can cost).
	MinLease() time.Duration
	// Stop stops the serving node gracefully (SIGTERM; on a cluster the leader, which hands
	// leadership over first) and waits for the process to exit.
	Stop() error
	// Kill stops the serving node with SIGKILL (a crash; on a cluster the leader) and waits for
	// the process to exit.
	Kill() error
	// Restart starts the stopped or killed node again on the same addresses and data
	// directory, and waits until it listens (on a cluster: until a leader serves and every
	// node knows it).
	Restart() error
	// Freeze stops every node with SIGSTOP (nothing answers); Thaw resumes them with SIGCONT.
	Freeze() error
	Thaw() error
	// Exited is closed when the process stopped by the last Stop or Kill has exited.
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
func (n *singleNode) Kill() error             { n.srv.Kill(); return nil }
func (n *singleNode) Leader() (string, error) { return n.srv.Addr, nil }
func (n *singleNode) MinLease() time.Duration { return time.Millisecond }
func (n *singleNode) Restart() error          { return n.srv.Respawn() }
func (n *singleNode) Freeze() error           { return n.srv.Freeze() }
func (n *singleNode) Thaw() error             { return n.srv.Thaw() }
func (n *singleNode) Exited() <-chan struct{} { return n.srv.Exited() }
func (n *singleNode) Log() string             { return n.srv.Log() }

func (n *singleNode) Close() {
	n.srv.StopWithin(5 * time.Second)
	os.RemoveAll(n.dataDir)
}
