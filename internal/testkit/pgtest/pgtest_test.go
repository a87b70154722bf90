package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func TestNewDBIsFreshAndDropped(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		db := NewDB(t)
		name = db.Name
		db.Exec(t, `CREATE TABLE x (i int)`)
		other := NewDB(t)
		if other.Name == db.Name {
			t.Fatal("two tests got the same database")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var n int
		if err := other.Conn(t).QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'x'`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("fresh database sees another test's table: %d, %v", n, err)
		}
	})
	if SharedServer(t) == nil {
		return // an existing server: nothing more to check about its lifecycle
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, SharedServer(t).AdminDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var exists bool
	if err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil || exists {
		t.Fatalf("database %s still exists after its test (%v)", name, err)
	}
}

func TestServerListensOnLoopbackWithPasswordAndStatStatements(t *testing.T) {
	s := NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		t.Fatal(redact(err))
	}
	defer c.Close(ctx)
	var listen, preload string
	if err := c.QueryRow(ctx, `SELECT current_setting('listen_addresses'), current_setting('shared_preload_libraries')`).Scan(&listen, &preload); err != nil {
		t.Fatal(err)
	}
	if listen != "127.0.0.1" || !strings.Contains(preload, "pg_stat_statements") {
		t.Fatalf("listen_addresses=%q shared_preload_libraries=%q", listen, preload)
	}
	bad := strings.Replace(s.DSN("postgres"), s.Password, "wrong", 1)
	if c2, err := pgx.Connect(ctx, bad); err == nil {
		c2.Close(ctx)
		t.Fatal("TCP connection with a wrong password was accepted")
	}
}

func TestStopAndStartKeepPortAndData(t *testing.T) {
	s := NewServer(t)
	db := NewDBOn(t, s)
	db.Exec(t, `CREATE TABLE kept (i int); INSERT INTO kept VALUES (7)`)
	port := s.Port
	s.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c, err := pgx.Connect(ctx, db.DSN); err == nil {
		c.Close(ctx)
		t.Fatal("connected to a stopped server")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if s.Port != port {
		t.Fatalf("port changed across restart: %d → %d", port, s.Port)
	}
	var v int
	if err := db.Conn(t).QueryRow(ctx, `SELECT i FROM kept`).Scan(&v); err != nil || v != 7 {
		t.Fatalf("data lost across restart: %d, %v", v, err)
	}
}

// A test binary that panics must not leave a server or its folder behind.
func TestWatchdogCleansUpAfterPanic(t *testing.T) {
	if os.Getenv("PGTEST_PANIC_CHILD") == "1" {
		s, err := StartServer()
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(3)
		}
		pid, _ := os.ReadFile(filepath.Join(s.dir, "data", "postmaster.pid"))
		fmt.Printf("DIR %s\nPID %s\n", s.dir, strings.SplitN(string(pid), "\n", 2)[0])
		panic("simulated test panic")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestWatchdogCleansUpAfterPanic$")
	cmd.Env = append(os.Environ(), "PGTEST_PANIC_CHILD=1")
	out, _ := cmd.CombinedOutput()
	var dir, pid string
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "DIR "); ok {
			dir = v
		}
		if v, ok := strings.CutPrefix(line, "PID "); ok {
			pid = v
		}
	}
	if dir == "" || pid == "" {
		t.Fatalf("child did not start a server:\n%s", out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, dirErr := os.Stat(dir)
		_, procErr := os.Stat("/proc/" + pid)
		if os.IsNotExist(dirErr) && os.IsNotExist(procErr) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the child panicked: folder %s exists=%v, postgres %s running=%v", dir, dirErr == nil, pid, procErr == nil)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestWithDBName(t *testing.T) {
	if got := withDBName("postgres://u:p@h:5/orig?sslmode=disable", "new"); got != "postgres://u:p@h:5/new?sslmode=disable" {
		t.Errorf("URL: %s", got)
	}
	if got := withDBName("host=h dbname=orig", "new"); !strings.HasSuffix(got, " dbname=new") {
		t.Errorf("keyword/value: %s", got)
	}
}

// The throwaway server is the major PG_LIVENESS_TEST_PG_MAJOR names, or, unset, Debian's
// newest under /usr/lib/postgresql.
func TestServerIsTheMajorAsked(t *testing.T) {
	major, err := Major()
	if err != nil {
		t.Fatal(err)
	}
	bindir, err := FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	if major == 0 {
		if major = versionOf(bindir); major == 0 {
			t.Fatalf("%s unset and %s is no /usr/lib/postgresql/<major>/bin", EnvMajor, bindir)
		}
	}
	db := NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var num int
	if err := db.Conn(t).QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&num); err != nil {
		t.Fatal(err)
	}
	if num/10000 != major {
		t.Fatalf("server_version_num %d from %s, want major %d", num, bindir, major)
	}
}

// ConnAs's session carries the application name; Conn's the driver's default.
func TestConnAsNamesTheApplication(t *testing.T) {
	db := NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for app, c := range map[string]*pgx.Conn{"checkout:alive-lock": db.ConnAs(t, "checkout:alive-lock"), "": db.Conn(t)} {
		var got string
		if err := c.QueryRow(ctx, `SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != app {
			t.Errorf("application_name %q, want %q", got, app)
		}
	}
}

func TestQueryInt(t *testing.T) {
	db := NewDB(t)
	if n := db.QueryInt(t, `SELECT count(*) FROM generate_series(1, $1)`, 7); n != 7 {
		t.Errorf("QueryInt = %d, want 7", n)
	}
}
