package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// SIGHUP reloads --db.dsn-file (a rotated password is picked up) and never stops the
// process; a reload that fails keeps the previous DSN.
func TestSIGHUPReloadsDSNFile(t *testing.T) {
	srv := pgtest.NewServer(t)
	db := pgtest.NewDBOn(t, srv)
	db.Exec(t, `CREATE ROLE rotated LOGIN SUPERUSER PASSWORD 'new-secret-pw'`)
	file := filepath.Join(t.TempDir(), "dsn")
	write := func(pw string) {
		dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=rotated password=%s dbname=%s sslmode=disable", srv.Port, pw, db.Name)
		if err := os.WriteFile(file, []byte(dsn+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("old-secret-pw")
	p := startExporter(t, nil, "--db.dsn-file="+file, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_database_down_reason\{reason="auth"\} 1$`, 30*time.Second)

	// A malformed file: the reload fails, the process lives on.
	if err := os.WriteFile(file, []byte("host=127.0.0.1 port=bad password='x\\'new-secret-pw'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, "keeping the previous DSN")

	write("new-secret-pw")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
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
	db := pgtest.NewDB(t)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN})
	p.waitFor(t, `(?m)^pg_liveness_agent_alive_lock_held 1$`, 30*time.Second)
	for range 3 {
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	waitLog(t, p, "nothing to reload")
	time.Sleep(500 * time.Millisecond)
	p.waitFor(t, `(?m)^pg_liveness_agent_alive_lock_held 1$`, 10*time.Second)
}

func waitLog(t *testing.T, p *exporterProc, want string) {
	t.Helper()
	waitLogCount(t, p, want, 1)
}

// waitLogCount waits until n lines (or more) of the logs hold want.
func waitLogCount(t *testing.T, p *exporterProc, want string, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for strings.Count(p.Logs(), want) < n {
		select {
		case <-p.done:
			t.Fatalf("the exporter exited with %d while waiting for %q", p.code, want)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q:\n%s", want, p.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
