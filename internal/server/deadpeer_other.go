//go:build !linux

package server

import (
	"net"
	"time"
)

// setDeadPeer enables keepalive probes; only Linux also bounds unacknowledged data.
func setDeadPeer(c *net.TCPConn, d time.Duration) {
	c.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: max(d/2, time.Second), Interval: max(d/6, time.Second), Count: 3})
}
