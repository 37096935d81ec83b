package testserver

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
)

func TestGenerateTLS(t *testing.T) {
	f, err := GenerateTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pool := func(path string) *x509.CertPool {
		pem, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		p := x509.NewCertPool()
		if !p.AppendCertsFromPEM(pem) {
			t.Fatalf("%s: no certificate", path)
		}
		return p
	}
	leaf := func(cert, key string) *x509.Certificate {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	server := leaf(f.ServerCert, f.ServerKey)
	for _, name := range []string{"localhost", "127.0.0.1", "::1"} {
		if _, err := server.Verify(x509.VerifyOptions{DNSName: name, Roots: pool(f.CA)}); err != nil {
			t.Errorf("server certificate for %s: %v", name, err)
		}
	}
	client := leaf(f.ClientCert, f.ClientKey)
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if _, err := client.Verify(x509.VerifyOptions{Roots: pool(f.ClientCA), KeyUsages: usage}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if _, err := client.Verify(x509.VerifyOptions{Roots: pool(f.CA), KeyUsages: usage}); err == nil {
		t.Error("the client certificate verifies against the server's CA; want only the client CA")
	}
}
