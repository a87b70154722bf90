package main

// The DSN as the binary reads it (--db.dsn, --db.dsn-file, DATA_SOURCE_NAME,
// --db.direct-dsn, --db.direct-dsn-file): a file that is not one DSN refused at start, and no password printed
// whatever its shape.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// A --db.dsn-file that is not one DSN in a regular file exits 2 at once, with one line
// naming the flag and no password: two DSNs on two lines, /dev/zero (read without bound
// before), a FIFO without a writer (it blocked before listening, deaf to SIGTERM), a
// directory, a UTF-16 file, a file of comments only.
func TestDSNFileRefusedAtStart(t *testing.T) {
	const pw = "hunter2secret"
	dir := t.TempDir()
	write := func(name, content string) string { return writeFile(t, dir, name, content) }
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
		// A password file others may write, or another user's, is refused, as libpq
		// refuses such a key file.
		{"world-writable", withMode(t, write("world", "host=a password="+pw+"\n"), 0o646, 0), "is writable by every user (mode 0646)"},
		{"group-writable", withMode(t, write("group", "host=a password="+pw+"\n"), 0o660, 0), "is writable by its group (mode 0660)"},
		{"another user's", withMode(t, write("other", "host=a password="+pw+"\n"), 0o640, 65534), "is owned by user 65534, neither root nor this process's user 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			code, out := runToExit(t, nil, "--db.dsn-file="+c.path, "--web.listen-address=127.0.0.1:0")
			if code != exitConfig {
				t.Fatalf("exit %d after %s, want %d:\n%s", code, time.Since(start), exitConfig, out)
			}
			checkOneLine(t, out, "--db.dsn-file", c.want)
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
	t.Parallel()
	db := pgtest.NewDB(t)
	file := writeFile(t, t.TempDir(), "dsn", "\uFEFF"+db.DSN+"\r\n")
	p := startExporter(t, nil, "--db.dsn-file="+file, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
}

// dsnShapes write a password into a DSN the ways operators do: keyword/value quoted and
// escaped (\' and \\), quoted but not escaped, unquoted; URLs with the password raw (an
// unencoded @) or percent-encoded, in the user info or as a query parameter; and the
// password first, before the field that is wrong. port is "1" (nothing listens on
// 127.0.0.1:1, so connecting fails at once) or "bad" (the DSN does not parse).
var dsnShapes = []func(pw, port string) string{
	func(pw, port string) string {
		return "host=127.0.0.1 port=" + port + " user=u password='" + kvEscape(pw) + "' dbname=d sslmode=disable"
	},
	func(pw, port string) string {
		return "host=127.0.0.1 port=" + port + " user=u password='" + pw + "' dbname=d sslmode=disable"
	},
	func(pw, port string) string {
		return "host=127.0.0.1 port=" + port + " user=u dbname=d sslmode=disable password=" + pw
	},
	func(pw, port string) string {
		return "postgres://u:" + pw + "@127.0.0.1:" + port + "/d?sslmode=disable"
	},
	func(pw, port string) string {
		return "postgres://" + url.UserPassword("u", pw).String() + "@127.0.0.1:" + port + "/d?sslmode=disable"
	},
	func(pw, port string) string {
		return "postgresql://u@127.0.0.1:" + port + "/d?sslmode=disable&password=" + pw
	},
	func(pw, port string) string {
		return "postgresql://u@127.0.0.1:" + port + "/d?sslmode=disable&password=" + url.QueryEscape(pw)
	},
	func(pw, port string) string {
		return "password='" + kvEscape(pw) + "' host=127.0.0.1 port=" + port + " user=u dbname=d sslmode=disable"
	},
}

func kvEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s)
}

// FuzzDSNNeverLeaksPassword feeds passwords in every DSN shape through every way a DSN
// enters the binary (--db.dsn, --db.dsn-file, DATA_SOURCE_NAME, --db.direct-dsn and its
// file) and asserts that no 4-byte sequence of the password appears in any error, log
// line or metric. A DSN that does not parse runs the binary's start-up in process, which must
// exit 2; one that parses runs the binary for a moment against 127.0.0.1:1 and is
// scraped once. Byte sequences that the same runs print with a harmless password
// ("vocabulary": field names, messages) do not count.
//
// `go test` runs the seed corpus; `go test -fuzz FuzzDSNNeverLeaksPassword -run '^$' .`
// explores further.
func FuzzDSNNeverLeaksPassword(f *testing.F) {
	for _, pw := range []string{
		`ab\'cd TAILSECRET`, // pgx's own redaction stopped at the \'
		`ab\ cd\\'TAILSECRET`,
		`p@ssTAIL@SECRET`,          // an unencoded @ in a URL
		`p@ss@TAIL:SEC/RET?x#y%zz`, // and worse
		`TAILSECRET' port=5 x='`,
	} {
		for shape := range dsnShapes {
			for _, bad := range []bool{true, false} {
				f.Add(pw, uint8(shape), bad)
			}
		}
	}
	f.Fuzz(func(t *testing.T, pw string, shape uint8, badPort bool) {
		if len(pw) < 4 || len(pw) > 48 {
			return
		}
		port := "1"
		if badPort {
			port = "bad"
		}
		s := dsnShapes[int(shape)%len(dsnShapes)](pw, port)
		out := dsnOutputs(t, s, pw)
		vocab := dsnVocabulary(t)
		// A DSN written carelessly (not escaped) may parse into something else than the
		// shape meant: the tail of pw may become, by the DSN's own words, a user name, a
		// database name or a setting, which may be printed. Never a host name, though:
		// connection errors print it, and no host name holds such bytes.
		said := ""
		if dsn.Validate(s) == nil {
			cfg, err := pgx.ParseConfig(s)
			if err != nil {
				t.Fatal(err)
			}
			said = cfg.User + "\x00" + cfg.Database
			for k, v := range cfg.RuntimeParams {
				said += "\x00" + k + "=" + v
			}
		}
		for i := 0; i+4 <= len(pw); i++ {
			w := pw[i : i+4]
			if strings.Contains(said, w) {
				continue
			}
			if strings.Contains(out, w) && !strings.Contains(vocab, w) {
				t.Fatalf("password bytes %q printed for DSN shape %d (port %s):\n%s", w, int(shape)%len(dsnShapes), port, out)
			}
		}
	})
}

var (
	vocabOnce sync.Once
	vocab     string
)

// dsnVocabulary is what the same runs print with a password made of bytes no message
// contains, for every shape and port.
func dsnVocabulary(t *testing.T) string {
	vocabOnce.Do(func() {
		var b strings.Builder
		for _, shape := range dsnShapes {
			for _, port := range []string{"1", "bad"} {
				s := shape("\x01\x02\x03\x04", port)
				b.WriteString(strings.ReplaceAll(s, "\x01\x02\x03\x04", "\x00") + "\x00")
				b.WriteString(dsnOutputs(t, s, "\x01\x02\x03\x04") + "\x00")
			}
		}
		vocab = b.String()
	})
	return vocab
}

// volatile removes values that change from run to run: times, durations, addresses of
// the in-process listener.
var volatile = regexp.MustCompile(`(?m)(\b(ts|time|retry_in|address|duration)=\S+|^pg_liveness_scrape_collector_duration_seconds.*$|127\.0\.0\.1:\d{2,}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})`)

// dsnOutputs collects every error, log line and metric the binary's code paths print
// for the DSN s.
func dsnOutputs(t *testing.T, s, pw string) string {
	t.Helper()
	var out []string
	add := func(what string, err error) {
		if err != nil {
			out = append(out, what+": "+err.Error())
		}
	}
	file := writeFile(t, t.TempDir(), "dsn", s+"\n")
	_, err := dsn.Resolve(s, "", "")
	add("flag", err)
	_, err = dsn.Resolve("", file, "")
	add("file", err)
	_, err = dsn.Resolve("", "", s)
	add("env", err)
	add("validate", dsn.Validate(s))
	out = append(out, dsn.Describe(s))

	const good = "host=127.0.0.1 port=1 user=u dbname=d sslmode=disable connect_timeout=1"
	binaryRun := func(d time.Duration, env string, args ...string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		var buf bytes.Buffer
		code := run(ctx, append([]string{"--web.listen-address=127.0.0.1:0", "--log.level=debug"}, args...), env, &buf)
		return code, buf.String()
	}

	if dsn.Validate(s) != nil {
		for _, c := range []struct {
			env  string
			args []string
		}{
			{"", []string{"--db.dsn=" + s}},
			{"", []string{"--db.dsn-file=" + file}},
			{s, nil},
			{"", []string{"--db.dsn=" + good, "--db.direct-dsn=" + s}},
			{"", []string{"--db.dsn=" + good, "--db.direct-dsn-file=" + file}},
		} {
			code, text := binaryRun(30*time.Second, c.env, c.args...)
			if code != exitConfig {
				t.Fatalf("malformed DSN: exit %d, want %d:\n%s", code, exitConfig, text)
			}
			out = append(out, text)
		}
		return volatile.ReplaceAllString(strings.Join(out, "\n"), "")
	}

	cfg, err := pgx.ParseConfig(s)
	if err != nil || cfg.Password != pw || cfg.Host != "127.0.0.1" || len(cfg.Fallbacks) > 0 {
		// The DSN says something else than the shape meant (the password is cut short,
		// or spills into other fields): what it names as password is not pw, and it
		// might name another host, which the test must not contact.
		return volatile.ReplaceAllString(strings.Join(out, "\n"), "")
	}
	// Long enough for the first connection attempts and their log lines.
	_, text := binaryRun(500*time.Millisecond, "", "--db.dsn-file="+file, "--db.direct-dsn="+s)
	out = append(out, text)

	pool, err := database.NewPool(database.PoolConfig{DSN: s, MaxConns: 1, ConnectTimeout: time.Second})
	add("pool", err)
	if err == nil {
		defer pool.Close()
		var logs bytes.Buffer
		logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		e, err := collector.New(collector.DefaultConfig(), pool, nil, logger)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "3")
		e.Handler(nil).ServeHTTP(rec, req)
		out = append(out, rec.Body.String(), logs.String())
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		add("ping", pool.Ping(ctx))
		cancel()
	}
	return volatile.ReplaceAllString(fmt.Sprint(strings.Join(out, "\n")), "")
}

// withMode gives the file at path the mode and the owner uid (the tests run as root) and
// returns path.
func withMode(t *testing.T, path string, mode os.FileMode, uid int) string {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, -1); err != nil {
		t.Fatal(err)
	}
	return path
}

// postgres_exporter's variables work as its users set them: DATA_SOURCE_URI with
// DATA_SOURCE_USER and DATA_SOURCE_PASS_FILE (a password with characters a URL must
// encode) reaches the database; and what postgres_exporter would silently choose between
// or ignore is refused at start with exit 2, naming the variables.
func TestPostgresExporterVariables(t *testing.T) {
	t.Parallel()
	srv, db := ownServer(t)
	const pw = "p@ss:w/rd%1"
	newRole(t, srv, db, "pe_user", strings.ReplaceAll(pw, "'", "''"), "SUPERUSER")
	dir := t.TempDir()
	passFile := writeFile(t, dir, "pass", pw+"\n")
	uri := fmt.Sprintf("127.0.0.1:%d/%s?sslmode=disable", srv.Port, db.Name)
	p := startExporter(t, []string{"DATA_SOURCE_URI=" + uri, "DATA_SOURCE_USER=pe_user", "DATA_SOURCE_PASS_FILE=" + passFile}, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	if strings.Contains(p.Logs(), pw) {
		t.Error("the password was logged")
	}

	userFile := writeFile(t, dir, "user", "pe_user\n")
	for _, c := range []struct {
		name string
		env  []string
		want string
	}{
		{"name and uri", []string{"DATA_SOURCE_NAME=host=a", "DATA_SOURCE_URI=" + uri}, "DATA_SOURCE_NAME and DATA_SOURCE_URI are both set"},
		{"pass and its file", []string{"DATA_SOURCE_URI=" + uri, "DATA_SOURCE_PASS=" + pw, "DATA_SOURCE_PASS_FILE=" + passFile}, "DATA_SOURCE_PASS and DATA_SOURCE_PASS_FILE are both set"},
		{"user and its file", []string{"DATA_SOURCE_URI=" + uri, "DATA_SOURCE_USER=u", "DATA_SOURCE_USER_FILE=" + userFile}, "DATA_SOURCE_USER and DATA_SOURCE_USER_FILE are both set"},
		{"password without uri", []string{"DATA_SOURCE_USER=u", "DATA_SOURCE_PASS=" + pw}, "without DATA_SOURCE_URI"},
		{"uri with a scheme", []string{"DATA_SOURCE_URI=postgresql://" + uri}, "DATA_SOURCE_URI is host:port/dbname"},
		{"missing pass file", []string{"DATA_SOURCE_URI=" + uri, "DATA_SOURCE_PASS_FILE=" + dir + "/none"}, "DATA_SOURCE_PASS_FILE: open"},
		// postgres_exporter's other variables mean a flag here or are refused by name.
		{"a PG_EXPORTER_ variable without a counterpart", []string{"PG_EXPORTER_CONSTANT_LABELS=env=prod"}, "PG_EXPORTER_CONSTANT_LABELS (postgres_exporter's) has no counterpart here"},
		{"another user's pass file", []string{"DATA_SOURCE_URI=" + uri, "DATA_SOURCE_PASS_FILE=" + withMode(t, writeFile(t, dir, "open", pw), 0o600, 65534)}, "DATA_SOURCE_PASS_FILE: " + dir + "/open is owned by user 65534"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out := runToExit(t, c.env, "--web.listen-address=127.0.0.1:0")
			if code != exitConfig {
				t.Fatalf("exit %d, want %d:\n%s", code, exitConfig, out)
			}
			checkOneLine(t, out, c.want)
			if strings.Contains(out, pw) {
				t.Errorf("the password was printed:\n%s", out)
			}
		})
	}
}
