// Package tlstest makes what tests put in a web configuration: a self-signed certificate
// for 127.0.0.1, its key, a pool that trusts it, and basic-auth password hashes. Only
// tests import it.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// SelfSigned returns a new self-signed server certificate for 127.0.0.1, valid from an
// hour ago for a day, and its private key, both PEM-encoded, and a pool that trusts the
// certificate. Each call makes a new key and serial number, so that a test can tell two
// certificates apart.
func SelfSigned(t testing.TB) (certPEM, keyPEM []byte, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), pool
}

// WriteSelfSigned writes a new SelfSigned certificate and its key into dir as name.crt
// and name.key (mode 0600), and returns a pool that trusts the certificate. Each file is
// replaced by a rename, as a certificate rotation does: a server reloading them sees the
// old file or the new one, never half of one.
func WriteSelfSigned(t testing.TB, dir, name string) *x509.CertPool {
	t.Helper()
	certPEM, keyPEM, pool := SelfSigned(t)
	for path, b := range map[string][]byte{filepath.Join(dir, name+".crt"): certPEM, filepath.Join(dir, name+".key"): keyPEM} {
		if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	return pool
}

// BcryptHash is pw hashed for a web configuration's basic_auth_users, at bcrypt's lowest
// cost (tests check who is let in, not how slowly).
func BcryptHash(t testing.TB, pw string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}
