package adminhttp

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// FuzzServer: whatever bytes a client sends, the server answers with well-formed HTTP/1.1 (each
// answer parses with Go's own reader, in order) or nothing, and lets the connection go once the
// client has stopped sending; it never panics.
func FuzzServer(f *testing.F) {
	for _, s := range []string{
		"GET /hello?name=x HTTP/1.1\r\n\r\n",
		"GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /files/a HTTP/1.1\r\n\r\n",
		"POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
		"POST /echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
		"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET /hello HTTP/1.0\r\n\r\n",
		"GET /panic HTTP/1.1\r\nConnection: close\r\n\r\n",
		"GET / HTTP/1.1\r\nX: \x00\r\n\r\n",
		"\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	s := &Server{Handler: testMux().Serve, HeaderTimeout: 2 * time.Second, IdleTimeout: 2 * time.Second, MaxHeaderBytes: 512, MaxBodyBytes: 256}
	go s.Serve(ln)
	defer s.Close(time.Second)
	f.Fuzz(func(t *testing.T, in []byte) {
		// An answer to HEAD has no body, which a reader cannot tell without the request: the
		// method becomes another unknown one (answered 404 or 405, with a body), so every input
		// still runs. HEAD itself is covered by TestServerWithNetHTTPClient.
		in = bytes.ReplaceAll(in, []byte("HEAD"), []byte("HEAX"))
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		go func() {
			c.Write(in)
			c.(*net.TCPConn).CloseWrite() // the end of the request stream
		}()
		out, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("the server did not let the connection go: %v (%d bytes read)", err, len(out))
		}
		br := bufio.NewReader(bytes.NewReader(out))
		for {
			if _, err := br.Peek(1); err == io.EOF {
				return
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("malformed answer: %v\n%q", err, out)
			}
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				t.Fatalf("malformed body: %v\n%q", err, out)
			}
			resp.Body.Close()
			if resp.ProtoMajor != 1 || resp.ProtoMinor != 1 {
				t.Fatalf("answer in %s", resp.Proto)
			}
		}
	})
}
