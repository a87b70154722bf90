package alivelock

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/netfault"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

func startAliveLock(t *testing.T, cfg DirectConfig) *Direct {
	t.Helper()
	lock, _ := startAliveLockStoppable(t, cfg)
	return lock
}

func startAliveLockStoppable(t *testing.T, cfg DirectConfig) (*Direct, func()) {
	t.Helper()
	lock, err := NewDirect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lock, testutil.RunUntilCleanup(t, lock.Run)
}

// TestAliveLockClaimedSoonAfterItsPreviousSessionEnds: a lock refused by a session that
// claimed it for this instance (as after a network cut heals: this process's previous
// session, ended only when its FIN reaches the server) is claimed again within a fraction
// of the lock grace of that session's end, at the default settings: the watcher stamps
// the lock vanished then, and the claim and the beat that records it must land within
// the grace. It was claimed again every second, the grace itself.
func TestAliveLockClaimedSoonAfterItsPreviousSessionEnds(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 4)
	id := uuid.New()
	previous, endPrevious := startAliveLockStoppable(t, DirectConfig{DSN: db.DSN, InstanceID: id, ServiceName: "svc"})
	testutil.Eventually(t, 5*time.Second, "the previous session holds the lock", previous.Held)
	next := startAliveLock(t, DirectConfig{DSN: db.DSN, InstanceID: id, ServiceName: "svc"})
	testutil.Eventually(t, 5*time.Second, "the next session's claim refused by the previous one", next.Duplicate)

	endPrevious()
	ended := time.Now()
	testutil.Eventually(t, 5*time.Second, "the next session holds the lock", next.Held)
	// Generous for a loaded machine (a claim is one round trip, sent every 50 ms); the
	// claim every second took 0.8-1 s here.
	if took := time.Since(ended); took > 700*time.Millisecond {
		t.Fatalf("the lock was claimed %s after the previous session ended; want well within the lock grace (%s)",
			took.Round(time.Millisecond), defaults.LockGrace)
	}
}

// TestAliveLockMissingFunction: before the migrations, the claim fails with an error
// that is logged once and is not fatal; the claim succeeds once the objects exist.
func TestAliveLockMissingFunction(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 90*time.Second)
	db, pool := testdb.MigratedPool(t, 4)
	db.Exec(t, `CREATE SCHEMA not_migrated_yet`) // the schema exists, its functions do not
	logs := &logbuf.Recorder{}
	lock := startAliveLock(t, DirectConfig{DSN: db.DSN, Schema: "not_migrated_yet", InstanceID: uuid.New(),
		ServiceName: "svc", VerifyInterval: 20 * time.Millisecond, Logger: slog.New(logs)})
	logs.ToldOnce(t, "alive lock claim failed", slog.LevelError, 5, 5*time.Second)
	if lock.Held() {
		t.Fatalf("held before the migrations:%s", logs)
	}
	if _, err := migrations.Apply(ctx, pool, "not_migrated_yet"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "the claim once the migrations are applied", lock.Held)
}

// TestAliveLockKeepaliveSettings reads, on the lock's own session, the settings its
// startup parameters chose, over TCP and against database defaults that say otherwise;
// and, on Linux, the client socket's keepalive options.
func TestAliveLockKeepaliveSettings(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 4)
	db.Exec(t, `ALTER DATABASE `+pgx.Identifier{db.Name}.Sanitize()+` SET idle_session_timeout = '1h'`)
	db.Exec(t, `ALTER DATABASE `+pgx.Identifier{db.Name}.Sanitize()+` SET tcp_keepalives_idle = 100`)

	cases := []struct {
		name                    string
		idle, interval, timeout time.Duration
		count                   int
		want                    map[string]string
		// TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT, TCP_USER_TIMEOUT of the client socket:
		// one probe fewer than the server's, and a user timeout that ends no later than
		// those probes, so that the client gives up on its lock before the server frees it.
		wantSock [4]int
	}{
		{name: "defaults", want: map[string]string{
			"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3",
			"tcp_user_timeout": "30000", "idle_session_timeout": "0", "application_name": "svc:alive-lock",
		}, wantSock: [4]int{10, 5, 2, 20000}},
		{name: "configured", idle: 7 * time.Second, interval: 2 * time.Second, count: 4, timeout: 21 * time.Second,
			want: map[string]string{
				"tcp_keepalives_idle": "7", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "4",
				"tcp_user_timeout": "21000", "idle_session_timeout": "0", "application_name": "svc:alive-lock",
			}, wantSock: [4]int{7, 2, 3, 13000}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lock, err := NewDirect(DirectConfig{DSN: db.DSN, InstanceID: uuid.New(), ServiceName: "svc",
				KeepaliveIdle: tc.idle, KeepaliveInterval: tc.interval, KeepaliveCount: tc.count, UserTimeout: tc.timeout})
			if err != nil {
				t.Fatal(err)
			}
			type seen struct {
				settings map[string]string
				sock     [4]int
				err      error
			}
			got := make(chan seen, 1)
			lock.afterConnect = func(ctx context.Context, conn *pgx.Conn) {
				s := seen{settings: map[string]string{}}
				defer func() { got <- s }()
				rows, _ := conn.Query(ctx, `SELECT name, setting FROM pg_settings WHERE name = ANY($1)`,
					[]string{"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
						"tcp_user_timeout", "idle_session_timeout", "application_name"})
				var name, setting string
				if _, s.err = pgx.ForEachRow(rows, []any{&name, &setting}, func() error {
					s.settings[name] = setting
					return nil
				}); s.err != nil {
					return
				}
				s.sock, s.err = clientKeepalive(conn.PgConn().Conn())
			}
			testutil.RunUntilCleanup(t, lock.Run)
			var s seen
			select {
			case s = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("the alive lock did not connect within 10s")
			}
			if s.err != nil {
				t.Fatal(s.err)
			}
			for name, want := range tc.want {
				if s.settings[name] != want {
					t.Errorf("%s = %q on the lock's session, want %q", name, s.settings[name], want)
				}
			}
			if runtime.GOOS == "linux" && s.sock != tc.wantSock {
				t.Errorf("client socket TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT, TCP_USER_TIMEOUT = %v, want %v", s.sock, tc.wantSock)
			}
		})
	}
}

// clientKeepalive reads the socket's keepalive options and user timeout on Linux
// (TCP_KEEPIDLE = 4, TCP_KEEPINTVL = 5, TCP_KEEPCNT = 6, TCP_USER_TIMEOUT = 18); elsewhere
// it returns zeros. Keepalive must be on.
func clientKeepalive(c net.Conn) (opts [4]int, err error) {
	if runtime.GOOS != "linux" {
		return opts, nil
	}
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		return opts, fmt.Errorf("the lock's connection is a %T, not TCP", c)
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return opts, err
	}
	var on int
	var sockErr error
	err = raw.Control(func(fd uintptr) {
		if on, sockErr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE); sockErr != nil {
			return
		}
		for i, opt := range []int{4, 5, 6, 18} {
			if opts[i], sockErr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, opt); sockErr != nil {
				return
			}
		}
	})
	if err == nil {
		err = sockErr
	}
	if err == nil && on == 0 {
		err = fmt.Errorf("SO_KEEPALIVE is off on the lock's client socket")
	}
	return opts, err
}

// TestAliveLockConfigErrors: bad settings are refused naming the flag, without the
// password.
func TestAliveLockConfigErrors(t *testing.T) {
	good := DirectConfig{DSN: "host=127.0.0.1 user=u password=s3cret dbname=d", InstanceID: uuid.New(), ServiceName: "svc"}
	if err := good.Session().Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(*DirectConfig)
		want string
	}{
		{"empty DSN", func(c *DirectConfig) { c.DSN = "" }, "alivelock.Config.DSN must not be empty"},
		{"malformed DSN", func(c *DirectConfig) { c.DSN = "postgres://u:s3cret@host:notaport/db" }, "alivelock.Config.DSN"},
		{"nil instance id", func(c *DirectConfig) { c.InstanceID = uuid.Nil }, "alivelock.Config.InstanceID"},
		{"no service name", func(c *DirectConfig) { c.ServiceName = "" }, "alivelock.Config.ServiceName"},
		{"fractional idle", func(c *DirectConfig) { c.KeepaliveIdle = 1500 * time.Millisecond },
			"alivelock.Config.KeepaliveIdle (1.5s) must be a whole number of seconds"},
		{"negative interval", func(c *DirectConfig) { c.KeepaliveInterval = -time.Second },
			"alivelock.Config.KeepaliveInterval (-1s) must not be negative"},
		{"negative count", func(c *DirectConfig) { c.KeepaliveCount = -1 },
			"alivelock.Config.KeepaliveCount (-1) must not be negative"},
		{"negative user timeout", func(c *DirectConfig) { c.UserTimeout = -time.Second },
			"alivelock.Config.UserTimeout (-1s) must not be negative"},
		{"sub-millisecond user timeout", func(c *DirectConfig) { c.UserTimeout = 500 * time.Microsecond },
			"alivelock.Config.UserTimeout (500µs) must be at least 1ms"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			_, err := NewDirect(c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewDirect() = %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

// TestAliveLockStaysHeldAcrossVerifications holds the lock through many verification
// ticks: Held never flickers, there is one claim and no loss, and no log line above Info
// (a failing verification would re-claim on every other tick).
func TestAliveLockStaysHeldAcrossVerifications(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 90*time.Second)
	db, pool := testdb.MigratedPool(t, 4)
	logs := &logbuf.Recorder{}
	id := uuid.New()
	lock := startAliveLock(t, DirectConfig{DSN: db.DSN, InstanceID: id, ServiceName: "svc",
		VerifyInterval: 20 * time.Millisecond, Logger: slog.New(logs)})
	testutil.Eventually(t, 10*time.Second, "lock held", lock.Held)
	// About 50 verification ticks.
	if !testutil.Never(t, time.Second, "Held() turned false while nothing happened to the lock", func() bool { return !lock.Held() }) {
		t.Fatalf("logs:\n%s", logs)
	}
	if s := lock.Stats(); s.Claims != 1 || s.Losses != 0 || s.Reconnects != 0 {
		t.Fatalf("stats after holding quietly: %+v\n%s", s, logs)
	}
	if _, warnOrWorse := logs.Count("", slog.LevelWarn); warnOrWorse != 0 {
		t.Fatalf("%d warnings or errors while holding quietly:\n%s", warnOrWorse, logs)
	}
	if pid := testdb.AliveLockHolder(t, ctx, pool, id); pid == 0 {
		t.Fatal("no backend holds the lock")
	}
}

// TestAliveLockKeepsItsSessionThroughAnUnansweredVerification freezes the link under a
// verification for longer than the lock can be trusted unanswered (2 s here) but shorter
// than the statement's timeout, as a network blip does. Held turns false at the trust
// bound, but the session stays: when the link heals, the answer arrives on it, and the
// lock was held by the same backend throughout. A session dropped at the trust bound
// sends its close behind the unanswered statement; the server ends the session when the
// link heals, the lock vanishes, and the fleet calls a live, connected instance dead
// until a new session claims it (seen in a soak: 0.2 s dead after a 5 s blip).
func TestAliveLockKeepsItsSessionThroughAnUnansweredVerification(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 90*time.Second)
	db, pool := testdb.MigratedPool(t, 4)
	link := netfault.NewProxy(t, db.DSN, 0)
	link.HoldCloses = true // a close goes out behind what the frozen link holds, as TCP's does
	t.Cleanup(link.Close)
	t.Cleanup(link.Thaw)
	logs := &logbuf.Recorder{}
	id := uuid.New()
	// The client gives up one keepalive probe before the server: 1 s idle and 1 s
	// between probes make 2 s, the longest a statement can go unanswered and the lock
	// still be trusted; the statement's own timeout is 5 s beyond that.
	lock := startAliveLock(t, DirectConfig{DSN: link.DSN(), InstanceID: id, ServiceName: "svc",
		KeepaliveIdle: time.Second, KeepaliveInterval: time.Second, KeepaliveCount: 2,
		VerifyInterval: 100 * time.Millisecond, Logger: slog.New(logs)})
	testutil.Eventually(t, 10*time.Second, "lock held", lock.Held)
	holder := testdb.AliveLockHolder(t, ctx, pool, id)
	if holder == 0 {
		t.Fatal("no backend holds the lock")
	}

	link.Freeze()
	frozen := time.Now()
	testutil.Eventually(t, 10*time.Second, "Held false once the verification is unanswered past the trust bound",
		func() bool { return !lock.Held() })
	if waited := time.Since(frozen); waited < time.Second {
		t.Fatalf("Held turned false %s after the freeze; the trust bound is 2 s from the last answer", waited)
	}
	// Past the trust bound, well short of the statement's timeout (7 s from its sending).
	testutil.Never(t, 1500*time.Millisecond, "the lock's holder changed while the link was frozen", func() bool {
		return testdb.AliveLockHolder(t, ctx, pool, id) != holder
	})
	link.Thaw()
	testutil.Eventually(t, 10*time.Second, "Held again once the link heals", lock.Held)
	if !testutil.Never(t, time.Second, "the lock's holder changed after the link healed", func() bool {
		return testdb.AliveLockHolder(t, ctx, pool, id) != holder
	}) {
		t.Fatalf("logs:\n%s", logs)
	}
	if s := lock.Stats(); s.Reconnects != 0 || s.Claims != 1 || s.Losses != 1 {
		t.Fatalf("Stats = %+v; want the first session kept (no reconnect, 1 claim) and 1 loss of trust\n%s", s, logs)
	}
	if pid := lock.HeldPID(); pid != int64(holder) {
		t.Fatalf("HeldPID = %d, want the backend that held the lock throughout (%d)", pid, holder)
	}
	if n, _ := logs.Count("unanswered", slog.LevelWarn); n != 1 {
		t.Fatalf("%v warnings of the unanswered statement; want 1\n%s", n, logs)
	}
}

// TestAliveLockRecoversFastEveryTime: each loss of a held lock is a new incident, so the
// reconnect backoff starts over; a series of terminated backends (a flapping pooler, a
// DBA's script) is recovered from as fast the sixth time as the first.
func TestAliveLockRecoversFastEveryTime(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 90*time.Second)
	db, pool := testdb.MigratedPool(t, 4)
	dsn := db.DSN
	id := uuid.New()
	lock := startAliveLock(t, DirectConfig{DSN: dsn, InstanceID: id, ServiceName: "svc", VerifyInterval: time.Minute})
	for i := range 6 {
		testutil.Eventually(t, 3*time.Second, fmt.Sprintf("the alive lock held again (loss %d)", i), lock.Held)
		pid := testdb.AliveLockHolder(t, ctx, pool, id)
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend = %v, %v", ok, err)
		}
		testutil.Eventually(t, 3*time.Second, "the loss noticed", func() bool { return !lock.Held() })
	}
	testutil.Eventually(t, 3*time.Second, "the alive lock held again after the sixth loss", lock.Held)
}

// TestAliveLockOverAUnixSocket: a DirectDSN that names the server's unix socket (an agent
// on the database's host) holds the lock. The TCP options the session sets on its socket
// (the user timeout) do not apply there, and setting them made every connection fail.
func TestAliveLockOverAUnixSocket(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 60*time.Second)
	db, pool := testdb.MigratedPool(t, 4)
	if db.Server == nil {
		t.Fatal("this test needs the test server's unix socket; unset " + pgtest.EnvDSN)
	}
	id := uuid.New()
	lock := startAliveLock(t, DirectConfig{DSN: db.Server.AdminDSN(db.Name), InstanceID: id, ServiceName: "svc"})
	testutil.Eventually(t, 10*time.Second, "lock held over the unix socket", lock.Held)
	if pid := testdb.AliveLockHolder(t, ctx, pool, id); pid == 0 {
		t.Fatal("no backend holds the lock")
	}
}
