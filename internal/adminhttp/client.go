package adminhttp

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client sends one request per connection (Connection: close) to an admin listener: the CLI
// asks a few questions a second at most, so it keeps no pool.
type Client struct {
	Timeout time.Duration // bound on each request, connection included (0: none beyond ctx)
	TLS     *tls.Config   // for https:// URLs (nil: the system roots)
	MaxBody int64         // largest answer read (default 16 MiB)
}

// ClientResponse is an answer, its body read whole.
type ClientResponse struct {
	StatusCode int
	Status     string // "404 Not Found"
	Header     Header
	Body       []byte
}

// Do sends method to rawURL (http:// or https://, origin-form path and query) with the given
// header fields and body, and reads the whole answer.
func (c *Client) Do(ctx context.Context, method, rawURL string, header map[string]string, body []byte) (*ClientResponse, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("%s: want http://host:port/path or https://...", rawURL)
	}
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	var d net.Dialer
	tcp, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	defer tcp.Close()
	stop := context.AfterFunc(ctx, func() { tcp.SetDeadline(time.Unix(1, 0)) }) // unblock on cancel
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		tcp.SetDeadline(dl)
	}
	conn := tcp
	if u.Scheme == "https" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLS != nil {
			cfg = c.TLS.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, err
		}
		conn = tc
	}
	resp, err := c.exchange(conn, method, u, header, body)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("%s %s: %w", method, rawURL, ctx.Err())
	}
	return resp, err
}

func (c *Client) exchange(conn net.Conn, method string, u *url.URL, header map[string]string, body []byte) (*ClientResponse, error) {
	bw := bufio.NewWriter(conn)
	fmt.Fprintf(bw, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nUser-Agent: ticketing-cli\r\n", method, u.RequestURI(), u.Host)
	for k, v := range header {
		if strings.ContainsAny(k+v, "\r\n") {
			return nil, fmt.Errorf("header %q: line break in a field", k)
		}
		fmt.Fprintf(bw, "%s: %s\r\n", k, v)
	}
	if body != nil || method == "POST" || method == "PUT" {
		fmt.Fprintf(bw, "Content-Length: %d\r\n", len(body))
	}
	bw.WriteString("\r\n")
	bw.Write(body)
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	limit := 64 << 10
	var status string
	for {
		line, err := readLine(br, &limit)
		if err != nil {
			return nil, fmt.Errorf("reading the answer: %w", err)
		}
		proto, rest, _ := strings.Cut(line, " ")
		code, _, _ := strings.Cut(rest, " ")
		if !strings.HasPrefix(proto, "HTTP/1.") || len(code) != 3 {
			return nil, fmt.Errorf("not an HTTP/1.x answer: %q", line)
		}
		status = rest
		if code[0] != '1' {
			break
		}
		for { // an interim answer (100 Continue): skip its fields
			if line, err = readLine(br, &limit); err != nil || line == "" {
				break
			}
		}
	}
	r := &ClientResponse{Status: status, Header: Header{}}
	r.StatusCode, _ = strconv.Atoi(status[:3])
	for {
		line, err := readLine(br, &limit)
		if err != nil {
			return nil, fmt.Errorf("reading the answer: %w", err)
		}
		if line == "" {
			break
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("malformed header field %q", line)
		}
		r.Header[strings.ToLower(name)] = strings.Trim(value, " \t")
	}
	max := c.MaxBody
	if max <= 0 {
		max = 16 << 20
	}
	if method == "HEAD" || r.StatusCode == 204 || r.StatusCode == 304 {
		return r, nil
	}
	if strings.EqualFold(r.Header["transfer-encoding"], "chunked") {
		return r, readChunked(br, r, max)
	}
	if cl, ok := r.Header["content-length"]; ok {
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad Content-Length %q", cl)
		}
		if n > max {
			return nil, fmt.Errorf("answer of %d bytes, over %d", n, max)
		}
		r.Body = make([]byte, n)
		_, err = io.ReadFull(br, r.Body)
		return r, err
	}
	b, err := io.ReadAll(io.LimitReader(br, max+1)) // delimited by the end of the connection
	if int64(len(b)) > max {
		return nil, fmt.Errorf("answer over %d bytes", max)
	}
	r.Body = b
	return r, err
}

// readChunked reads a chunked body (RFC 9112 section 7.1) into r.Body.
func readChunked(br *bufio.Reader, r *ClientResponse, max int64) error {
	limit := 64 << 10
	for {
		line, err := readLine(br, &limit)
		if err != nil {
			return err
		}
		size, _, _ := strings.Cut(line, ";")
		n, err := strconv.ParseInt(strings.TrimSpace(size), 16, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("bad chunk size %q", line)
		}
		if n == 0 {
			for { // trailer fields
				if line, err = readLine(br, &limit); err != nil || line == "" {
					return err
				}
			}
		}
		if int64(len(r.Body))+n > max {
			return errors.New("answer too large")
		}
		start := len(r.Body)
		r.Body = append(r.Body, make([]byte, n)...)
		if _, err := io.ReadFull(br, r.Body[start:]); err != nil {
			return err
		}
		if line, err = readLine(br, &limit); err != nil || line != "" {
			return fmt.Errorf("bad chunk end")
		}
	}
}
