package liveness

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logtest"
)

// Every logger the package builds from a caller's Logger removes passwords, whatever
// handler the caller gave, and names its part once: the caller's own key and the
// Agent's part key appear once each. Nothing connects: the pool is lazy and its server is not there.
func TestLoggersRemovePasswordsAndNameTheirPartOnce(t *testing.T) {
	dsn := "host=127.0.0.1 port=1 user=u password=" + logtest.Password + " dbname=d connect_timeout=1"
	var buf bytes.Buffer
	caller := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})).
		With("component", "agent")
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	timing := Timing{HeartbeatInterval: time.Second, HeartbeatSlowInterval: 2 * time.Second,
		StaleThreshold: 5 * time.Second, DefinitiveDeadCutoff: 20 * time.Second}
	agent, err := NewAgent(AgentConfig{Pool: pool, DirectDSN: dsn, InstanceID: uuid.New(), ServiceName: "svc",
		Timing: timing, Reaper: true, Logger: caller})
	if err != nil {
		t.Fatal(err)
	}
	lock, err := alivelock.NewDirect(alivelock.DirectConfig{DSN: dsn, InstanceID: uuid.New(), ServiceName: "svc", Logger: caller})
	if err != nil {
		t.Fatal(err)
	}
	hb, err := newHeartbeatWorker(heartbeatConfig{Pool: pool, InstanceID: uuid.New(), ServiceName: "svc",
		Timing: timing, Logger: caller})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := NewLeases(LeasesConfig{Pool: pool, Logger: caller})
	if err != nil {
		t.Fatal(err)
	}
	reaper, err := newReaper(reaperConfig{Pool: pool, Leases: leases, Interval: time.Second, LeaseTTL: time.Minute,
		StaleThreshold: timing.StaleThreshold, DefinitiveDeadCutoff: timing.DefinitiveDeadCutoff, Logger: caller})
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name, part string // part: the key the Agent adds, "" for none
		log        *slog.Logger
	}{
		{"agent", "", agent.cfg.Logger},
		{"agent's alive lock", "alive_lock", agent.lock.(*alivelock.Direct).Logger()},
		{"agent's heartbeat", "heartbeat", agent.heartbeat.log},
		{"agent's leases", "leases", agent.leases.log},
		{"agent's reaper", "reaper", agent.reaper.cfg.Logger},
		{"alive lock", "", lock.Logger()},
		{"heartbeat", "", hb.log},
		{"leases", "", leases.log},
		{"reaper", "", reaper.cfg.Logger},
	} {
		buf.Reset()
		logtest.LogPasswords(c.log)
		if leak, problem := logtest.Leak(buf.String()); leak != "" || problem != "" {
			t.Errorf("%s: leaked %q (%s):\n%s", c.name, leak, problem, buf.String())
		}
		buf.Reset()
		c.log.Warn("cannot connect", "attempt", 1)
		line := buf.String()
		if n := strings.Count(line, "component="); n != 1 {
			t.Errorf("%s: the caller's key %d times, want once: %s", c.name, n, line)
		}
		want := 0
		if c.part != "" {
			want = 1
		}
		if n := strings.Count(line, " part="); n != want || (want == 1 && !strings.Contains(line, " part="+c.part+" ")) {
			t.Errorf("%s: want part=%q once, got: %s", c.name, c.part, line)
		}
	}
}
