package webconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/exporter-toolkit/web"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/tlstest"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	// Replaced by a rename, as editors and Kubernetes do: a reader sees the old file or
	// the new one.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tlsAuth is a configuration with TLS from relative file names and one user.
func tlsAuth(user, hash string) string {
	return fmt.Sprintf("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\nbasic_auth_users:\n  %s: %s\n", user, hash)
}

// A file that would serve without TLS and authentication, or that the toolkit cannot
// load, is refused at start-up with one line naming it.
func TestLoadRefuses(t *testing.T) {
	dir := t.TempDir()
	tlstest.WriteSelfSigned(t, dir, "tls")
	fifo := filepath.Join(dir, "fifo.yml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, content, want string }{
		{"empty", "", "is empty"},
		{"comments only", "# TLS comes later\n\n", "is empty"},
		{"document markers", "---\n...\n", "is empty"},
		{"empty mapping", "{}\n", "configures neither TLS nor basic auth"},
		{"null", "null\n", "configures neither TLS nor basic auth"},
		{"empty users", "basic_auth_users: {}\n", "configures neither TLS nor basic auth"},
		{"invalid yaml", "tls_server_config: [unclosed\n", "yaml"},
		{"unknown field", "basic_auth_user:\n  a: b\n", "not found"},
		{"missing key file", "tls_server_config:\n  cert_file: tls.crt\n  key_file: missing.key\n", "key_file"},
		{"not bcrypt", "basic_auth_users:\n  alice: plain-text\n", "bcrypt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := filepath.Join(dir, "web.yml")
			write(t, file, c.content)
			_, err := Load(file)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), file) ||
				strings.Contains(err.Error(), "\n") {
				t.Fatalf("Load: %v; want one line naming %s and %q", err, file, c.want)
			}
		})
	}
	for _, p := range []string{dir, fifo, filepath.Join(dir, "missing.yml")} {
		if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("Load(%s): %v", p, err)
		}
	}
}

// server serves ok under the toolkit, reading s.Path(), over TLS when tlsOn.
func server(t *testing.T, s *Served) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	path := s.Path()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }),
		ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() {
		done <- web.Serve(l, srv, &web.FlagConfig{WebConfigFile: &path}, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return l.Addr().String()
}

// status is the answer to a GET as user/pw (no credentials when user is "").
func status(t *testing.T, client *http.Client, url, user, pw string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if user != "" {
		req.SetBasicAuth(user, pw)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// The toolkit serving the in-memory copy over real TLS: every bad change of the file is
// refused with the file named and the reason, and the previous configuration keeps
// serving, authentication and all; a valid change (a new password, a new certificate)
// is taken; a change seen once is not reported again.
func TestReloadKeepsTheLastValidConfiguration(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "web.yml")
	pool := tlstest.WriteSelfSigned(t, dir, "tls")
	write(t, file, tlsAuth("alice", tlstest.BcryptHash(t, "old-password")))
	s, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if b, err := os.ReadFile(s.Path()); err != nil || strings.Contains(string(b), "cert_file") || !strings.Contains(string(b), "BEGIN CERTIFICATE") {
		t.Fatalf("the in-memory copy does not hold the certificate inline: %v\n%s", err, b)
	}
	url := "https://" + server(t, s) + "/"
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	stillProtected := func(when string) {
		t.Helper()
		if got := status(t, client, url, "", ""); got != http.StatusUnauthorized {
			t.Errorf("%s: without credentials %d, want 401", when, got)
		}
		if got := status(t, client, url, "alice", "old-password"); got != http.StatusOK {
			t.Errorf("%s: with the password %d, want 200", when, got)
		}
	}
	stillProtected("at start")

	weaker := fmt.Sprintf("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\nbasic_auth_users:\n  bob: %s\n", tlstest.BcryptHash(t, "x"))
	for _, c := range []struct {
		name   string
		change func()
		want   string
	}{
		{"emptied", func() { write(t, file, "") }, "is empty"},
		{"a comment", func() { write(t, file, "# later\n") }, "is empty"},
		{"{}", func() { write(t, file, "{}\n") }, "configures neither TLS nor basic auth"},
		{"invalid yaml", func() { write(t, file, "basic_auth_users: [\n") }, "yaml"},
		{"deleted", func() {
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
		}, "no such file"},
		// As root, file modes do not stop a read; a directory in the file's place does.
		{"unreadable", func() {
			if err := os.Mkdir(file, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "is a directory"},
		{"basic auth removed", func() {
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
			write(t, file, "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
		}, "removes basic authentication (basic_auth_users); serving without it takes a restart"},
		{"TLS removed", func() { write(t, file, "basic_auth_users:\n  alice: "+tlstest.BcryptHash(t, "old-password")+"\n") }, "removes TLS"},
		{"key deleted", func() {
			write(t, file, weaker)
			if err := os.Rename(filepath.Join(dir, "tls.key"), filepath.Join(dir, "tls.key.gone")); err != nil {
				t.Fatal(err)
			}
		}, "tls_server_config.key_file"},
		{"key of another certificate", func() {
			other := t.TempDir()
			tlstest.WriteSelfSigned(t, other, "other")
			b, err := os.ReadFile(filepath.Join(other, "other.key"))
			if err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "tls.key"), string(b))
		}, "X509KeyPair"},
	} {
		c.change()
		r := s.Reload(false)
		t.Logf("%s: %v", c.name, r.Err)
		if !r.Attempted || r.Changed || r.Err == nil || !strings.Contains(r.Err.Error(), c.want) || !strings.Contains(r.Err.Error(), file) {
			t.Errorf("%s: %+v; want a refusal naming the file and %q", c.name, r, c.want)
		}
		stillProtected(c.name)
		if again := s.Reload(false); again.Attempted {
			t.Errorf("%s: reported again at the next poll: %+v", c.name, again)
		}
		if forced := s.Reload(true); forced.Err == nil {
			t.Errorf("%s: a forced reload (SIGHUP) took it: %+v", c.name, forced)
		}
	}

	// The key back, with the file as it was: the configuration in force, unchanged.
	if err := os.Rename(filepath.Join(dir, "tls.key.gone"), filepath.Join(dir, "tls.key")); err != nil {
		t.Fatal(err)
	}
	pool = tlstest.WriteSelfSigned(t, dir, "tls") // a new certificate and key, as a rotation writes them
	write(t, file, tlsAuth("alice", tlstest.BcryptHash(t, "new-password")))
	if r := s.Reload(false); !r.Changed || r.Err != nil {
		t.Fatalf("a valid change: %+v", r)
	}
	client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if got := status(t, client, url, "alice", "new-password"); got != http.StatusOK {
		t.Errorf("the new password: %d, want 200", got)
	}
	if got := status(t, client, url, "alice", "old-password"); got != http.StatusUnauthorized {
		t.Errorf("the old password: %d, want 401", got)
	}
	if r := s.Reload(true); !r.Attempted || r.Changed || r.Err != nil {
		t.Errorf("a forced reload of the file in force: %+v; want attempted, unchanged, no error", r)
	}
	// The files it names can go: the certificate and key in force are in memory.
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if got := status(t, &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}},
		url, "alice", "new-password"); got != http.StatusOK {
		t.Errorf("with the certificate files gone: %d, want 200", got)
	}
}

// Adding basic auth to a TLS-only configuration is taken; turning TLS on without a
// restart is not (the toolkit chose plain HTTP when it started listening).
func TestReloadStrongerAndRestartOnly(t *testing.T) {
	dir := t.TempDir()
	tlstest.WriteSelfSigned(t, dir, "tls")
	file := filepath.Join(dir, "web.yml")
	write(t, file, "basic_auth_users:\n  alice: "+tlstest.BcryptHash(t, "pw")+"\n")
	s, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	write(t, file, tlsAuth("alice", tlstest.BcryptHash(t, "pw")))
	if r := s.Reload(false); r.Err == nil || !strings.Contains(r.Err.Error(), "turns TLS on") {
		t.Errorf("TLS turned on while running: %+v", r)
	}
	write(t, file, "basic_auth_users:\n  alice: "+tlstest.BcryptHash(t, "pw")+"\n  bob: "+tlstest.BcryptHash(t, "pw2")+"\nrate_limit:\n  burst: 5\n  interval: 1s\n")
	r := s.Reload(false)
	if !r.Changed || r.Err != nil || len(r.RestartOnly) != 1 || r.RestartOnly[0] != "rate_limit" {
		t.Errorf("a second user and a rate limit: %+v; want taken, with rate_limit for the next restart", r)
	}
}

// A web configuration mounted from a Kubernetes Secret is a link through ..data, which
// the kubelet swaps to a new folder in one rename when the Secret changes: the swap is
// seen at the next look (the file and its certificates read through the links), taken
// when valid, refused when not, the configuration in force staying.
func TestReloadFollowsASecretsSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, users string) {
		t.Helper()
		v := filepath.Join(dir, name)
		if err := os.Mkdir(v, 0o755); err != nil {
			t.Fatal(err)
		}
		tlstest.WriteSelfSigned(t, v, "tls")
		if err := os.WriteFile(filepath.Join(v, "web.yml"), []byte(fmt.Sprintf("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n%s", users)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", "basic_auth_users:\n  alice: "+tlstest.BcryptHash(t, "pw")+"\n")
	for _, key := range []string{"web.yml", "tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", key), filepath.Join(dir, key)); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Load(filepath.Join(dir, "web.yml"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if r := s.Reload(false); r.Attempted {
		t.Fatalf("nothing changed, yet: %+v", r)
	}
	version("..v2", "basic_auth_users:\n  alice: "+tlstest.BcryptHash(t, "pw2")+"\n")
	if r := s.Reload(false); !r.Changed || r.Err != nil {
		t.Errorf("the Secret's new version (a new password, a new certificate): %+v; want it taken", r)
	}
	version("..v3", "")
	if r := s.Reload(false); r.Changed || r.Err == nil {
		t.Errorf("a version without basic auth: %+v; want it refused", r)
	}
}
