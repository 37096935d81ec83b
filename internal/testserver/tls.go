package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// ClusterHosts are loopback addresses for the nodes of a test cluster, one per node; the server
// certificate of GenerateTLS names them too.
var ClusterHosts = []string{"127.0.0.41", "127.0.0.42", "127.0.0.43"}

// TLSFiles are PEM files made by GenerateTLS for one test run: a server certificate for
// localhost, 127.0.0.1, ::1 and ClusterHosts signed by CA, and a client certificate signed by a
// second CA (ClientCA, for TICKETING_TLS_CLIENT_CA). Private keys exist only in the test's
// temporary directory.
type TLSFiles struct {
	CA         string // PEM: the CA that signed ServerCert (what clients trust)
	ServerCert string
	ServerKey  string
	ClientCA   string // PEM: the CA that signed ClientCert (what the server trusts for mutual TLS)
	ClientCert string
	ClientKey  string
	// OtherClientCert and OtherClientKey are a client certificate signed by CA, not by
	// ClientCA: a server requiring ClientCA must refuse it.
	OtherClientCert string
	OtherClientKey  string
}

// GenerateTLS writes fresh test certificates and keys into dir (ECDSA P-256, valid for a day).
func GenerateTLS(dir string) (*TLSFiles, error) {
	f := &TLSFiles{
		CA:              filepath.Join(dir, "ca.pem"),
		ServerCert:      filepath.Join(dir, "server.pem"),
		ServerKey:       filepath.Join(dir, "server.key"),
		ClientCA:        filepath.Join(dir, "client-ca.pem"),
		ClientCert:      filepath.Join(dir, "client.pem"),
		ClientKey:       filepath.Join(dir, "client.key"),
		OtherClientCert: filepath.Join(dir, "other-client.pem"),
		OtherClientKey:  filepath.Join(dir, "other-client.key"),
	}
	ca, caKey, err := newCert("ticketing test CA", nil, nil, true, nil)
	if err != nil {
		return nil, err
	}
	clientCA, clientCAKey, err := newCert("ticketing test client CA", nil, nil, true, nil)
	if err != nil {
		return nil, err
	}
	server, serverKey, err := newCert("localhost", ca, caKey, false, func(t *x509.Certificate) {
		t.DNSNames = []string{"localhost"}
		t.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
		for _, h := range ClusterHosts {
			t.IPAddresses = append(t.IPAddresses, net.ParseIP(h))
		}
		t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
	if err != nil {
		return nil, err
	}
	clientUsage := func(t *x509.Certificate) { t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} }
	client, clientKey, err := newCert("ticketing test client", clientCA, clientCAKey, false, clientUsage)
	if err != nil {
		return nil, err
	}
	other, otherKey, err := newCert("ticketing test client (other CA)", ca, caKey, false, clientUsage)
	if err != nil {
		return nil, err
	}
	for _, w := range []struct {
		path  string
		block *pem.Block
	}{
		{f.CA, certBlock(ca)}, {f.ClientCA, certBlock(clientCA)},
		{f.ServerCert, certBlock(server)}, {f.ServerKey, keyBlock(serverKey)},
		{f.ClientCert, certBlock(client)}, {f.ClientKey, keyBlock(clientKey)},
		{f.OtherClientCert, certBlock(other)}, {f.OtherClientKey, keyBlock(otherKey)},
	} {
		if w.block == nil {
			return nil, errors.New("testserver: cannot encode a test key")
		}
		if err := os.WriteFile(w.path, pem.EncodeToMemory(w.block), 0o600); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func newCert(cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, isCA bool, edit func(*x509.Certificate)) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  isCA,
	}
	if isCA {
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	if edit != nil {
		edit(tmpl)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func certBlock(c *x509.Certificate) *pem.Block {
	return &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}
}

func keyBlock(k *ecdsa.PrivateKey) *pem.Block {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil
	}
	return &pem.Block{Type: "PRIVATE KEY", Bytes: der}
}
