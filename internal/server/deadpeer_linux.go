//go:build linux

package server

import (
	"net"
	"syscall"
	"time"
)

const tcpUserTimeout = 18 // TCP_USER_TIMEOUT, linux/tcp.h

// setDeadPeer makes the kernel detect a peer that stops answering within about d: keepalive
// probes after d/2 of silence, every d/6, three of them; and TCP_USER_TIMEOUT d, so data left
// unacknowledged for d fails the connection too (keepalive alone does not cover a peer that
// vanishes while we have unsent answers queued).
func setDeadPeer(c *net.TCPConn, d time.Duration) {
	c.SetKeepAliveConfig(net.KeepAliveConfig{
		Enable:   true,
		Idle:     max(d/2, time.Second),
		Interval: max(d/6, time.Second),
		Count:    3,
	})
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d/time.Millisecond))
		})
	}
}
