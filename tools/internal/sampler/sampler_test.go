package sampler

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The SQL sample (one statement) of an instance no one runs says dead, unlocked, without a
// row; of an agent's instance, alive, locked by a backend, with its row; and it shows the lease the
// agent leads with the agent as its holder. SQLLoop hands such samples on until its
// context ends.
func TestSQLReader(t *testing.T) {
	db := testdb.Migrated(t)
	ctx := testutil.Context(t, 60*time.Second)
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	r := NewSQLReader(migrations.DefaultSchema, 3*time.Second)

	id := uuid.New()
	smp, err := r.Read(ctx, conn, []uuid.UUID{id})
	if err != nil {
		t.Fatal(err)
	}
	if got := smp.Inst[id]; got != (Instance{}) || len(smp.Leases) != 0 || smp.From.IsZero() || smp.At.Before(smp.From) {
		t.Fatalf("before the agent: %+v, leases %v, from %v to %v; want a dead instance without lock or row, no lease", got, smp.Leases, smp.From, smp.At)
	}

	a, err := liveness.NewAgent(liveness.AgentConfig{
		Pool: db.Pool(t, 4), DirectDSN: db.DSN, InstanceID: id, ServiceName: "sampled",
		Timing: liveness.Timing{HeartbeatInterval: 300 * time.Millisecond, HeartbeatSlowInterval: 600 * time.Millisecond,
			StaleThreshold: 3 * time.Second, DefinitiveDeadCutoff: 10 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() { _ = a.Run(runCtx) })
	wg.Go(func() {
		_ = a.Elect(runCtx, liveness.ElectorConfig{Lease: "sampled-job", TTL: 5 * time.Second, RetryPeriod: 100 * time.Millisecond,
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) { <-ctx.Done() }})
	})
	testutil.Eventually(t, 30*time.Second, "the agent's instance alive, locked, with its row, leading sampled-job", func() bool {
		smp, err = r.Read(ctx, conn, []uuid.UUID{id})
		v, l := smp.Inst[id], smp.Leases["sampled-job"]
		return err == nil && v.Alive && v.State == "alive" && v.Locked && v.LockPID != 0 && v.Row &&
			l.HolderID == id.String() && !l.Expired && l.LiveHolder() == l.Holder && l.Epoch > 0
	})

	// A reader of some leases reads those only.
	only, err := NewSQLReader(migrations.DefaultSchema, 3*time.Second).Leases("other-%").Read(ctx, conn, []uuid.UUID{id})
	if err != nil || len(only.Leases) != 0 || !only.Inst[id].Alive {
		t.Errorf("a reader of other-%%: %+v, %v; want the instance alive and no lease", only, err)
	}

	// The loop hands on samples of the same verdicts, each after the last.
	loopCtx, stopLoop := context.WithCancel(ctx)
	got := make(chan SQL, 16)
	var loop sync.WaitGroup
	loop.Go(func() {
		SQLLoop{DSN: db.DSN, Reader: r, Every: 50 * time.Millisecond, Timeout: 5 * time.Second,
			IDs: func() []uuid.UUID { return []uuid.UUID{id} },
			Got: func(s SQL) {
				select {
				case got <- s:
				default:
				}
			},
			Missed: func(err error) { t.Errorf("missed: %v", err) },
		}.Run(loopCtx)
	})
	first, second := <-got, <-got
	stopLoop()
	loop.Wait()
	if !first.Inst[id].Alive || !second.Inst[id].Locked || !second.At.After(first.At) {
		t.Errorf("loop samples %+v then %+v: want the instance alive and locked, in order", first, second)
	}
}

// An exposition is read into its plain samples and pg_liveness_instances by service and
// state; it has a verdict only when the exporter was up and read the instances; a state
// not in StateAlive and two instances of a service are errors of State, an unparsable
// value an error of the scrape.
func TestScrape(t *testing.T) {
	body := ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) }))
	defer srv.Close()
	scrape := func(text string) (Exposition, error) {
		body = text
		return Scrape(context.Background(), srv.Client(), srv.URL)
	}
	const ok = "pg_liveness_up 1\npg_liveness_scrape_collector_success{collector=\"instances\"} 1\n"
	e, err := scrape(ok + "# TYPE pg_liveness_instances gauge\n" +
		"pg_liveness_instances{service=\"api\",state=\"alive\"} 1\n" +
		"pg_liveness_instances{service=\"api\",state=\"stale\"} 0\n" +
		"pg_liveness_instances{service=\"db\",state=\"zombie\"} 1\n" +
		"pg_liveness_instances{service=\"two\",state=\"alive\"} 1\n" +
		"pg_liveness_instances{service=\"two\",state=\"stale\"} 1\n" +
		"pg_liveness_instances{service=\"odd\",state=\"resting\"} 1\n" +
		"go_goroutines 12\n")
	if err != nil || !e.Verdict || e.Plain["go_goroutines"] != 12 {
		t.Fatalf("scrape: %+v, %v; want a verdict and go_goroutines 12", e, err)
	}
	for svc, want := range map[string]string{"api": "alive", "db": "zombie", "none": ""} {
		if got, err := e.State(svc); got != want || err != nil {
			t.Errorf("State(%s) = %q, %v; want %q", svc, got, err, want)
		}
	}
	for svc, want := range map[string]bool{"api": true, "db": false, "two": true, "none": false} {
		if got, err := e.Alive(svc); got != want || err != nil {
			t.Errorf("Alive(%s) = %v, %v; want %v", svc, got, err, want)
		}
	}
	if _, err := e.State("two"); err == nil {
		t.Error("State(two): no error for two instances")
	}
	if _, err := e.State("odd"); !errors.Is(err, ErrUnknownState) {
		t.Errorf("State(odd) = %v; want ErrUnknownState", err)
	}
	if _, err := e.Alive("odd"); !errors.Is(err, ErrUnknownState) {
		t.Errorf("Alive(odd) = %v; want ErrUnknownState", err)
	}
	for name, text := range map[string]string{
		"down":                "pg_liveness_up 0\npg_liveness_scrape_collector_success{collector=\"instances\"} 1\n",
		"instances unread":    "pg_liveness_up 1\npg_liveness_scrape_collector_success{collector=\"instances\"} 0\n",
		"no collector sample": "pg_liveness_up 1\n",
	} {
		if e, err := scrape(text); err != nil || e.Verdict {
			t.Errorf("%s: verdict %v, %v; want a scrape without a verdict", name, e.Verdict, err)
		}
	}
	if _, err := scrape(ok + "pg_liveness_instances{service=\"api\",state=\"alive\"} one\n"); !errors.Is(err, ErrMalformed) {
		t.Errorf("unparsable value: %v; want ErrMalformed", err)
	}
	srv.Close()
	if _, err := scrape(ok); err == nil {
		t.Error("a closed server: no error")
	}
}

// Alerts reads a real Prometheus' active alerts: an alert whose series are one firing and
// one pending is firing, an alert only pending is pending, one not active is left out.
func TestAlerts(t *testing.T) {
	// Mixed's early series fires 3 s after the start; its late series is active from 5 s
	// after the start, so pending from 5 to 8 s.
	rules := filepath.Join(t.TempDir(), "rules.yml")
	late := time.Now().Add(5 * time.Second).Unix()
	if err := os.WriteFile(rules, fmt.Appendf(nil, `groups:
- name: sampled
  rules:
  - alert: Mixed
    expr: label_replace(vector(1), "series", "early", "", "") or (label_replace(vector(1), "series", "late", "", "") and on() (vector(time()) > %d))
    for: 3s
  - alert: Waits
    expr: vector(1)
    for: 1h
  - alert: Quiet
    expr: vector(0) > 1
`, late), 0o600); err != nil {
		t.Fatal(err)
	}
	p := proctest.StartPrometheus(t, map[string]any{
		"global":     map[string]any{"evaluation_interval": "1s"},
		"rule_files": []string{rules},
	}, "--log.level=warn")
	client := &http.Client{Timeout: 2 * time.Second}
	// mixed reads the states of Mixed's series.
	mixed := func() map[string]string {
		alerts, err := ActiveAlerts(context.Background(), client, p.Addr)
		if err != nil {
			return nil
		}
		out := map[string]string{}
		for _, a := range alerts {
			if a.Labels["alertname"] == "Mixed" {
				out[a.Labels["series"]] = a.State
			}
		}
		return out
	}
	var state map[string]string
	testutil.Eventually(t, 30*time.Second, "Mixed's early series firing and its late one pending, as Alerts reads them", func() bool {
		before := mixed()
		var err error
		state, err = Alerts(context.Background(), client, p.Addr)
		after := mixed()
		return err == nil && before["early"] == "firing" && before["late"] == "pending" && maps.Equal(before, after)
	})
	if want := map[string]string{"Mixed": "firing", "Waits": "pending"}; !maps.Equal(state, want) {
		t.Errorf("alerts %v; want %v", state, want)
	}
}
