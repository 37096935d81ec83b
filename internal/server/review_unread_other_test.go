//go:build !linux

package server

import (
	"net"
	"testing"
)

// reviewUnread needs SIOCINQ (Linux): the test that uses it does not run elsewhere.
func reviewUnread(t *testing.T, nc net.Conn) int {
	t.Skip("needs SIOCINQ (Linux)")
	return 0
}
