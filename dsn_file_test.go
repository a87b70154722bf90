package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// A --db.dsn-file that is not one DSN in a regular file exits 2 at once, with one line
// naming the flag and no password: two DSNs on two lines, /dev/zero (read without bound
// before), a FIFO without a writer (it blocked before listening, deaf to SIGTERM), a
// directory, a UTF-16 file, a file of comments only.
func TestDSNFileRefusedAtStart(t *testing.T) {
	const pw = "hunter2secret"
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, path, want string }{
		{"two dsns", write("two", "host=a password="+pw+"\nhost=b password="+pw+"\n"), "holds 2 lines"},
		{"dev zero", "/dev/zero", "is a character device, not a regular file"},
		{"fifo", fifo, "is a named pipe (FIFO), not a regular file"},
		{"directory", dir, "is a directory, not a regular file"},
		{"utf-16", write("utf16", "\xff\xfeh\x00o\x00s\x00t\x00=\x00"), "UTF-16"},
		{"comments only", write("comments", "# host=a password="+pw+"\n"), "holds no DSN"},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			code, out := runToExit(t, nil, "--db.dsn-file="+c.path, "--web.listen-address=127.0.0.1:0")
			if code != exitConfig {
				t.Fatalf("exit %d after %s, want %d:\n%s", code, time.Since(start), exitConfig, out)
			}
			if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 {
				t.Errorf("want one line, got %d:\n%s", len(lines), out)
			}
			if !strings.Contains(out, "--db.dsn-file") || !strings.Contains(out, c.want) {
				t.Errorf("the line does not name --db.dsn-file and say %q:\n%s", c.want, out)
			}
			if strings.Contains(out, pw) {
				t.Errorf("the password was printed:\n%s", out)
			}
		})
	}
}

// A DSN file written by an editor that adds a UTF-8 byte-order mark works: the mark
// used to become part of the first keyword, so host= was lost and the exporter retried
// the default socket forever.
func TestDSNFileWithByteOrderMark(t *testing.T) {
	db := pgtest.NewDB(t)
	file := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(file, []byte("\uFEFF"+db.DSN+"\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startExporter(t, nil, "--db.dsn-file="+file, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
}

// On SIGHUP the same rules hold, and a refused file keeps the DSN in use: a second line
// or a FIFO put in its place is one log line naming the flag, the exporter goes on
// scraping with the previous DSN, and it does not block on the FIFO.
func TestDSNFileRefusedOnSIGHUP(t *testing.T) {
	db := pgtest.NewDB(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "dsn")
	if err := os.WriteFile(file, []byte(db.DSN+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startExporter(t, nil, "--db.dsn-file="+file, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)

	refusals := 0
	for _, c := range []struct {
		name    string
		replace func() error
		want    string
	}{
		{"two lines", func() error { return os.WriteFile(file, []byte(db.DSN+"\nhost=elsewhere\n"), 0o600) }, "holds 2 lines"},
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
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		refusals++
		waitLogCount(t, p, "keeping the previous DSN", refusals)
		var line string
		for l := range strings.Lines(p.Logs()) {
			if strings.Contains(l, "keeping the previous DSN") {
				line = l
			}
		}
		if !strings.Contains(line, "--db.dsn-file") || !strings.Contains(line, c.want) {
			t.Errorf("%s: the log line does not name --db.dsn-file and say %q: %s", c.name, c.want, line)
		}
		// Still scraping through the previous DSN.
		p.waitFor(t, `(?m)^pg_liveness_up 1$`, 10*time.Second)
	}
	if strings.Contains(p.Logs(), db.Server.Password) {
		t.Error("the password was logged")
	}
}
