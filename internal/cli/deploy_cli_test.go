package cli

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/deploy"
	"github.com/ticketing/ticketing/internal/deploy/deploytest"
	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/wire"
)

// The `ticketing deploy` tests of issue 30, defect 6: each runs the real binary's `deploy` and,
// where the defect was a cluster that did not start, starts the nodes from what it printed.

// deployPlan runs `ticketing deploy ARGS --format json` and decodes the plan.
func deployPlan(t *testing.T, args ...string) (*deploy.Plan, cliResult) {
	t.Helper()
	r := cli(t, nil, append(append([]string{"deploy"}, args...), "--format", "json")...)
	if r.code != 0 {
		t.Fatalf("ticketing deploy %v: exit %d\n%s", args, r.code, r.stderr)
	}
	var p deploy.Plan
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
		t.Fatalf("ticketing deploy %v: %v\n%s", args, err, r.stdout)
	}
	return &p, r
}

// writePlanFiles creates the plan's files (token, cluster secret) as the operator would.
func deployWriteFiles(t *testing.T, p *deploy.Plan) {
	t.Helper()
	for _, f := range p.Files {
		if err := os.MkdirAll(filepath.Dir(f.Path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f.Path, []byte(f.Content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
}

// startFromCommand starts a node from its generated command line, unchanged, through a shell
// (exec: the shell's PID is the server's, stopped by it at the end of the test).
func deployStart(t *testing.T, n deploy.Node) *deploytest.Node {
	t.Helper()
	return deploytest.StartNode(t, exec.Command("bash", "-c", "exec "+n.Command))
}

func deploySetting(n deploy.Node, name string) string {
	for _, s := range n.Settings {
		if s[0] == name {
			return s[1]
		}
	}
	return ""
}

// deployWaitReady waits (bounded) until every node's /readyz answers 200: a leader is elected and
// every node hears from it.
func deployWaitReady(t *testing.T, nodes []*deploytest.Node) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range nodes {
		for {
			resp, err := http.Get("http://" + n.Admin + "/readyz")
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not ready within 30s (last: %v); its log:\n%s", n.Admin, err, n.Log())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// takeLockOnLeader takes a lock on whichever node leads (the others answer NOT_LEADER).
func deployLockOnLeader(t *testing.T, nodes []*deploytest.Node, token, key string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, n := range nodes {
			c, st, err := deploytest.Dial(n.Addr, token)
			if err != nil || st != wire.StatusOK {
				continue
			}
			tok := c.Acquire(t, key, 0)
			c.NC.Close()
			if tok == 0 {
				t.Fatal("no token")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no node granted a lock within 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func deployAdmins(nodes []*deploytest.Node) string {
	var a []string
	for _, n := range nodes {
		a = append(a, n.Admin)
	}
	return strings.Join(a, ",")
}

// TestDeployLoopbackCluster: a cluster on one machine, as printed, starts and serves: on three
// loopback addresses (each node its own data directory and admin address; the token and the
// cluster secret kept from files), then grown by a fourth node joining with --add-node; and on
// one address with three ports (each node also its own Raft port).
func TestDeployLoopbackCluster(t *testing.T) {
	bin, err := testserver.Binary()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("three addresses, then one more node", func(t *testing.T) {
		hosts := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"}
		// Three free ports in a row on each address: client, admin, Raft.
		port, err := testserver.FreePortRun(hosts, 3)
		if err != nil {
			t.Fatal(err)
		}
		raftPort := port + 2
		dir, conf := t.TempDir(), t.TempDir()
		// The existing token and cluster secret, kept.
		secrets := t.TempDir()
		tokenFile, secretFile := filepath.Join(secrets, "token"), filepath.Join(secrets, "secret")
		os.WriteFile(tokenFile, []byte("existing-token-0123456789\n"), 0o600)
		os.WriteFile(secretFile, []byte("\nexisting-secret-0123456789\n"), 0o600)
		common := []string{"--port", strconv.Itoa(port), "--raft-port", strconv.Itoa(raftPort), "--data-dir", dir,
			"--config-dir", conf, "--binary", bin, "--token-file", tokenFile, "--cluster-secret-file", secretFile}
		p, _ := deployPlan(t, append([]string{"--nodes", "3", "--hosts", strings.Join(hosts[:3], ",")}, common...)...)
		if p.Token != "existing-token-0123456789" || p.Secret != "existing-secret-0123456789" {
			t.Fatalf("the token and secret from the files are not kept: %q %q", p.Token, p.Secret)
		}
		dirs, admins := map[string]bool{}, map[string]bool{}
		for _, n := range p.Nodes {
			dirs[deploySetting(n, "data-dir")], admins[deploySetting(n, "admin-addr")] = true, true
			if want := filepath.Join(dir, n.Name); deploySetting(n, "data-dir") != want {
				t.Errorf("%s: data dir %s, want %s", n.Name, deploySetting(n, "data-dir"), want)
			}
			if n.Unit != "ticketing-"+n.Name+".service" || !strings.Contains(n.Systemd, "ReadWritePaths="+filepath.Join(dir, n.Name)+"\n") {
				t.Errorf("%s: unit %s\n%s", n.Name, n.Unit, n.Systemd)
			}
			if !strings.Contains(n.Container, "-v ticketing-data-"+n.Name+":") {
				t.Errorf("%s: the container's volume is shared:\n%s", n.Name, n.Container)
			}
		}
		if len(dirs) != 3 || len(admins) != 3 {
			t.Fatalf("data dirs %v, admin addresses %v: want one each per node", dirs, admins)
		}
		deployWriteFiles(t, p)
		var nodes []*deploytest.Node
		for _, n := range p.Nodes {
			nodes = append(nodes, deployStart(t, n))
		}
		deployWaitReady(t, nodes)
		deployLockOnLeader(t, nodes, p.Token, "deploy:loopback")

		// One more node: its outputs, joining, and the command that adds it.
		r := cli(t, nil, append([]string{"deploy", "--hosts", strings.Join(hosts[:3], ","), "--add-node", hosts[3], "--cluster-secret-file", filepath.Join(conf, "nope")}, common[:len(common)-2]...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "cluster-secret-file") {
			t.Errorf("an unreadable secret file: exit %d %s", r.code, r.stderr)
		}
		r = cli(t, nil, "deploy", "--hosts", strings.Join(hosts[:3], ","), "--add-node", hosts[3])
		if r.code != 2 || !strings.Contains(r.stderr, "secret") {
			t.Errorf("--add-node without the cluster's secret: exit %d %s", r.code, r.stderr)
		}
		add, _ := deployPlan(t, append([]string{"--hosts", strings.Join(hosts[:3], ","), "--add-node", hosts[3]}, common...)...)
		if len(add.Nodes) != 1 || add.Nodes[0].Name != "n4" || deploySetting(add.Nodes[0], "join") != "true" || deploySetting(add.Nodes[0], "data-dir") != filepath.Join(dir, "n4") ||
			add.Token != p.Token || add.Secret != p.Secret || add.ClusterAdd != fmt.Sprintf("ticketing cluster add n4 127.0.0.4:%d", raftPort) {
			t.Fatalf("--add-node plan: %+v", add)
		}
		if !strings.Contains(strings.Join(add.Notes, "\n"), "4 voters") {
			t.Errorf("no word on an even number of voters: %q", add.Notes)
		}
		text := cli(t, nil, append([]string{"deploy", "--hosts", strings.Join(hosts[:3], ","), "--add-node", hosts[3]}, common...)...)
		if !strings.Contains(text.stdout, "\n"+add.ClusterAdd+"\n") || strings.Count(text.stdout, "### n4: ") != 5 || strings.Contains(text.stdout, "### n1") {
			t.Errorf("--add-node text output:\n%s", text.stdout)
		}
		n4 := deployStart(t, add.Nodes[0])
		args := append(strings.Fields(add.ClusterAdd)[1:], "--admin-addr", deployAdmins(nodes))
		if r := cli(t, nil, args...); r.code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", add.ClusterAdd, r.code, r.stdout, r.stderr)
		}
		deployWaitReady(t, []*deploytest.Node{n4})
		st := cli(t, nil, "cluster", "status", "--admin-addr", deployAdmins(append(nodes, n4)), "--json")
		if st.code != 0 || strings.Count(st.stdout, `"n4"`) == 0 {
			t.Fatalf("cluster status after the add: exit %d\n%s%s", st.code, st.stdout, st.stderr)
		}
	})
	t.Run("one address, three ports", func(t *testing.T) {
		// Ten free ports in a row: clients at p, p+2, p+4 (admin the next each), Raft from p+6.
		port, err := testserver.FreePortRun([]string{"127.0.0.1"}, 10)
		if err != nil {
			t.Fatal(err)
		}
		var hosts []string
		for i := 0; i < 3; i++ {
			hosts = append(hosts, fmt.Sprintf("127.0.0.1:%d", port+2*i))
		}
		dir := t.TempDir()
		p, _ := deployPlan(t, "--nodes", "3", "--hosts", strings.Join(hosts, ","), "--raft-port", strconv.Itoa(port+6),
			"--data-dir", dir, "--config-dir", t.TempDir(), "--binary", bin)
		wantPeers := fmt.Sprintf("n1=127.0.0.1:%d,n2=127.0.0.1:%d,n3=127.0.0.1:%d", port+6, port+7, port+8)
		for i, n := range p.Nodes {
			if deploySetting(n, "addr") != hosts[i] || deploySetting(n, "admin-addr") != fmt.Sprintf("127.0.0.1:%d", port+2*i+1) ||
				deploySetting(n, "peers") != wantPeers || deploySetting(n, "data-dir") != filepath.Join(dir, n.Name) {
				t.Fatalf("%s: %v", n.Name, n.Settings)
			}
		}
		deployWriteFiles(t, p)
		var nodes []*deploytest.Node
		for _, n := range p.Nodes {
			nodes = append(nodes, deployStart(t, n))
		}
		deployWaitReady(t, nodes)
		deployLockOnLeader(t, nodes, p.Token, "deploy:ports")
		// Ports that would collide are refused, naming them.
		r := cli(t, nil, "deploy", "--nodes", "3", "--hosts", "127.0.0.1:7070,127.0.0.1:7071,127.0.0.1:7170")
		if r.code != 2 || !strings.Contains(r.stderr, "127.0.0.1:7071") {
			t.Errorf("client port on another node's admin port: exit %d %s", r.code, r.stderr)
		}
	})
}

// TestDeployHostWithPort: a host given with a port keeps it as the client port (the admin
// listener the next one), IPv6 addresses are bracketed once, and bad ports are refused.
func TestDeployHostWithPort(t *testing.T) {
	r := cli(t, nil, "deploy", "--hosts", "10.0.0.5:9999")
	if r.code != 0 || strings.Contains(r.stdout, "[10.0.0.5") || !strings.Contains(r.stdout, "TICKETING_ADDR=10.0.0.5:9999\n") ||
		!strings.Contains(r.stdout, "TICKETING_ADMIN_ADDR=127.0.0.1:10000\n") || !strings.Contains(r.stdout, "-p 10.0.0.5:9999:9999") {
		t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	p, _ := deployPlan(t, "--nodes", "3", "--hosts", "[fd00::1]:7000,fd00::2,[fd00::3]")
	want := "n1=[fd00::1]:7080,n2=[fd00::2]:7080,n3=[fd00::3]:7080"
	for i, n := range p.Nodes {
		if deploySetting(n, "peers") != want || deploySetting(n, "addr") != net.JoinHostPort(fmt.Sprintf("fd00::%d", i+1), strconv.Itoa([]int{7000, 7070, 7070}[i])) {
			t.Errorf("%s: %v", n.Name, n.Settings)
		}
		if strings.Contains(n.Env+n.Container+n.Compose+n.Systemd, "[[") || strings.Contains(n.Env, "]:7070]") {
			t.Errorf("%s: doubled brackets:\n%s", n.Name, n.Env)
		}
	}
	if !strings.Contains(deployNotes(p), "TICKETING_ADDR=[fd00::1]:7000,[fd00::2]:7070,[fd00::3]:7070") {
		t.Errorf("notes: %q", p.Notes)
	}
	for _, bad := range []string{"10.0.0.5:99999", "10.0.0.5:x", "[10.0.0.5]:70", "fd00::zz"} {
		if r := cli(t, nil, "deploy", "--hosts", bad); r.code != 2 {
			t.Errorf("--hosts %s: exit %d %s", bad, r.code, r.stdout)
		}
	}
}

func deployNotes(p *deploy.Plan) string { return strings.Join(p.Notes, "\n") }

// TestDeployOnlyJSON: --only with --format json gives that output of each node, nothing else.
func TestDeployOnlyJSON(t *testing.T) {
	full, _ := deployPlan(t, "--nodes", "3", "--hosts", "10.0.0.1,10.0.0.2,10.0.0.3")
	r := cli(t, nil, "deploy", "--nodes", "3", "--hosts", "10.0.0.1,10.0.0.2,10.0.0.3", "--only", "systemd", "--format", "json")
	var v struct {
		Only  string                       `json:"only"`
		Nodes []map[string]json.RawMessage `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != 0 || v.Only != "systemd" || len(v.Nodes) != 3 {
		t.Fatalf("exit %d %v\n%s", r.code, err, r.stdout)
	}
	for i, n := range v.Nodes {
		var out string
		json.Unmarshal(n["output"], &out)
		if out != full.Nodes[i].Systemd {
			t.Errorf("node %d: output is not its systemd unit:\n%s", i+1, out)
		}
		for _, other := range []string{"env", "command", "container", "compose", "settings"} {
			if _, ok := n[other]; ok {
				t.Errorf("node %d has %s", i+1, other)
			}
		}
	}
	if strings.Contains(r.stdout, "TICKETING_TOKEN_FILE=/etc") && !strings.Contains(r.stdout, "Environment=TICKETING_TOKEN_FILE") || strings.Contains(r.stdout, `"files"`) {
		t.Errorf("more than the systemd units:\n%s", r.stdout)
	}
}

// TestDeployClusterTLSCoversRaft: a cluster with a client certificate but no Raft TLS says that
// node-to-node traffic stays plain, in every output format; with --raft-tls-* it is encrypted:
// the printed cluster starts and its Raft ports speak TLS (mutual, signed by the CA).
func TestDeployClusterTLSCoversRaft(t *testing.T) {
	tlsArgs := []string{"--nodes", "3", "--hosts", "10.0.0.1,10.0.0.2,10.0.0.3", "--tls-cert", "/etc/ticketing/tls.crt", "--tls-key", "/etc/ticketing/tls.key"}
	const warn = "node-to-node (Raft) traffic is NOT encrypted"
	for _, form := range [][]string{nil, {"--only", "env"}, {"--format", "json"}, {"--only", "compose", "--format", "json"}} {
		r := cli(t, nil, append(append([]string{"deploy"}, tlsArgs...), form...)...)
		inOutput := strings.Contains(r.stdout, warn)
		if form != nil && form[0] == "--only" && len(form) == 2 {
			inOutput = true // the output alone (it goes to a file): the warning is on stderr
		}
		if r.code != 0 || !inOutput || !strings.Contains(r.stderr, warn) {
			t.Errorf("%v: exit %d, the warning is missing\nstdout:\n%s\nstderr:\n%s", form, r.code, r.stdout, r.stderr)
		}
	}
	if p, _ := deployPlan(t, tlsArgs...); len(p.Warnings) != 1 || !strings.Contains(p.Notes[0], warn) {
		t.Errorf("JSON warnings %q, notes %q", p.Warnings, p.Notes)
	}
	if r := cli(t, nil, "deploy", "--raft-tls-cert", "/a", "--raft-tls-key", "/b", "--raft-tls-ca", "/c"); r.code != 2 {
		t.Errorf("raft TLS for a single node: exit %d", r.code)
	}
	if r := cli(t, nil, append([]string{"deploy", "--raft-tls-cert", "/a"}, tlsArgs...)...); r.code != 2 || !strings.Contains(r.stderr, "together") {
		t.Errorf("raft TLS without key and CA: exit %d %s", r.code, r.stderr)
	}

	// With Raft TLS: started as printed, the nodes elect a leader over TLS.
	bin, err := testserver.Binary()
	if err != nil {
		t.Fatal(err)
	}
	hosts := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	port, err := testserver.FreePortRun(hosts, 3)
	if err != nil {
		t.Fatal(err)
	}
	certs := t.TempDir()
	caFile, certFile, keyFile := deployRaftCerts(t, certs, hosts)
	srv := testserver.DefaultTLS()
	p, r := deployPlan(t, "--nodes", "3", "--hosts", strings.Join(hosts, ","), "--port", strconv.Itoa(port), "--raft-port", strconv.Itoa(port+2),
		"--tls-cert", srv.ServerCert, "--tls-key", srv.ServerKey, "--raft-tls-cert", certFile, "--raft-tls-key", keyFile, "--raft-tls-ca", caFile,
		"--data-dir", t.TempDir(), "--config-dir", t.TempDir(), "--binary", bin)
	if len(p.Warnings) != 0 || strings.Contains(r.stderr, warn) {
		t.Errorf("warned with Raft TLS: %q %s", p.Warnings, r.stderr)
	}
	for _, n := range p.Nodes {
		if !strings.Contains(n.Container, "-e TICKETING_RAFT_TLS_CA="+caFile) || !strings.Contains(n.Container, "-v "+certs+":"+certs+":ro") {
			t.Errorf("%s: the container lacks the Raft TLS settings or their folder:\n%s", n.Name, n.Container)
		}
	}
	deployWriteFiles(t, p)
	var nodes []*deploytest.Node
	for _, n := range p.Nodes {
		nodes = append(nodes, deployStart(t, n))
	}
	deployWaitReady(t, nodes)
	// The Raft port speaks TLS and wants the cluster's certificate.
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(caPEM)
	raftAddr := net.JoinHostPort(hosts[1], strconv.Itoa(port+2))
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", raftAddr, &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: hosts[1]})
	if err != nil {
		t.Fatalf("TLS to the Raft port %s: %v", raftAddr, err)
	}
	conn.Close()
}

// raftCerts writes a CA and one node certificate (server and client use, for every host) signed
// by it: what --raft-tls-ca, --raft-tls-cert and --raft-tls-key name.
func deployRaftCerts(t *testing.T, dir string, hosts []string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "raft test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	nodeKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "raft node"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	for _, h := range hosts {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(h))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &nodeKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(nodeKey)
	ca, cert, key = filepath.Join(dir, "raft-ca.pem"), filepath.Join(dir, "raft.pem"), filepath.Join(dir, "raft.key")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600)
	os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return ca, cert, key
}

// TestDeploySystemdDataDir: a data directory outside /var/lib (which StateDirectory= cannot
// make) is created by the unit's ExecStartPre, owned by the service's user; that command, run
// here for the current user, makes it. Under /var/lib StateDirectory= stays.
func TestDeploySystemdDataDir(t *testing.T) {
	r := cli(t, nil, "deploy", "--data-dir", "/srv/ticketing/data", "--only", "systemd")
	const pre = "ExecStartPre=+/usr/bin/install -d -o ticketing -g ticketing -m 0700 /srv/ticketing/data\n"
	if r.code != 0 || !strings.Contains(r.stdout, pre) || !strings.Contains(r.stdout, "ReadWritePaths=/srv/ticketing/data\n") || strings.Contains(r.stdout, "StateDirectory") {
		t.Fatalf("exit %d\n%s", r.code, r.stdout)
	}
	if analyze, err := exec.LookPath("systemd-analyze"); err == nil {
		f := filepath.Join(t.TempDir(), "ticketing.service")
		os.WriteFile(f, []byte(strings.Replace(r.stdout, "/usr/local/bin/ticketing", "/bin/true", 1)), 0o644)
		if out, err := exec.Command(analyze, "verify", f).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}
	// The command itself, for this user, on a directory two levels down that does not exist.
	target := filepath.Join(t.TempDir(), "srv", "data")
	line := strings.TrimPrefix(strings.TrimSuffix(pre, "\n"), "ExecStartPre=+")
	line = strings.NewReplacer("-o ticketing", "-o "+strconv.Itoa(os.Getuid()), "-g ticketing", "-g "+strconv.Itoa(os.Getgid()), "/srv/ticketing/data", target).Replace(line)
	if out, err := exec.Command("sh", "-c", line).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v %s", line, err, out)
	}
	if fi, err := os.Stat(target); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v %v", target, fi, err)
	}
	if r := cli(t, nil, "deploy", "--only", "systemd"); !strings.Contains(r.stdout, "StateDirectory=ticketing\n") || strings.Contains(r.stdout, "ExecStartPre") {
		t.Errorf("default data dir:\n%s", r.stdout)
	}
}

// TestDeployPortZero: port 0 is refused by `ticketing deploy` and by the generator on the admin
// listener (POST /api/deploy, the page's); a port left out there is the default.
func TestDeployPortZero(t *testing.T) {
	for _, flagName := range []string{"--port", "--raft-port"} {
		r := cli(t, nil, "deploy", "--nodes", "3", "--hosts", "10.0.0.1,10.0.0.2,10.0.0.3", flagName, "0")
		if r.code != 2 || !strings.Contains(r.stderr, flagName+" 0") || strings.Contains(r.stdout, "7070") {
			t.Errorf("%s 0: exit %d\n%s%s", flagName, r.code, r.stdout, r.stderr)
		}
		checkOneLine(t, []string{"deploy", flagName, "0"}, r)
	}
	bin, err := testserver.Binary()
	if err != nil {
		t.Fatal(err)
	}
	srv := deploytest.StartNode(t, exec.Command(bin, "server", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir", t.TempDir()))
	post := func(body string) (int, string) {
		resp, err := http.Post("http://"+srv.Admin+"/api/deploy", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, body := range []string{`{"nodes":1,"port":0}`, `{"nodes":3,"hosts":["a","b","c"],"raft_port":0}`} {
		if code, msg := post(body); code != 400 || !strings.Contains(msg, " 0: ") {
			t.Errorf("%s: %d %s", body, code, msg)
		}
	}
	if code, msg := post(`{"nodes":1}`); code != 200 || !strings.Contains(msg, "TICKETING_ADDR=127.0.0.1:7070") {
		t.Errorf("port left out: %d %s", code, msg)
	}
	if code, msg := post(`{"nodes":1,"hosts":["127.0.0.1:9000"]}`); code != 200 || !strings.Contains(msg, "TICKETING_ADDR=127.0.0.1:9000") {
		t.Errorf("host:port: %d %s", code, msg)
	}
}
