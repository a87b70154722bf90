package main

// Files are watched (reload.go): a Kubernetes Secret's atomic update, the swap of its
// ..data link, reloads the DSN and --config.file's password files without a signal; and
// POST /-/reload, with --web.enable-lifecycle, reloads as SIGHUP does.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// secretVolume lays out dir as the kubelet lays out a Secret volume: each key a link to
// ..data/key, ..data a link to a folder of this version's files; files gives the keys'
// contents, group-readable for the pod's fsGroup (0440, root's).
func secretVolume(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	swapSecret(t, dir, files)
	for key := range files {
		if err := os.Symlink(filepath.Join("..data", key), filepath.Join(dir, key)); err != nil {
			t.Fatal(err)
		}
	}
}

// swapSecret writes a new version of the Secret's files into a folder of its own and
// swaps ..data to it in one rename, as the kubelet's AtomicWriter does.
func swapSecret(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	version, err := os.MkdirTemp(dir, "..version_")
	if err != nil {
		t.Fatal(err)
	}
	for key, content := range files {
		p := filepath.Join(version, key)
		if err := os.WriteFile(p, []byte(content), 0o440); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o440); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(version), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// A rotated password reaches the exporter through a Secret's update alone: the DSN file
// (--db.dsn-file) and a --config.file target's password_file, each a link through a
// swapped ..data. A bad new version is refused and the last good one stays in force.
func TestSecretSwapReloadsWithoutSignal(t *testing.T) {
	t.Parallel()
	srv, db := ownServer(t)
	newRole(t, srv, db, "rotating", "new-secret-pw", "SUPERUSER")
	dsnDir, targetsDir := t.TempDir(), t.TempDir()
	secretVolume(t, dsnDir, map[string]string{"dsn": roleDSN(srv, db, "rotating", "old-secret-pw") + "\n"})
	config := fmt.Sprintf(`credentials:
  c: {user: rotating, password_file: %s/password, sslmode: disable}
targets:
  app: {host: 127.0.0.1, port: %d, database: %s, credentials: c}
`, targetsDir, srv.Port, db.Name)
	secretVolume(t, targetsDir, map[string]string{"targets.yml": config, "password": "old-secret-pw\n"})

	p := startExporter(t, nil, "--db.dsn-file="+filepath.Join(dsnDir, "dsn"), "--no-agent",
		"--config.file="+filepath.Join(targetsDir, "targets.yml"))
	p.waitFor(t, `(?m)^pg_liveness_database_down_reason\{reason="auth"\} 1$`, 30*time.Second)
	probe := func() string { return get(t, "http://"+p.addr+"/probe?target=app") }
	if !strings.Contains(probe(), `pg_liveness_database_down_reason{reason="auth"} 1`) {
		t.Fatal("the target logs in with the old password")
	}

	swapSecret(t, dsnDir, map[string]string{"dsn": roleDSN(srv, db, "rotating", "new-secret-pw") + "\n"})
	swapSecret(t, targetsDir, map[string]string{"targets.yml": config, "password": "new-secret-pw\n"})
	waitLog(t, p, "a DSN file changed: reloaded --db.dsn-file")
	waitLog(t, p, "changed: reloaded --config.file")
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	if !testutil.Poll(30*time.Second, func() bool { return strings.Contains(probe(), "\npg_liveness_up 1\n") }) {
		t.Fatalf("the target does not log in with the rotated password:\n%s", probe())
	}

	// A bad version (two DSNs) is refused: the DSN in force stays.
	swapSecret(t, dsnDir, map[string]string{"dsn": "host=a\nhost=b\n"})
	waitLog(t, p, "a DSN file changed: keeping the previous DSN")
	p.waitFor(t, `(?m)^pg_liveness_exporter_config_last_reload_successful 0$`, 10*time.Second)
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 10*time.Second)
	for _, pw := range []string{"old-secret-pw", "new-secret-pw"} {
		if strings.Contains(p.Logs(), pw) {
			t.Errorf("the password %s was logged", pw)
		}
	}
}

// get returns the body of a GET of url, or "" on a transport error.
func get(t *testing.T, url string) string {
	t.Helper()
	_, body := do(t, http.MethodGet, url)
	return body
}

func do(t *testing.T, method, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// POST /-/reload reloads as SIGHUP does, with --web.enable-lifecycle only: 200 when the
// files are taken, 500 naming the refused one (no password), 405 for GET, and 403
// without the flag.
func TestLifecycleReload(t *testing.T) {
	t.Parallel()
	srv, db := ownServer(t)
	newRole(t, srv, db, "lifecycle", "second-secret-pw", "SUPERUSER")
	file := writeFile(t, t.TempDir(), "dsn", roleDSN(srv, db, "lifecycle", "first-secret-pw")+"\n")
	off := startExporter(t, nil, "--db.dsn-file="+file, "--no-agent")
	p := startExporter(t, nil, "--db.dsn-file="+file, "--no-agent", "--web.enable-lifecycle")
	off.waitFor(t, `(?m)^pg_liveness_database_down_reason\{reason="auth"\} 1$`, 30*time.Second)
	p.waitFor(t, `(?m)^pg_liveness_database_down_reason\{reason="auth"\} 1$`, 30*time.Second)
	if code, body := do(t, http.MethodPost, "http://"+off.addr+"/-/reload"); code != http.StatusForbidden || !strings.Contains(body, "--web.enable-lifecycle") {
		t.Errorf("without the flag: %d %q, want 403 naming --web.enable-lifecycle", code, body)
	}
	if code, _ := do(t, http.MethodGet, "http://"+p.addr+"/-/reload"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", code)
	}

	// Rewritten in place with the same size and within the poll: the request, not the
	// watch, reloads it (the watch would too, a poll later).
	if err := os.WriteFile(file, []byte("host=a port=bad password=second-secret-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, body := do(t, http.MethodPost, "http://"+p.addr+"/-/reload")
	if code != http.StatusInternalServerError || !strings.Contains(body, "--db.dsn-file") || strings.Contains(body, "second-secret-pw") {
		t.Errorf("a malformed DSN file: %d %q, want 500 naming --db.dsn-file without the password", code, body)
	}
	replaceFile(t, file, roleDSN(srv, db, "lifecycle", "second-secret-pw")+"\n")
	if code, body := do(t, http.MethodPost, "http://"+p.addr+"/-/reload"); code != http.StatusOK {
		t.Errorf("a good DSN file: %d %q, want 200", code, body)
	}
	waitLog(t, p, "/-/reload: reloaded --db.dsn-file")
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	p.waitFor(t, `(?m)^pg_liveness_exporter_config_last_reload_successful 1$`, 10*time.Second)
}
