package server

import (
	"encoding/hex"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// FuzzServerHandshake feeds arbitrary client bytes to the server's real handshake code. It must
// never panic or hang, and it may only succeed when the bytes hold a HELLO and an AUTH frame
// whose proof verifies (here: no auth configured, so any well-formed AUTH frame).
func FuzzServerHandshake(f *testing.F) {
	for _, v := range wire.Vectors().Handshake {
		b, _ := hex.DecodeString(v.Hex)
		f.Add(b)
	}
	hello := wire.AppendHello(nil, &wire.Hello{Version: wire.Version})
	f.Add(append(hello, wire.AppendAuth(nil, &wire.Auth{})...))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))

	cfg := Default()
	cfg.DataDir = f.TempDir()
	cfg.HandshakeTimeout = 50 * time.Millisecond
	s, err := New(cfg, quietLogger())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		defer client.Close()
		go func() { // the client: write the input, then read whatever comes back
			client.SetDeadline(time.Now().Add(time.Second))
			client.Write(in)
		}()
		go io.Copy(io.Discard, client)
		c, ok := s.handshake(server, nil)
		server.Close()
		if ok {
			s.closeConn(c)
		}
		if ok {
			var h wire.Hello
			if len(in) < wire.HelloSize+wire.AuthSize || wire.DecodeHello(in[:wire.HelloSize], &h) != nil ||
				wire.DecodeAuth(in[wire.HelloSize:wire.HelloSize+wire.AuthSize], &wire.Auth{}) != nil {
				t.Fatalf("handshake accepted % x", in)
			}
		}
	})
}
