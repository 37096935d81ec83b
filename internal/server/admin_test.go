package server

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// publicAddr makes a loopback listener report a routable address, so ServeAdmin applies its
// off-loopback rules while every byte of the test stays on loopback.
type publicAddr struct{ net.Listener }

func (publicAddr) Addr() net.Addr { return &net.TCPAddr{IP: net.ParseIP("192.0.2.10"), Port: 7071} }

// TestAdminOffLoopback: off loopback the admin listener refuses to start without its credential
// and TLS; with them, it answers only over TLS and only with the bearer credential.
func TestAdminOffLoopback(t *testing.T) {
	st, ct := raftTLS(t)
	st = st.Clone()
	st.ClientAuth = tls.NoClientCert
	listen := func() (net.Listener, string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return publicAddr{ln}, ln.Addr().String()
	}
	bare := startServer(t, nil)
	ln, _ := listen()
	if err := bare.ServeAdmin(ln); err == nil || !strings.Contains(err.Error(), "TICKETING_ADMIN_TOKEN") {
		t.Fatalf("off loopback without credential and TLS: %v", err)
	}
	ts := startServer(t, func(c *Config) { c.AdminToken, c.AdminTLS = "admin-secret", st })
	ln, addr := listen()
	done := make(chan error, 1)
	go func() { done <- ts.ServeAdmin(ln) }()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ct.RootCAs}}}
	defer hc.CloseIdleConnections()
	get := func(url, auth string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error(), nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	if code, body, h := get("https://"+addr+"/healthz", ""); code != 401 || h.Get("WWW-Authenticate") == "" {
		t.Errorf("no credential: %d %q", code, body)
	}
	if code, body, _ := get("https://"+addr+"/healthz", "Bearer wrong"); code != 401 {
		t.Errorf("wrong credential: %d %q", code, body)
	}
	if code, body, _ := get("https://"+addr+"/healthz", "Bearer admin-secret"); code != 200 || body != "ok\n" {
		t.Errorf("with the credential: %d %q", code, body)
	}
	if code, body, _ := get("http://"+addr+"/healthz", "Bearer admin-secret"); code == 200 {
		t.Errorf("plain HTTP to the TLS admin listener answered: %d %q", code, body)
	}
	ts.stop(t)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ServeAdmin after Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeAdmin still running after Shutdown")
	}
}
