package collector

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// testCA is a certificate authority of the test's own.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a certificate for cn signed by the CA, valid until notAfter, and its key
// into dir as name.crt and name.key, owned by uid with mode 0600; it returns their paths.
func (ca *testCA) issue(t *testing.T, dir, name, cn string, server bool, notAfter time.Time, uid int) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	crt, k := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writeOwned(t, crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), uid)
	writeOwned(t, k, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), uid)
	return crt, k
}

func writeOwned(t *testing.T, path string, b []byte, uid int) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, -1); err != nil {
		t.Fatal(err)
	}
}

// serverUID is the user the throwaway servers run as when the tests run as root
// (pgtest's: postgres, else nobody), who must own the server's key; the tests' own
// otherwise.
func serverUID(t *testing.T) int {
	t.Helper()
	if os.Geteuid() != 0 {
		return os.Geteuid()
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			t.Fatal(err)
		}
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		t.Fatal(err)
	}
	return uid
}

// A TLS handshake that fails on the exporter's side is pg_liveness_database_down_reason
// tls, not connection: the server's certificate from a CA the exporter does not trust (a
// rotated CA), and the exporter's client certificate refused by the server because it
// expired. (A client certificate from a CA the server does not list is not sent at all;
// a server that then requires one refuses the login, reason auth.) The database serves everyone else all along, so
// PgLivenessDatabaseDown must not page for these (the rules route reason tls to
// PgLivenessDatabaseUnobserved). A real PostgreSQL with TLS on, and real certificates.
func TestDownReasonTLS(t *testing.T) {
	// Not t.TempDir(), whose parent only root may enter: the server's user reads its
	// certificate and key here.
	dir, err := os.MkdirTemp("", "pg-liveness-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ca, other := newTestCA(t, "pg-liveness test CA"), newTestCA(t, "a CA nobody trusts")
	writeOwned(t, filepath.Join(dir, "ca.crt"), ca.pem, serverUID(t))
	writeOwned(t, filepath.Join(dir, "other-ca.crt"), other.pem, os.Geteuid())
	serverCrt, serverKey := ca.issue(t, dir, "server", "127.0.0.1", true, time.Now().Add(24*time.Hour), serverUID(t))
	// TLS 1.2 at most: under 1.3 the server checks a client's certificate after the
	// handshake, and its alert can be lost to the reset of the connection it then closes
	// (the client's startup message arriving after the close), a race a loaded machine
	// loses now and then: the reason is then connection. Under 1.2 the alert comes
	// within the handshake, always.
	srv := pgtest.NewServer(t, pgtest.WithSetting("ssl", "on"), pgtest.WithSetting("ssl_cert_file", serverCrt),
		pgtest.WithSetting("ssl_key_file", serverKey), pgtest.WithSetting("ssl_ca_file", filepath.Join(dir, "ca.crt")),
		pgtest.WithSetting("ssl_max_protocol_version", "TLSv1.2"))
	goodCrt, goodKey := ca.issue(t, dir, "good-client", pgtest.Superuser, false, time.Now().Add(24*time.Hour), os.Geteuid())
	expiredCrt, expiredKey := ca.issue(t, dir, "expired-client", pgtest.Superuser, false, time.Now().Add(-time.Hour), os.Geteuid())
	base := fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=postgres", srv.Port, pgtest.Superuser, srv.Password)

	for _, c := range []struct{ name, tls, reason string }{
		{"verified, with a valid client certificate", "sslmode=verify-full sslrootcert=" + filepath.Join(dir, "ca.crt") +
			" sslcert=" + goodCrt + " sslkey=" + goodKey, ""},
		{"the server's certificate from a CA the exporter does not trust", "sslmode=verify-ca sslrootcert=" + filepath.Join(dir, "other-ca.crt"), "tls"},
		{"an expired client certificate", "sslmode=require sslcert=" + expiredCrt + " sslkey=" + expiredKey, "tls"},
		{"no server at all", "", "connection"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dsn := base + " " + c.tls
			if c.tls == "" {
				dsn = fmt.Sprintf("host=127.0.0.1 port=%d user=u password=p dbname=postgres sslmode=disable", freePort(t))
			}
			cfg := Config{Leases: LeasesConfig{Enabled: true, Table: "leases", MaxSeries: 10}, ScrapeDefaultTimeout: 10 * time.Second}
			e := newExporter(t, cfg, exporterPool(t, dsn, 1, nil), nil, discard())
			mfs := scrapeFamilies(t, e)
			for _, r := range downReasons {
				want := 0.0
				if r == c.reason {
					want = 1
				}
				if got := value(mfs, "pg_liveness_database_down_reason", "reason", r); got != want {
					t.Errorf("pg_liveness_database_down_reason{reason=%q} = %v, want %v", r, got, want)
				}
			}
			if up := value(mfs, "pg_liveness_up"); up != map[bool]float64{true: 1, false: 0}[c.reason == ""] {
				t.Errorf("pg_liveness_up = %v", up)
			}
		})
	}
}

// freePort returns a port of 127.0.0.1 that nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
