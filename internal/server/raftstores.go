package server

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"

	"github.com/ticketing/ticketing/internal/raftnet"
)

// ClusterStores are the storage and transport a cluster node's Raft runs on, as
// hashicorp/raft takes them. ClusterConfig.Stores nil (a real node): the node opens its own
// (openStores): the log and stable store of TICKETING_RAFT_STORE and file snapshots in the data
// directory, and a network transport on RaftAddr (raftnet: the cluster secret, TLS). Tests
// inject hashicorp/raft's in-memory stores and transport instead, and run the same replicated
// code without disks or sockets between the nodes.
type ClusterStores struct {
	Logs      raft.LogStore
	Stable    raft.StableStore
	Snapshots raft.SnapshotStore
	Transport raft.Transport
}

// openStores opens a real node's stores in dir and its transport; they are closed by
// cluster.close.
func (c *cluster) openStores(dir string, hl hclog.Logger) (*ClusterStores, error) {
	cc := c.cfg
	st := &ClusterStores{}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	switch cc.LogStore {
	case "", "wal":
		if err := os.MkdirAll(filepath.Join(dir, "wal"), 0o700); err != nil {
			return nil, err
		}
		w, err := raftwal.Open(filepath.Join(dir, "wal"))
		if err != nil {
			return nil, fmt.Errorf("raft log (wal): %w", err)
		}
		st.Logs, st.Stable = w, w
		c.closer = append(c.closer, w)
	case "bolt":
		bs, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
		if err != nil {
			return nil, fmt.Errorf("raft log (bolt): %w", err)
		}
		st.Logs, st.Stable = bs, bs
		c.closer = append(c.closer, bs)
	default:
		return nil, fmt.Errorf("TICKETING_RAFT_STORE %q: want wal or bolt", cc.LogStore)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hl)
	if err != nil {
		return nil, fmt.Errorf("raft snapshots: %w", err)
	}
	st.Snapshots = snaps
	adv, err := net.ResolveTCPAddr("tcp", cc.Peers[cc.NodeID])
	if err != nil || cc.Peers[cc.NodeID] == "" {
		return nil, fmt.Errorf("TICKETING_PEERS must name this node (%s) with its raft address", cc.NodeID)
	}
	layer, err := raftnet.Listen(cc.RaftAddr, raftnet.Options{Secret: cc.Secret, ServerTLS: cc.RaftServerTLS,
		ClientTLS: cc.RaftClientTLS, Advertise: adv, Logger: c.s.log,
		AcceptTimeout: max(2*time.Second, time.Duration(float64(4*baseHeartbeat)*cc.timing()))})
	if err != nil {
		return nil, fmt.Errorf("raft listen %s: %w", cc.RaftAddr, err)
	}
	c.closer = append(c.closer, layer)
	c.conns = layer
	c.dialer = layer
	st.Transport = raft.NewNetworkTransportWithLogger(layer, 3, 10*time.Second, hl)
	return st, nil
}

// close shuts Raft down, then the transport, then what openStores opened (the transport's
// listener, the log store), in that order. Raft's shutdown waits for the RPCs in flight; one on
// a link that drops packets would hold it until its I/O timeout (10 s), so after a moment the
// connections under them are closed.
func (c *cluster) close() {
	if c.raft != nil {
		done := make(chan struct{})
		go func() {
			c.raft.Shutdown().Error()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(250 * time.Millisecond):
			if c.conns != nil {
				c.conns.CloseConns()
			}
			<-done
		}
	}
	if t, ok := c.trans.(io.Closer); ok {
		t.Close()
	} else if t, ok := c.trans.(raft.WithClose); ok {
		t.Close()
	}
	for _, x := range c.closer {
		x.Close()
	}
}
