package main

// What SIGHUP and a change on disk reload (reload.go): --db.dsn-file and
// --web.config.file, each refused change keeping what is in force, and the metrics that
// say so.

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/tlstest"
)

// SIGHUP reloads --db.dsn-file (a rotated password is picked up) and never stops the
// process; a reload that fails keeps the previous DSN.
func TestSIGHUPReloadsDSNFile(t *testing.T) {
	t.Parallel()
	srv, db := ownServer(t)
	newRole(t, srv, db, "rotated", "new-secret-pw", "SUPERUSER")
	file := writeFile(t, t.TempDir(), "dsn", roleDSN(srv, db, "rotated", "old-secret-pw")+"\n")
	p := startExporter(t, nil, "--db.dsn-file="+file, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_database_down_reason\{reason="auth"\} 1$`, 30*time.Second)

	// A malformed file: the reload fails, the process lives on.
	replaceFile(t, file, "host=127.0.0.1 port=bad password='x\\'new-secret-pw'\n")
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, "keeping the previous DSN")

	replaceFile(t, file, roleDSN(srv, db, "rotated", "new-secret-pw")+"\n")
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, "reloaded --db.dsn-file")
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	for _, pw := range []string{"old-secret-pw", "new-secret-pw"} {
		if strings.Contains(p.Logs(), pw) {
			t.Errorf("the password %s was logged", pw)
		}
	}
}

// Without --db.dsn-file there is nothing to reload, and SIGHUP still does not kill the
// agent: it keeps its row and lock.
func TestSIGHUPDoesNotKill(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN})
	p.waitFor(t, `(?m)^pg_liveness_agent_alive_lock_held 1$`, 30*time.Second)
	for range 3 {
		p.signal(t, syscall.SIGHUP)
	}
	waitLog(t, p, "nothing to reload")
	testutil.Never(t, 500*time.Millisecond, "the exporter exited after SIGHUP", p.exited)
	p.waitFor(t, `(?m)^pg_liveness_agent_alive_lock_held 1$`, 10*time.Second)
}

// On SIGHUP the same rules hold, and a refused file keeps the DSN in use: a second line
// or a FIFO put in its place is one log line naming the flag, the exporter goes on
// scraping with the previous DSN, and it does not block on the FIFO.
func TestDSNFileRefusedOnSIGHUP(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	file := writeFile(t, t.TempDir(), "dsn", db.DSN+"\n")
	p := startExporter(t, nil, "--db.dsn-file="+file, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)

	refusals := 0
	for _, c := range []struct {
		name    string
		replace func() error
		want    string
	}{
		{"two lines", func() error { return os.WriteFile(file, []byte(db.DSN+"\nhost=elsewhere\n"), 0o600) }, "holds 2 lines"},
		{"group-writable", func() error { return os.Chmod(file, 0o660) }, "is writable by its group (mode 0660)"},
		{"fifo", func() error {
			if err := os.Remove(file); err != nil {
				return err
			}
			return syscall.Mkfifo(file, 0o600)
		}, "is a named pipe (FIFO), not a regular file"},
	} {
		if err := c.replace(); err != nil {
			t.Fatal(err)
		}
		p.signal(t, syscall.SIGHUP)
		refusals++
		waitLogCount(t, p, "keeping the previous DSN", refusals)
		if line := lastLogLine(p, "keeping the previous DSN"); !strings.Contains(line, "--db.dsn-file") || !strings.Contains(line, c.want) {
			t.Errorf("%s: the log line does not name --db.dsn-file and say %q: %s", c.name, c.want, line)
		}
		// Still scraping through the previous DSN.
		p.waitFor(t, `(?m)^pg_liveness_up 1$`, 10*time.Second)
	}
	if strings.Contains(p.Logs(), db.Server.Password) {
		t.Error("the password was logged")
	}
}

// A DSN file as Kubernetes mounts a Secret unless told otherwise, owned by root with mode
// 0644, is taken: the exporter reaches the database, and says once at start, and once on
// each reload that reads it again, that every user may read it.
func TestDSNFileOfASecretsDefaultMount(t *testing.T) {
	db := pgtest.NewDB(t)
	file := withMode(t, writeFile(t, t.TempDir(), "dsn", db.DSN+"\n"), 0o644, 0)
	p := startExporter(t, nil, "--db.dsn-file="+file, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	const warning = "is readable by every user of this machine; accepted because root owns it"
	waitLogCount(t, p, warning, 1)
	if line := lastLogLine(p, warning); !strings.Contains(line, "level=WARN") || !strings.Contains(line, file) || !strings.Contains(line, "mode=0644") {
		t.Errorf("the warning is not a warning naming the file and its mode: %s", line)
	}
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, "SIGHUP: reloaded --db.dsn-file")
	if n := strings.Count(p.Logs(), warning); n != 2 {
		t.Errorf("%d warnings after the start and one reload, want 2:\n%s", n, p.Logs())
	}
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 10*time.Second)
}

// webConfigDir writes a self-signed certificate for 127.0.0.1 and its key into a new
// folder, and returns the folder and a pool that trusts the certificate.
func webConfigDir(t *testing.T) (string, *x509.CertPool) {
	t.Helper()
	dir := t.TempDir()
	return dir, tlstest.WriteSelfSigned(t, dir, "tls")
}

// The web configuration in force is always the last valid one. The exporter serves over
// real TLS with basic auth; each bad change of the file (emptied, a comment, {}, invalid
// YAML, basic auth or TLS removed, deleted, unreadable) is one log line naming the file
// and the reason, sets ..._config_last_reload_successful to 0, and changes nothing: every
// endpoint still wants the password, /metrics still answers. SIGHUP checks and reports
// again. A valid change (a new password) is taken: the new password works, the old one no
// longer does.
func TestWebConfigReloadKeepsTheLastValidOne(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	dir, pool := webConfigDir(t)
	file := filepath.Join(dir, "web.yml")
	valid := func(user, pw string) string { // relative file names, resolved from the file's folder
		return fmt.Sprintf("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\nbasic_auth_users:\n  %s: %s\n", user, tlstest.BcryptHash(t, pw))
	}
	replaceFile(t, file, valid("alice", "old-password"))
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--no-agent", "--web.config.file="+file)
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(path, user, pw string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "https://"+p.addr+path, nil)
		if user != "" {
			req.SetBasicAuth(user, pw)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(b)
	}
	gauge := func(user, pw, name string) float64 {
		t.Helper()
		code, body := get("/metrics", user, pw)
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(body)
		if code != http.StatusOK || m == nil {
			t.Fatalf("/metrics: %d, no %s", code, name)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	const (
		successful = "pg_liveness_exporter_config_last_reload_successful"
		timestamp  = "pg_liveness_exporter_config_last_reload_success_timestamp_seconds"
		refusal    = "refused a change of --web.config.file"
	)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := client.Get("https://" + p.addr + "/"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the exporter does not serve TLS: %v", err)
		}
	}
	if v := gauge("alice", "old-password", successful); v != 1 {
		t.Fatalf("%s %v at start, want 1", successful, v)
	}
	started := gauge("alice", "old-password", timestamp)

	changes := []struct {
		name   string
		change func()
		reason string
	}{
		{"emptied", func() { replaceFile(t, file, "") }, "is empty: it would serve without TLS and authentication"},
		{"a comment", func() { replaceFile(t, file, "# to be filled in\n") }, "is empty"},
		{"{}", func() { replaceFile(t, file, "{}\n") }, "configures neither TLS nor basic auth"},
		{"invalid yaml", func() { replaceFile(t, file, "basic_auth_users:\n  alice: [\n") }, "yaml:"},
		{"basic auth removed", func() { replaceFile(t, file, "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n") },
			"removes basic authentication (basic_auth_users); serving without it takes a restart"},
		{"TLS removed", func() {
			replaceFile(t, file, "basic_auth_users:\n  alice: "+tlstest.BcryptHash(t, "old-password")+"\n")
		},
			"removes TLS (tls_server_config); serving without TLS takes a restart"},
		{"deleted", func() {
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
		}, "no such file or directory"},
		// As root, file modes do not stop a read: a directory in the file's place does.
		{"unreadable", func() {
			if err := os.Mkdir(file, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "is a directory, not a regular file"},
	}
	for i, c := range changes {
		c.change()
		waitLogCount(t, p, refusal, i+1)
		if line := lastLogLine(p, refusal); !strings.Contains(line, file) || !strings.Contains(line, c.reason) {
			t.Errorf("%s: the refusal does not name %s and say %q:\n%s", c.name, file, c.reason, line)
		}
		if code, _ := get("/metrics", "", ""); code != http.StatusUnauthorized {
			t.Errorf("%s: /metrics without credentials: %d, want 401", c.name, code)
		}
		for _, path := range []string{"/status.json", "/status", "/"} {
			if code, _ := get(path, "", ""); code != http.StatusUnauthorized {
				t.Errorf("%s: %s without credentials: %d, want 401", c.name, path, code)
			}
		}
		if v := gauge("alice", "old-password", successful); v != 0 {
			t.Errorf("%s: %s %v, want 0", c.name, successful, v)
		}
	}
	// SIGHUP checks the file again and says so again; polls said it once per change.
	p.signal(t, syscall.SIGHUP)
	waitLogCount(t, p, refusal, len(changes)+1)
	if n := strings.Count(p.Logs(), refusal); n != len(changes)+1 {
		t.Errorf("%d refusal lines for %d changes and a SIGHUP", n, len(changes))
	}

	// A valid change: a new password.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	replaceFile(t, file, valid("alice", "new-password"))
	waitLog(t, p, "reloaded --web.config.file")
	if code, _ := get("/metrics", "alice", "new-password"); code != http.StatusOK {
		t.Errorf("the new password: %d, want 200", code)
	}
	if code, _ := get("/metrics", "alice", "old-password"); code != http.StatusUnauthorized {
		t.Errorf("the old password: %d, want 401", code)
	}
	if v := gauge("alice", "new-password", successful); v != 1 {
		t.Errorf("after a valid change %s %v, want 1", successful, v)
	}
	if v := gauge("alice", "new-password", timestamp); v <= started {
		t.Errorf("%s %v, not after the start's %v", timestamp, v, started)
	}
	// Never an error per request: the toolkit never read a bad file.
	if strings.Contains(p.Logs(), "Unable to parse configuration") {
		t.Errorf("the toolkit read a configuration it could not parse (the exporter logs follow)")
	}
}

// With the DSN file refused on SIGHUP, the reload metric says so too.
func TestReloadMetricCountsTheDSNFile(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	file := filepath.Join(t.TempDir(), "dsn")
	replaceFile(t, file, db.DSN+"\n")
	p := startExporter(t, nil, "--db.dsn-file="+file, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_exporter_config_last_reload_successful 1$`, 30*time.Second)
	replaceFile(t, file, db.DSN+"\n"+db.DSN+"\n")
	p.signal(t, syscall.SIGHUP)
	p.waitFor(t, `(?m)^pg_liveness_exporter_config_last_reload_successful 0$`, 15*time.Second)
	replaceFile(t, file, db.DSN+"\n")
	p.signal(t, syscall.SIGHUP)
	p.waitFor(t, `(?m)^pg_liveness_exporter_config_last_reload_successful 1$`, 15*time.Second)
}
