package adminhttp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// start serves s on a loopback port; the server closes when the test ends.
func start(t *testing.T, s *Server) string {
	t.Helper()
	return serveOn(t, s, nil)
}

// startTLS is start over TLS (httptest's certificate, for ServerName "example.com"); it also
// returns the roots that trust it.
func startTLS(t *testing.T, s *Server) (string, *x509.CertPool) {
	t.Helper()
	ts := httptest.NewTLSServer(http.NotFoundHandler()) // only for its certificate
	t.Cleanup(ts.Close)
	return serveOn(t, s, ts.TLS), ts.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
}

func serveOn(t *testing.T, s *Server, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := ln
	if cfg != nil {
		served = tls.NewListener(ln, cfg)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(served) }()
	t.Cleanup(func() {
		s.Close(time.Second)
		if err := <-done; err != nil {
			t.Errorf("Serve returned %v after Close", err)
		}
	})
	return ln.Addr().String()
}

func testMux() *Mux {
	m := &Mux{}
	m.Handle("GET /hello", func(w *Response, r *Request) {
		w.Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "hello %s", r.Query.Get("name"))
	})
	m.Handle("POST /echo", func(w *Response, r *Request) {
		w.Set("X-Len", fmt.Sprint(len(r.Body)))
		w.Set("X-Auth", r.Header.Get("Authorization"))
		w.Write(r.Body)
	})
	m.Handle("GET /files/*", func(w *Response, r *Request) { fmt.Fprint(w, "file ", r.Path) })
	m.Handle("GET /files/special/*", func(w *Response, r *Request) { fmt.Fprint(w, "special ", r.Path) })
	m.Handle("GET /panic", func(w *Response, r *Request) { panic("boom") })
	return m
}

// TestServerWithNetHTTPClient: Go's own HTTP client (what Prometheus and most tools are built
// on) gets the routes, bodies, status codes and header fields it expects, over one kept-alive
// connection.
func TestServerWithNetHTTPClient(t *testing.T) {
	addr := start(t, &Server{Handler: testMux().Serve})
	var conns sync.Map
	tr := &http.Transport{DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, a)
		if err == nil {
			conns.Store(c.LocalAddr().String(), true)
		}
		return c, err
	}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	get := func(method, path string, body io.Reader, hdr map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+addr+path, body)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	for _, c := range []struct {
		method, path string
		body         string
		code         int
		want         string
	}{
		{"GET", "/hello?name=a%20b", "", 200, "hello a b"},
		{"HEAD", "/hello", "", 200, ""},
		{"POST", "/echo", "payload", 200, "payload"},
		{"POST", "/echo", "", 200, ""},
		{"GET", "/files/a/b.txt", "", 200, "file /files/a/b.txt"},
		{"GET", "/files/special/x", "", 200, "special /files/special/x"},
		{"GET", "/nope", "", 404, "404 page not found\n"},
		{"POST", "/hello", "x", 405, "method not allowed\n"},
		{"GET", "/panic", "", 500, "internal error: boom\n"},
	} {
		var body io.Reader
		if c.body != "" {
			body = strings.NewReader(c.body)
		}
		resp, got := get(c.method, c.path, body, map[string]string{"Authorization": "Bearer x"})
		if resp.StatusCode != c.code || got != c.want {
			t.Errorf("%s %s: %d %q, want %d %q", c.method, c.path, resp.StatusCode, got, c.code, c.want)
		}
		if c.method == "HEAD" && resp.ContentLength != int64(len("hello ")) {
			t.Errorf("HEAD: Content-Length %d, want that of the GET", resp.ContentLength)
		}
		if c.code == 405 && resp.Header.Get("Allow") != "GET" {
			t.Errorf("405 without Allow: GET (%q)", resp.Header.Get("Allow"))
		}
		if c.method == "POST" && c.code == 200 && (resp.Header.Get("X-Len") != fmt.Sprint(len(c.body)) || resp.Header.Get("X-Auth") != "Bearer x") {
			t.Errorf("POST: handler saw %s bytes, auth %q", resp.Header.Get("X-Len"), resp.Header.Get("X-Auth"))
		}
	}
	n := 0
	conns.Range(func(_, _ any) bool { n++; return true })
	if n != 1 {
		t.Errorf("%d connections for sequential requests, want 1 (keep-alive)", n)
	}
	// A body the client announces with Expect: 100-continue (curl does above 1 KiB) arrives.
	big := strings.Repeat("x", 5000)
	resp, got := get("POST", "/echo", strings.NewReader(big), map[string]string{"Expect": "100-continue"})
	if resp.StatusCode != 200 || got != big {
		t.Errorf("Expect: 100-continue: %d, %d bytes back", resp.StatusCode, len(got))
	}
}

// raw sends text on a new connection and returns everything the server answers until it closes.
func raw(t *testing.T, addr, text string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, text)
	b, _ := io.ReadAll(c)
	return string(b)
}

// TestServerRejectsBadRequests: every malformed or oversized request gets its status and the
// connection is closed; the server keeps serving.
func TestServerRejectsBadRequests(t *testing.T) {
	addr := start(t, &Server{Handler: testMux().Serve, MaxHeaderBytes: 1024, MaxBodyBytes: 100})
	for _, c := range []struct{ name, req, status string }{
		{"garbage", "hello\r\n\r\n", "HTTP/1.1 400 "},
		{"absolute form", "GET http://x/hello HTTP/1.1\r\n\r\n", "HTTP/1.1 400 "},
		{"version", "GET /hello HTTP/2.0\r\n\r\n", "HTTP/1.1 505 "},
		{"bad method", "G(T /hello HTTP/1.1\r\n\r\n", "HTTP/1.1 400 "},
		{"field without colon", "GET /hello HTTP/1.1\r\nHost x\r\n\r\n", "HTTP/1.1 400 "},
		{"bad field name", "GET /hello HTTP/1.1\r\nHo st: x\r\n\r\n", "HTTP/1.1 400 "},
		{"NUL", "GET /hello HTTP/1.1\r\nHost: \x00\r\n\r\n", "HTTP/1.1 400 "},
		{"huge header", "GET /hello HTTP/1.1\r\nX: " + strings.Repeat("a", 2000) + "\r\n\r\n", "HTTP/1.1 431 "},
		{"huge body", "POST /echo HTTP/1.1\r\nContent-Length: 101\r\n\r\n", "HTTP/1.1 413 "},
		{"negative length", "POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 400 "},
		{"two lengths", "POST /echo HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "HTTP/1.1 400 "},
		{"chunked", "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n", "HTTP/1.1 411 "},
		{"bad query", "GET /hello?a=%zz HTTP/1.1\r\n\r\n", "HTTP/1.1 400 "},
	} {
		got := raw(t, addr, c.req)
		if !strings.HasPrefix(got, c.status) || !strings.Contains(got, "Connection: close\r\n") {
			t.Errorf("%s: got %q, want %q... and Connection: close", c.name, got, c.status)
		}
	}
	// HTTP/1.0 and Connection: close end the connection after the answer; the answer is whole.
	for _, req := range []string{"GET /hello?name=x HTTP/1.0\r\n\r\n", "GET /hello?name=x HTTP/1.1\r\nConnection: close\r\n\r\n"} {
		got := raw(t, addr, req)
		if !strings.HasPrefix(got, "HTTP/1.1 200 OK\r\n") || !strings.HasSuffix(got, "\r\n\r\nhello x") {
			t.Errorf("%q: got %q", req, got)
		}
	}
	// Two requests in one write (pipelined) are both answered, in order.
	got := raw(t, addr, "GET /hello?name=1 HTTP/1.1\r\n\r\nGET /hello?name=2 HTTP/1.1\r\nConnection: close\r\n\r\n")
	if strings.Count(got, "HTTP/1.1 200 OK") != 2 || strings.Index(got, "hello 1") > strings.Index(got, "hello 2") {
		t.Errorf("pipelined: %q", got)
	}
}

// TestServerTimeoutsAndClose: a client that stops mid-header is dropped after HeaderTimeout, an
// idle kept-alive connection after IdleTimeout; Close ends idle connections at once, lets a
// request in hand finish, and leaves no goroutine behind.
func TestServerTimeoutsAndClose(t *testing.T) {
	before := runtime.NumGoroutine()
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	m := testMux()
	m.Handle("GET /slow", func(w *Response, r *Request) {
		entered <- struct{}{}
		<-release
		fmt.Fprint(w, "done")
	})
	s := &Server{Handler: m.Serve, HeaderTimeout: 200 * time.Millisecond, IdleTimeout: 400 * time.Millisecond}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	addr := ln.Addr().String()

	dropped := func(c net.Conn, within time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(within))
		_, err := io.ReadAll(c)
		return err == nil // EOF from the server, not our deadline
	}
	slowloris, _ := net.Dial("tcp", addr)
	io.WriteString(slowloris, "GET /hello HTTP/1.1\r\nX: ")
	if !dropped(slowloris, 2*time.Second) {
		t.Error("a half-sent header was not dropped after HeaderTimeout")
	}
	slowloris.Close()
	idle, _ := net.Dial("tcp", addr)
	io.WriteString(idle, "GET /hello HTTP/1.1\r\n\r\n")
	br := bufio.NewReader(idle)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first answer: %v", err)
	}
	start := time.Now()
	if !dropped(idle, 3*time.Second) || time.Since(start) < 300*time.Millisecond {
		t.Errorf("idle connection: dropped after %v, want about IdleTimeout (400ms)", time.Since(start))
	}
	idle.Close()

	// Close with one request in hand and one idle connection.
	busy, _ := net.Dial("tcp", addr)
	io.WriteString(busy, "GET /slow HTTP/1.1\r\n\r\n")
	<-entered
	idle2, _ := net.Dial("tcp", addr)
	io.WriteString(idle2, "GET /hello HTTP/1.1\r\n\r\n")
	if _, err := http.ReadResponse(bufio.NewReader(idle2), nil); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { s.Close(5 * time.Second); close(closed) }()
	if !dropped(idle2, 2*time.Second) {
		t.Error("Close left an idle connection open")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve after Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("the listener still accepts after Close")
	}
	close(release)
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil || resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("the request in hand at Close: %v (want its answer, then the connection closed)", err)
	}
	<-closed
	busy.Close()
	idle2.Close()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Close, %d before", n, before)
	}
}

// TestClientAgainstNetHTTPServer: the client reads what Go's own server sends, with a
// Content-Length, chunked, or over TLS, and honours its timeout and size bound.
func TestClientAgainstNetHTTPServer(t *testing.T) {
	h := http.NewServeMux()
	h.HandleFunc("/len", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Method", r.Method)
		w.Header().Set("X-Auth", r.Header.Get("Authorization"))
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s|%s", r.URL.RawQuery, b)
	})
	h.HandleFunc("/chunked", func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "part%d;", i)
			w.(http.Flusher).Flush()
		}
	})
	h.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write(make([]byte, 2000)) })
	h.HandleFunc("/stall", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	h.HandleFunc("/teapot", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", 418) })
	for _, tlsOn := range []bool{false, true} {
		var srv *httptest.Server
		c := &Client{Timeout: 2 * time.Second}
		if tlsOn {
			srv = httptest.NewTLSServer(h)
			c.TLS = &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
		} else {
			srv = httptest.NewServer(h)
		}
		ctx := context.Background()
		r, err := c.Do(ctx, "POST", srv.URL+"/len?a=1", map[string]string{"Authorization": "Bearer t"}, []byte("body"))
		if err != nil || r.StatusCode != 200 || string(r.Body) != "a=1|body" || r.Header.Get("X-Method") != "POST" || r.Header.Get("x-auth") != "Bearer t" {
			t.Errorf("tls=%v POST: %v %+v", tlsOn, err, r)
		}
		r, err = c.Do(ctx, "GET", srv.URL+"/chunked", nil, nil)
		if err != nil || string(r.Body) != "part0;part1;part2;" {
			t.Errorf("tls=%v chunked: %v %q", tlsOn, err, r.Body)
		}
		r, err = c.Do(ctx, "GET", srv.URL+"/teapot", nil, nil)
		if err != nil || r.StatusCode != 418 || r.Status != "418 I'm a teapot" || string(r.Body) != "no\n" {
			t.Errorf("tls=%v 418: %v %+v", tlsOn, err, r)
		}
		if _, err := (&Client{MaxBody: 1000, TLS: c.TLS}).Do(ctx, "GET", srv.URL+"/big", nil, nil); err == nil {
			t.Errorf("tls=%v: an answer over MaxBody was accepted", tlsOn)
		}
		startT := time.Now()
		if _, err := (&Client{Timeout: 200 * time.Millisecond, TLS: c.TLS}).Do(ctx, "GET", srv.URL+"/stall", nil, nil); err == nil || time.Since(startT) > 2*time.Second {
			t.Errorf("tls=%v: a stalled server: %v after %v, want a timeout after 200ms", tlsOn, err, time.Since(startT))
		}
		srv.Close()
	}
	if _, err := (&Client{}).Do(context.Background(), "GET", "ftp://x/y", nil, nil); err == nil {
		t.Error("ftp:// accepted")
	}
	if _, err := (&Client{}).Do(context.Background(), "GET", "http://127.0.0.1:1/", map[string]string{"X": "a\r\nB: c"}, nil); err == nil {
		t.Error("a header value with a line break was sent")
	}
}

// TestClientAndServer: the two halves together, over TLS, as the CLI reaches the admin listener.
func TestClientAndServer(t *testing.T) {
	addr, roots := startTLS(t, &Server{Handler: testMux().Serve})
	c := &Client{Timeout: 2 * time.Second, TLS: &tls.Config{RootCAs: roots, ServerName: "example.com"}}
	r, err := c.Do(context.Background(), "POST", "https://"+addr+"/echo", nil, bytes.Repeat([]byte("z"), 3000))
	if err != nil || r.StatusCode != 200 || len(r.Body) != 3000 {
		t.Fatalf("POST over TLS: %v %+v", err, r)
	}
}

// TestServerConnectionLimit: beyond MaxConns a connection is answered 503 and closed; a slot
// freed is usable again.
func TestServerConnectionLimit(t *testing.T) {
	addr := start(t, &Server{Handler: testMux().Serve, MaxConns: 2})
	open := func() (net.Conn, *http.Response) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "GET /hello?name=x HTTP/1.1\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return c, resp
	}
	a, ra := open()
	b, rb := open()
	if ra.StatusCode != 200 || rb.StatusCode != 200 {
		t.Fatalf("under the limit: %d %d", ra.StatusCode, rb.StatusCode)
	}
	c, rc := open()
	if rc.StatusCode != 503 || !rc.Close {
		t.Errorf("beyond the limit: %d (close %v), want 503 and the connection closed", rc.StatusCode, rc.Close)
	}
	c.Close()
	a.Close()
	var rd *http.Response
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var d net.Conn
		d, rd = open() // the server sees a's end once its reader wakes
		d.Close()
		if rd.StatusCode == 200 {
			break
		}
	}
	if rd.StatusCode != 200 {
		t.Errorf("after a connection ended: %d, want 200", rd.StatusCode)
	}
	b.Close()
}

// TestServerTLSHandshakeTimeout: over TLS, a client that connects and never completes its
// handshake is dropped after HeaderTimeout, not kept for IdleTimeout.
func TestServerTLSHandshakeTimeout(t *testing.T) {
	addr, _ := startTLS(t, &Server{Handler: testMux().Serve, HeaderTimeout: 200 * time.Millisecond, IdleTimeout: time.Minute})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("the stalled handshake was not dropped: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("dropped after %v, want about HeaderTimeout (200ms)", d)
	}
}
