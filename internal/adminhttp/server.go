// Package adminhttp is the HTTP/1.1 of the admin listener: a small server (routes by method and
// path, whole bodies in memory, keep-alive, bounded headers, bodies and times) and the client the
// CLI uses to reach it.
//
// Why not net/http: the server's resident memory is mostly its own binary, and the kernel maps a
// binary in 64 KiB windows, so nearly every page of code that runs ends up resident. Measured
// with net/http truly out of the binary (issue 28: go-metrics trimmed in third_party), the same
// handlers behind net/http's server instead of this one make the binary 1.24 MB larger and a
// node that has answered three /metrics and /readyz scrapes 550-600 KiB larger in peak RSS
// (9,692-9,788 against 9,124-9,176 KiB, three starts each; 490 KiB of it mapped code), about 6%
// of the 10 MB the product promises a busy node. This package is about 21 KB of code, fuzzed
// through its socket (FuzzServer). What it leaves out on purpose: chunked request bodies (411:
// send Content-Length), HTTP/2, streaming responses, absolute-form request targets, trailers,
// ranges and conditional requests. Clients that follow
// RFC 9112 (Prometheus, curl, browsers, Go's net/http) need none of them against these endpoints;
// the tests drive this server with net/http's client and this client against net/http's server.
package adminhttp

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Request is one parsed request, body included.
type Request struct {
	Method     string // GET, POST, ... (HEAD is routed as GET; the body of the answer is not sent)
	Path       string // decoded, starting with "/"
	Query      url.Values
	Header     Header
	Body       []byte
	RemoteAddr string
}

// Header holds header fields by lower-case name.
type Header map[string]string

// Get returns the value of the field name (any case), "" if absent.
func (h Header) Get(name string) string { return h[strings.ToLower(name)] }

// Response collects a handler's answer; the server sends it with its Content-Length.
type Response struct {
	status int
	header []string // name, value, name, value, ...
	body   bytes.Buffer
}

// Set sets a header field of the answer (Content-Length and Connection are the server's).
func (w *Response) Set(name, value string) {
	for i := 0; i < len(w.header); i += 2 {
		if strings.EqualFold(w.header[i], name) {
			w.header[i+1] = value
			return
		}
	}
	w.header = append(w.header, name, value)
}

// Status sets the status code (default 200).
func (w *Response) Status(code int) { w.status = code }

// Write appends to the body.
func (w *Response) Write(p []byte) (int, error) { return w.body.Write(p) }

// Error answers code with msg as plain text, as net/http's Error does.
func (w *Response) Error(code int, msg string) {
	w.status = code
	w.Set("Content-Type", "text/plain; charset=utf-8")
	w.Set("X-Content-Type-Options", "nosniff")
	w.body.Reset()
	w.body.WriteString(msg)
	w.body.WriteByte('\n')
}

// Handler answers one request.
type Handler func(w *Response, r *Request)

// Mux routes "METHOD /path" patterns: the path exactly, or with a final "*" every path that
// starts with what comes before it ("GET /ui/*"; the longest such pattern wins). A GET pattern
// also answers HEAD.
type Mux struct {
	mu     sync.RWMutex
	routes map[string]Handler // "GET /x" -> h
}

// Handle registers h for pattern ("GET /healthz", "GET /ui/*").
func (m *Mux) Handle(pattern string, h Handler) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok || !strings.HasPrefix(path, "/") {
		panic("adminhttp: bad pattern " + strconv.Quote(pattern)) // a programming error, at start-up
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.routes == nil {
		m.routes = map[string]Handler{}
	}
	m.routes[method+" "+path] = h
}

// Serve routes r: 404 for an unknown path, 405 (with Allow) for a known path and another method.
func (m *Mux) Serve(w *Response, r *Request) {
	method := r.Method
	if method == "HEAD" {
		method = "GET"
	}
	m.mu.RLock()
	h, allow := m.lookup(method, r.Path)
	m.mu.RUnlock()
	switch {
	case h != nil:
		h(w, r)
	case allow != "":
		w.Set("Allow", allow)
		w.Error(405, "method not allowed")
	default:
		w.Error(404, "404 page not found")
	}
}

// lookup finds the handler of method and path, or the methods that path has. m.mu held.
func (m *Mux) lookup(method, path string) (Handler, string) {
	var h Handler
	best := -1
	var allow []string
	for pattern, hh := range m.routes {
		pm, pp, _ := strings.Cut(pattern, " ")
		if pp != path && !(strings.HasSuffix(pp, "*") && strings.HasPrefix(path, pp[:len(pp)-1])) {
			continue
		}
		if pm != method {
			allow = append(allow, pm)
			continue
		}
		if len(pp) > best {
			h, best = hh, len(pp)
		}
	}
	if h == nil && len(allow) > 0 {
		return nil, strings.Join(allow, ", ")
	}
	return h, ""
}

// Server serves HTTP/1.1 on a listener (wrap it with tls.NewListener for HTTPS).
type Server struct {
	Handler        Handler
	HeaderTimeout  time.Duration // to read a request's line, header and body once it starts (default 5 s)
	IdleTimeout    time.Duration // a kept-alive connection waits this long for its next request (default 60 s)
	WriteTimeout   time.Duration // to send one answer (default 10 s)
	MaxHeaderBytes int           // request line and header fields (default 16 KiB; 431 beyond)
	MaxBodyBytes   int           // request body (default 1 MiB; 413 beyond)
	// MaxConns bounds the open connections (0: no bound). One beyond it is answered 503 and
	// closed, so that a flood of admin connections cannot take the process's descriptors.
	MaxConns int

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool // true while a request is in hand
	closed bool
	wg     sync.WaitGroup
}

// Serve accepts connections on ln until Close, then returns nil.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.ln = ln
	if s.conns == nil {
		s.conns = map[net.Conn]bool{}
	}
	s.mu.Unlock()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ECONNABORTED) {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second) // out of descriptors: back off, as net/http does
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		full := s.MaxConns > 0 && len(s.conns) >= s.MaxConns
		if !full {
			s.conns[c] = false
		}
		s.wg.Add(1)
		s.mu.Unlock()
		if full {
			go s.refuse(c)
			continue
		}
		go s.serveConn(c)
	}
}

// Close stops accepting, closes idle connections at once and the others after their current
// answer, and waits for them (at most timeout).
func (s *Server) Close(timeout time.Duration) {
	s.mu.Lock()
	s.closed = true
	if s.ln != nil {
		s.ln.Close()
	}
	for c, busy := range s.conns {
		if !busy {
			c.Close()
		}
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	}
}

func orDefault[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// serveConn answers requests on c one after another until either side ends it.
func (s *Server) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	if tc, ok := c.(*tls.Conn); ok {
		// The TLS handshake has the time of a request's header, not of an idle connection:
		// a client that stalls it would otherwise hold a connection slot for IdleTimeout.
		c.SetDeadline(time.Now().Add(orDefault(s.HeaderTimeout, 5*time.Second)))
		if err := tc.Handshake(); err != nil {
			return
		}
		c.SetDeadline(time.Time{})
	}
	br := bufio.NewReaderSize(c, 4096)
	bw := bufio.NewWriterSize(c, 4096)
	for {
		c.SetReadDeadline(time.Now().Add(orDefault(s.IdleTimeout, 60*time.Second)))
		if _, err := br.Peek(1); err != nil {
			return // closed, idle too long, or Close
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		s.conns[c] = true
		s.mu.Unlock()
		c.SetReadDeadline(time.Now().Add(orDefault(s.HeaderTimeout, 5*time.Second)))
		req, keep, perr := s.readRequest(br, bw, c)
		w := &Response{status: 200}
		switch {
		case perr != nil && perr.code == 0:
			return // the connection failed or timed out mid-request: nobody to answer
		case perr != nil:
			w.Error(perr.code, perr.msg)
			keep = false
		default:
			req.RemoteAddr = c.RemoteAddr().String()
			s.handle(w, req)
		}
		s.mu.Lock()
		s.conns[c] = false
		if s.closed {
			keep = false
		}
		s.mu.Unlock()
		c.SetWriteDeadline(time.Now().Add(orDefault(s.WriteTimeout, 10*time.Second)))
		if err := writeResponse(bw, w, req != nil && req.Method == "HEAD", keep); err != nil || !keep {
			return
		}
	}
}

// refuse answers a connection beyond MaxConns with 503 and closes it.
func (s *Server) refuse(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	w := &Response{}
	w.Error(503, fmt.Sprintf("too many admin connections (at most %d)", s.MaxConns))
	c.SetWriteDeadline(time.Now().Add(time.Second))
	writeResponse(bufio.NewWriter(c), w, false, false)
}

// handle runs the handler; a panic in it answers 500 instead of ending the process.
func (s *Server) handle(w *Response, r *Request) {
	defer func() {
		if p := recover(); p != nil {
			*w = Response{}
			w.Error(500, fmt.Sprint("internal error: ", p))
		}
	}()
	s.Handler(w, r)
}

// requestError is a request that gets an error answer (code 0: none, drop the connection).
type requestError struct {
	code int
	msg  string
}

// readRequest reads one request: line, header fields, body. keep: the connection may carry
// another request after the answer.
func (s *Server) readRequest(br *bufio.Reader, bw *bufio.Writer, c net.Conn) (*Request, bool, *requestError) {
	limit := orDefault(s.MaxHeaderBytes, 16<<10)
	line, err := readLine(br, &limit)
	if err != nil {
		return nil, false, lineError(err)
	}
	method, rest, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || method == "" || !isToken(method) {
		return nil, false, &requestError{400, "malformed request line"}
	}
	var keep bool
	switch proto {
	case "HTTP/1.1":
		keep = true
	case "HTTP/1.0":
	default:
		return nil, false, &requestError{505, "HTTP version not supported: " + proto}
	}
	if !strings.HasPrefix(target, "/") {
		return nil, false, &requestError{400, "the request target must be a path (origin form)"}
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, false, &requestError{400, "bad request target"}
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, false, &requestError{400, "bad query string"}
	}
	r := &Request{Method: method, Path: u.Path, Query: q, Header: Header{}}
	for {
		line, err := readLine(br, &limit)
		if err != nil {
			return nil, false, lineError(err)
		}
		if line == "" {
			break
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" || !isToken(name) {
			return nil, false, &requestError{400, "malformed header field"}
		}
		name, value = strings.ToLower(name), strings.Trim(value, " \t")
		if old, dup := r.Header[name]; dup {
			if name == "content-length" && old != value {
				return nil, false, &requestError{400, "conflicting Content-Length"}
			}
			value = old + ", " + value
		}
		r.Header[name] = value
	}
	switch conn := strings.ToLower(r.Header["connection"]); {
	case strings.Contains(conn, "close"):
		keep = false
	case strings.Contains(conn, "keep-alive"):
		keep = true
	}
	if _, chunked := r.Header["transfer-encoding"]; chunked {
		return nil, false, &requestError{411, "send the body with Content-Length (chunked bodies are not accepted)"}
	}
	if cl, ok := r.Header["content-length"]; ok {
		n, err := strconv.ParseInt(cl, 10, 64)
		switch {
		case err != nil || n < 0:
			return nil, false, &requestError{400, "bad Content-Length"}
		case n > int64(orDefault(s.MaxBodyBytes, 1<<20)):
			return nil, false, &requestError{413, fmt.Sprintf("body over %d bytes", orDefault(s.MaxBodyBytes, 1<<20))}
		case n > 0:
			if strings.EqualFold(r.Header["expect"], "100-continue") {
				c.SetWriteDeadline(time.Now().Add(orDefault(s.WriteTimeout, 10*time.Second)))
				bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
				if bw.Flush() != nil {
					return nil, false, &requestError{}
				}
			}
			r.Body = make([]byte, n)
			if _, err := io.ReadFull(br, r.Body); err != nil {
				return nil, false, &requestError{}
			}
		}
	}
	return r, keep, nil
}

var errHeaderTooLarge = errors.New("header too large")

// readLine reads one CRLF- (or LF-) terminated line, counting it against limit.
func readLine(br *bufio.Reader, limit *int) (string, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		*limit -= len(frag)
		if *limit < 0 {
			return "", errHeaderTooLarge
		}
		line = append(line, frag...)
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull {
			return "", err
		}
	}
	line = bytes.TrimSuffix(line[:len(line)-1], []byte("\r"))
	if bytes.IndexByte(line, 0) >= 0 || bytes.IndexByte(line, '\r') >= 0 {
		return "", errBadByte
	}
	return string(line), nil
}

var errBadByte = errors.New("bad byte")

func lineError(err error) *requestError {
	switch err {
	case errHeaderTooLarge:
		return &requestError{431, "request header fields too large"}
	case errBadByte:
		return &requestError{400, "malformed request"}
	}
	return &requestError{} // the connection failed or timed out
}

// isToken reports whether s is an RFC 9110 token (method and field names).
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return s != ""
}

// writeResponse sends w (its header only for HEAD).
func writeResponse(bw *bufio.Writer, w *Response, head, keep bool) error {
	fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\n", w.status, StatusText(w.status))
	hasType := false
	for i := 0; i < len(w.header); i += 2 {
		name, value := w.header[i], w.header[i+1]
		if strings.ContainsAny(name+value, "\r\n") {
			continue // never let a value split the header
		}
		hasType = hasType || strings.EqualFold(name, "Content-Type")
		bw.WriteString(name + ": " + value + "\r\n")
	}
	if !hasType && w.body.Len() > 0 {
		bw.WriteString("Content-Type: text/plain; charset=utf-8\r\n")
	}
	bw.WriteString("Content-Length: " + strconv.Itoa(w.body.Len()) + "\r\n")
	if !keep {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
	if !head {
		bw.Write(w.body.Bytes())
	}
	return bw.Flush()
}

// StatusText is the reason phrase of the codes this package and its handlers use.
func StatusText(code int) string {
	switch code {
	case 100:
		return "Continue"
	case 200:
		return "OK"
	case 400:
		return "Bad Request"
	case 401:
		return "Unauthorized"
	case 404:
		return "Not Found"
	case 405:
		return "Method Not Allowed"
	case 409:
		return "Conflict"
	case 411:
		return "Length Required"
	case 413:
		return "Content Too Large"
	case 431:
		return "Request Header Fields Too Large"
	case 500:
		return "Internal Server Error"
	case 503:
		return "Service Unavailable"
	case 505:
		return "HTTP Version Not Supported"
	}
	return "Status " + strconv.Itoa(code)
}
