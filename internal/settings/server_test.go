package settings

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/wire"
)

// These tests run the server binary (cmd/ticketing) as its own process: its settings as Parse
// reads them, SIGHUP (Reload), its limits.

// rawHandshake runs a client handshake on nc (token "" = none) and returns WELCOME's status
// (or CHALLENGE's when that refuses), the state id, or an error.
func rawHandshake(nc net.Conn, token string) (wire.Status, error) {
	var sid [wire.SessionIDSize]byte
	rand.Read(sid[:])
	h := wire.Hello{Version: wire.Version, SessionID: sid}
	rand.Read(h.Nonce[:])
	if _, err := nc.Write(wire.AppendHello(nil, &h)); err != nil {
		return 0, err
	}
	head := make([]byte, 4)
	if _, err := io.ReadFull(nc, head); err != nil {
		return 0, err
	}
	n, err := wire.ChallengeLen(head)
	if err != nil {
		return 0, err
	}
	b := append(head, make([]byte, n-4)...)
	if _, err := io.ReadFull(nc, b[4:]); err != nil {
		return 0, err
	}
	var ch wire.Challenge
	if err := wire.DecodeChallenge(b, &ch); err != nil || ch.Status != wire.StatusOK {
		return ch.Status, err
	}
	var a wire.Auth
	if token != "" {
		a.Proof = wire.ClientProof([]byte(token), &sid, &h.Nonce, &ch.Nonce)
	}
	if _, err := nc.Write(wire.AppendAuth(nil, &a)); err != nil {
		return 0, err
	}
	wb := make([]byte, wire.WelcomeSize)
	if _, err := io.ReadFull(nc, wb); err != nil {
		return 0, err
	}
	var w wire.Welcome
	err = wire.DecodeWelcome(wb, &w)
	return w.Status, err
}

func dialHandshake(t *testing.T, addr, token string) wire.Status {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	st, err := rawHandshake(nc, token)
	if err != nil {
		return 255
	}
	return st
}

// 10,000 idle connections that never send HELLO do not keep an authenticated client out: it
// completes its handshake within a second.
func TestPreHandshakeFlood(t *testing.T) {
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	if lim.Cur < 12000 {
		lim.Cur = min(max(lim.Max, 12000), 1<<20)
		if lim.Max < lim.Cur {
			lim.Max = lim.Cur
		}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatalf("raising the file limit for 10,000 connections: %v", err)
		}
	}
	srv := testserver.Start(t, testserver.Config{Token: "flood-token"})
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for i := 0; i < 10000; i++ {
		c, err := net.DialTimeout("tcp", srv.Addr, 2*time.Second)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		idle = append(idle, c)
	}
	for i := 0; i < 5; i++ {
		start := time.Now()
		if st := dialHandshake(t, srv.Addr, "flood-token"); st != wire.StatusOK {
			t.Fatalf("handshake %d under the flood: %v", i, st)
		}
		if el := time.Since(start); el > time.Second {
			t.Fatalf("handshake %d took %v under the flood", i, el)
		}
	}
}

// SIGHUP reloads the token file — during a rotation window both tokens are accepted, then only
// the new one — and the TLS certificate, served to the next connection.
func TestSIGHUPRotatesTokenAndCertificate(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte("old-token\n"), 0o600)
	ca, caKey := newCA(t)
	certA := writeLeaf(t, dir, "a", ca, caKey)
	cert, key := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key")
	copyFile(t, certA+".pem", cert)
	copyFile(t, certA+".key", key)
	srv := testserver.Start(t, testserver.Config{Env: []string{"TICKETING_TOKEN_FILE=" + tokenFile,
		"TICKETING_TLS_CERT=" + cert, "TICKETING_TLS_KEY=" + key}})
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	check := func(token string) (wire.Status, []byte) {
		nc, err := tls.Dial("tcp", srv.Addr, &tls.Config{RootCAs: pool, ServerName: "localhost"})
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		st, _ := rawHandshake(nc, token)
		return st, nc.ConnectionState().PeerCertificates[0].Raw
	}
	hup := func() {
		syscall.Kill(srv.PID(), syscall.SIGHUP)
		time.Sleep(300 * time.Millisecond)
	}
	if st, _ := check("old-token"); st != wire.StatusOK {
		t.Fatalf("old token before rotation: %v", st)
	}
	os.WriteFile(tokenFile, []byte("new-token\nold-token\n"), 0o600)
	hup()
	for _, tok := range []string{"new-token", "old-token"} {
		if st, _ := check(tok); st != wire.StatusOK {
			t.Fatalf("%s during the rotation window: %v", tok, st)
		}
	}
	os.WriteFile(tokenFile, []byte("new-token\n"), 0o600)
	hup()
	if st, _ := check("old-token"); st != wire.StatusAuthFailed {
		t.Fatalf("old token after the window: %v", st)
	}
	_, before := check("new-token")
	certB := writeLeaf(t, dir, "b", ca, caKey)
	copyFile(t, certB+".pem", cert)
	copyFile(t, certB+".key", key)
	hup()
	st, after := check("new-token")
	if st != wire.StatusOK || string(after) == string(before) {
		t.Fatalf("certificate not swapped by SIGHUP (status %v)", st)
	}
	if !strings.Contains(srv.Log(), "SIGHUP: TLS certificate reloaded") {
		t.Fatalf("no reload logged:\n%s", srv.Log())
	}
}

// Tokens never go backwards: not from another working directory (the default data directory is
// absolute), and a data directory that lost its state file is refused until a floor is given.
func TestTokensNeverGoBackwards(t *testing.T) {
	bin, err := testserver.Binary()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	var last uint64
	for i, cwd := range []string{t.TempDir(), t.TempDir()} {
		// No TICKETING_DATA_DIR: the default, which must not depend on the working directory.
		cmd := exec.Command(bin, "server")
		cmd.Dir = cwd
		var env []string
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, "TICKETING_") {
				env = append(env, e)
			}
		}
		cmd.Env = append(env, "XDG_STATE_HOME="+state, "TICKETING_STARTUP_GRACE=0", "TICKETING_ADDR=127.0.0.1:0", "TICKETING_ADMIN_ADDR=off")
		addr := startLogged(t, cmd)
		tok := acquireRaw(t, addr, "k")
		if tok <= last {
			t.Fatalf("start %d (cwd %s): token %d not above %d", i, cwd, tok, last)
		}
		last = tok
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
	dataDir := filepath.Join(state, "ticketing")
	if err := os.Remove(filepath.Join(dataDir, "ticketing.state")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "server")
	cmd.Env = append(os.Environ(), "TICKETING_DATA_DIR="+dataDir, "TICKETING_ADDR=127.0.0.1:0")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "lost store") || !strings.Contains(string(out), "--min-token") {
		t.Fatalf("a data directory without its state file started: %v\n%s", err, out)
	}
	srv := testserver.Start(t, testserver.Config{DataDir: dataDir, Env: []string{"TICKETING_MIN_TOKEN=1000000000", "TICKETING_STARTUP_GRACE=0"}})
	if tok := acquireRaw(t, srv.Addr, "k"); tok <= 1000000000 {
		t.Fatalf("token %d below the floor", tok)
	}
}

// startLogged starts cmd and returns the address from its "listening" log line.
func startLogged(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		buf := make([]byte, 64<<10)
		var all []byte
		for {
			n, err := stderr.Read(buf)
			all = append(all, buf[:n]...)
			for _, line := range strings.Split(string(all), "\n") {
				if strings.Contains(line, "msg=listening") {
					for _, f := range strings.Fields(line) {
						if a, ok := strings.CutPrefix(f, "addr="); ok {
							found <- a
							io.Copy(io.Discard, stderr)
							return
						}
					}
				}
			}
			if err != nil {
				found <- ""
				return
			}
		}
	}()
	select {
	case a := <-found:
		if a == "" {
			t.Fatal("server exited before listening")
		}
		return a
	case <-time.After(15 * time.Second):
		t.Fatal("server did not listen")
	}
	return ""
}

func acquireRaw(t *testing.T, addr, key string) uint64 {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	if st, err := rawHandshake(nc, ""); err != nil || st != wire.StatusOK {
		t.Fatalf("handshake: %v %v", st, err)
	}
	nc.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpAcquire, ID: 1, Key: []byte(key), Lease: 100, WaitMs: 5000}))
	b := make([]byte, wire.HeaderSize)
	if _, err := io.ReadFull(nc, b); err != nil {
		t.Fatal(err)
	}
	var r wire.Response
	wire.DecodeResponse(b, 0, &r)
	if r.Status != wire.StatusOK {
		t.Fatalf("acquire: %v", r.Status)
	}
	return r.Token
}

// Settings errors name the setting; the token is never accepted on the command line.
func TestServerSettingErrors(t *testing.T) {
	bin, err := testserver.Binary()
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		env, args []string
		want      string
	}{
		{env: []string{"TICKETING_MAX_CONNECTIONS=-5"}, want: "TICKETING_MAX_CONNECTIONS"},
		{env: []string{"TICKETING_MAX_INFLIGHT=0"}, want: "TICKETING_MAX_INFLIGHT"},
		{env: []string{"TICKETING_HANDSHAKE_TIMEOUT=-1s"}, want: "TICKETING_HANDSHAKE_TIMEOUT"},
		{args: []string{"--token", "secret"}, want: "TICKETING_TOKEN"},
		{env: []string{"TICKETING_STARTUP_GRACE=soon"}, want: "TICKETING_STARTUP_GRACE"},
		{env: []string{"TICKETING_ADDR=nonsense"}, want: "TICKETING_ADDR"},
		{env: []string{"TICKETING_ADDR=127.0.0.1:99999"}, want: "TICKETING_ADDR"},
		{env: []string{"TICKETING_ADMIN_ADDR=localhost"}, want: "TICKETING_ADMIN_ADDR"},
		// A shell that exports TICKETING_TOKEN for the CLI, starting a node that uses a token
		// file with another token: refused, saying how (issue 30, defect 11).
		{env: []string{"TICKETING_TOKEN=cli-token", "TICKETING_TOKEN_FILE=" + tokenFile}, want: "env -u TICKETING_TOKEN"},
	}
	// The same token in both is no conflict: the server starts.
	srv := testserver.Start(t, testserver.Config{Env: []string{"TICKETING_TOKEN=file-token", "TICKETING_TOKEN_FILE=" + tokenFile}})
	srv.Stop()
	for _, c := range cases {
		cmd := exec.Command(bin, append([]string{"server"}, c.args...)...)
		cmd.Env = append(append(os.Environ(), "TICKETING_DATA_DIR="+t.TempDir(), "TICKETING_ADDR=127.0.0.1:0"), c.env...)
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("%v %v: exit %v, output %q; want exit 2 naming %s", c.env, c.args, err, out, c.want)
		}
		if len(out) > 0 && strings.Count(strings.TrimSpace(string(out)), "\n") > 0 {
			t.Errorf("%v %v: multi-line error %q", c.env, c.args, out)
		}
	}
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key
}

// writeLeaf writes dir/name.pem and dir/name.key: a localhost certificate signed by ca.
func writeLeaf(t *testing.T, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "localhost " + name},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	p := filepath.Join(dir, name)
	os.WriteFile(p+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(p+".key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return p
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Rename(to+".tmp", to)
}

// A boolean setting stands alone on the command line, as every Go boolean flag does: --join,
// not --join true (issue 30, defect 3); --join=false still says no.
func TestBooleanSettingsStandAlone(t *testing.T) {
	env := map[string]string{"TICKETING_CLUSTER_SECRET": "s", "TICKETING_DATA_DIR": t.TempDir()}
	getenv := func(k string) string { return env[k] }
	for _, c := range []struct {
		args []string
		join bool
	}{
		{[]string{"--node-id", "n1", "--peers", "n1=127.0.0.1:27080", "--join"}, true},
		{[]string{"--join", "--node-id", "n1", "--peers", "n1=127.0.0.1:27080"}, true},
		{[]string{"--join=false", "--node-id", "n1", "--peers", "n1=127.0.0.1:27080"}, false},
	} {
		o, err := Parse(c.args, getenv)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if o.Config.Cluster == nil || o.Config.Cluster.Join != c.join {
			t.Errorf("%v: join %v, want %v", c.args, o.Config.Cluster != nil && o.Config.Cluster.Join, c.join)
		}
	}
}
