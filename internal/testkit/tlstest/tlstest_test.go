package tlstest

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A client that trusts the pool reaches a server with the certificate on 127.0.0.1; one
// that trusts another certificate's pool does not.
func TestSelfSignedIsTrustedByItsPoolOnly(t *testing.T) {
	certPEM, keyPEM, pool := SelfSigned(t)
	_, _, otherPool := SelfSigned(t)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	defer srv.Close()
	get := func(roots *x509.CertPool) error {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
		resp, err := c.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(pool); err != nil {
		t.Errorf("with its own pool: %v", err)
	}
	if err := get(otherPool); err == nil {
		t.Error("a pool of another certificate trusted this one")
	}
}

// The files WriteSelfSigned writes are a key pair the pool it returns trusts, and no
// temporary file is left beside them.
func TestWriteSelfSigned(t *testing.T) {
	dir := t.TempDir()
	pool := WriteSelfSigned(t, dir, "srv")
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "srv.crt"), filepath.Join(dir, "srv.key"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
		t.Errorf("the pool does not trust the written certificate: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"srv.crt", "srv.key"}) {
		t.Errorf("files written: %v, want srv.crt and srv.key", names)
	}
}
