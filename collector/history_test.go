package collector

import (
	"context"
	"flag"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

func historyOnly(maxSeries int, objectives ...string) Config {
	return Config{
		History: HistoryConfig{Enabled: true, LeaderlessObjective: time.Minute, Objectives: objectives},
		Leases:  LeasesConfig{MaxSeries: maxSeries}, Instances: InstancesConfig{MaxServices: maxSeries},
		ScrapeDefaultTimeout: 10 * time.Second,
	}
}

// histogramOf returns the histogram of the series of name with the label pairs, nil if
// there is none.
func histogramOf(mfs map[string]*dto.MetricFamily, name string, pairs ...string) *dto.Histogram {
	for _, m := range mfs[name].GetMetric() {
		if hasLabels(m, pairs...) {
			return m.GetHistogram()
		}
	}
	return nil
}

// seconds is the database's difference of two columns of the history row picked by where.
func seconds(t *testing.T, pool *pgxpool.Pool, expr, where string, args ...any) float64 {
	t.Helper()
	var v float64
	if err := pool.QueryRow(testutil.Context(t, time.Minute),
		`SELECT extract(epoch FROM `+expr+`)::float8 FROM liveness.history WHERE `+where, args...).Scan(&v); err != nil {
		t.Fatalf("%s where %s: %v", expr, where, err)
	}
	return v
}

// The history collector's histograms are the database's own durations: a released
// lease's gap, an expired one's, a dead holder's takeover and detection, and a
// leadership's length, each observed once, whatever the scrapes; a lease nobody leads is
// exported with its objective while it lasts; what happened before the exporter started
// is not counted; a row whose times run backwards is skipped and said once.
func TestHistoryHistogramsAreTheDatabasesDurations(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 2*time.Minute)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	take := func(lease, holder string, ttl float64, id *uuid.UUID) int64 {
		t.Helper()
		var epoch *int64
		if err := pool.QueryRow(ctx, `SELECT t.epoch FROM liveness.lease_take($1, $2, $3, $4, 'host') t`,
			lease, holder, ttl, id).Scan(&epoch); err != nil || epoch == nil {
			t.Fatalf("take %s: %v, epoch %v", lease, err, epoch)
		}
		return *epoch
	}
	// Before the exporter starts: not counted.
	e0 := take("before", "h0", 60, nil)
	exec(`SELECT liveness.lease_let_go('before', 'h0', $1)`, e0)

	logger, logs := logbuf.Logger()
	e := newExporter(t, historyOnly(10, "mail=5s"), exporterPool(t, db.DSN, 2, nil), nil, logger)
	got := scrapeFamilies(t, e)
	checkSamples(t, got, []sample{
		{"pg_liveness_scrape_collector_success", []string{"collector", "history"}, 1},
		{"pg_liveness_history_events_total", []string{"kind", "acquired"}, 0},
		{"pg_liveness_history_events_total", []string{"kind", "ended"}, 0},
	})

	// A release and a new holder; an expiry and a new holder.
	e1 := take("job", "h1", 60, nil)
	exec(`SELECT liveness.lease_let_go('job', 'h1', $1)`, e1)
	take("job", "h2", 60, nil)
	take("mail", "h3", 0.1, nil)
	testutil.Eventually(t, 10*time.Second, "mail expired", func() bool {
		var expired bool
		_ = pool.QueryRow(ctx, `SELECT expires_at < now() FROM liveness.leases WHERE name = 'mail'`).Scan(&expired)
		return expired
	})
	got = scrapeFamilies(t, e)
	if v := value(got, "pg_liveness_lease_leaderless_for_seconds", "lease", "mail", "after", "expired"); !(v >= 0) {
		t.Errorf("mail, expired and not taken: leaderless_for = %v; want a value", v)
	}
	checkSamples(t, got, []sample{
		{"pg_liveness_lease_leaderless_objective_seconds", []string{"lease", "mail"}, 5},
		{"pg_liveness_lease_leaderless_for_seconds", []string{"lease", "job"}, absent},
	})
	take("mail", "h4", 60, nil)

	// A dead holder: its lock vanishes, the watcher stamps it, and after its grace
	// another takes its lease.
	dead, heir := uuid.New(), uuid.New()
	exec(`INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, lock_grace)
		VALUES ($1, 'worker', true, interval '150 milliseconds'), ($2, 'worker', true, interval '150 milliseconds')`, dead, heir)
	locks := map[uuid.UUID]interface{ Close(context.Context) error }{}
	for _, id := range []uuid.UUID{dead, heir} {
		conn := db.Conn(t)
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, id).Scan(&ok); err != nil || !ok {
			t.Fatalf("claim: %v %v", err, ok)
		}
		locks[id] = conn
	}
	take("cron", "d1", 60, &dead)
	if err := locks[dead].Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the dead holder is dead", func() bool {
		exec(`SELECT liveness.watch_alive_locks(NULL)`)
		var alive bool
		_ = pool.QueryRow(ctx, `SELECT liveness.is_instance_alive($1)`, dead).Scan(&alive)
		return !alive
	})
	got = scrapeFamilies(t, e)
	if v := value(got, "pg_liveness_lease_leaderless_for_seconds", "lease", "cron", "after", "holder_dead"); !(v >= 0.15) {
		t.Errorf("cron, its holder dead: leaderless_for = %v; want at least the 150 ms grace", v)
	}
	checkSamples(t, got, []sample{{"pg_liveness_lease_leaderless_objective_seconds", []string{"lease", "cron"}, 60}})
	take("cron", "h5", 60, &heir)

	// A row written by hand whose times run backwards.
	exec(`INSERT INTO liveness.history (at, kind, lease_name, how, since) VALUES (now(), 'acquired', 'junk', 'released', now() + interval '1 hour')`)

	scrapeFamilies(t, e)
	scrapeFamilies(t, e) // later scrapes count nothing twice
	got = scrapeFamilies(t, e)
	for _, c := range []struct {
		name   string
		labels []string
		expr   string // the duration, from the history row picked by where
		where  string
	}{
		{"pg_liveness_lease_leaderless_seconds", []string{"lease", "job", "after", "released"}, "at - since", "kind = 'acquired' AND lease_name = 'job' AND how = 'released'"},
		{"pg_liveness_lease_leaderless_seconds", []string{"lease", "mail", "after", "expired"}, "at - since", "kind = 'acquired' AND lease_name = 'mail' AND how = 'expired'"},
		{"pg_liveness_lease_leaderless_seconds", []string{"lease", "cron", "after", "holder_dead"}, "at - since", "kind = 'acquired' AND lease_name = 'cron' AND how = 'holder_dead'"},
		{"pg_liveness_lease_takeover_seconds", []string{"lease", "cron"}, "at - dead_at", "kind = 'acquired' AND lease_name = 'cron' AND how = 'holder_dead'"},
		{"pg_liveness_lease_leadership_seconds", []string{"lease", "job", "ended", "released"}, "at - since", "kind = 'ended' AND lease_name = 'job'"},
		{"pg_liveness_lease_leadership_seconds", []string{"lease", "mail", "ended", "expired"}, "at - since", "kind = 'ended' AND lease_name = 'mail'"},
		{"pg_liveness_instance_death_detection_seconds", []string{"service", "worker", "how", "lock_lost"}, "at - since", "kind = 'dead'"},
	} {
		h := histogramOf(got, c.name, c.labels...)
		want := seconds(t, pool, c.expr, c.where)
		if h.GetSampleCount() != 1 || math.Abs(h.GetSampleSum()-want) > 1e-6 {
			t.Errorf("%s%v: %d observations summing %v; want one, %v (the database's %s)", c.name, c.labels, h.GetSampleCount(), h.GetSampleSum(), want, c.expr)
		}
	}
	if h := histogramOf(got, "pg_liveness_lease_leadership_seconds", "lease", "mail", "ended", "expired"); math.Abs(h.GetSampleSum()-0.1) > 1e-6 {
		t.Errorf("mail's expired leadership lasted %v s; want its ttl, 0.1 (from the row's taken_at to its expires_at)", h.GetSampleSum())
	}
	if h := histogramOf(got, "pg_liveness_instance_death_detection_seconds", "how", "lock_lost"); math.Abs(h.GetSampleSum()-0.15) > 1e-6 {
		t.Errorf("the death was detected %v s after the lock vanished; want its grace, 0.15", h.GetSampleSum())
	}
	for _, absentSeries := range []string{"before", "junk"} {
		if h := histogramOf(got, "pg_liveness_lease_leaderless_seconds", "lease", absentSeries); h != nil {
			t.Errorf("lease %s has a leaderless histogram: before the exporter started, or its times run backwards", absentSeries)
		}
	}
	checkSamples(t, got, []sample{
		{"pg_liveness_history_events_total", []string{"kind", "acquired"}, 7}, // job 2, mail 2, cron 2, junk
		{"pg_liveness_history_events_total", []string{"kind", "ended"}, 3},
		{"pg_liveness_history_events_total", []string{"kind", "joined"}, 2},
		{"pg_liveness_history_events_total", []string{"kind", "lock_vanished"}, 1},
		{"pg_liveness_history_events_total", []string{"kind", "dead"}, 1},
		{"pg_liveness_lease_leaderless_for_seconds", []string{"lease", "cron"}, absent},
		{"pg_liveness_lease_leaderless_for_seconds", []string{"lease", "mail"}, absent},
	})
	if n := strings.Count(logs.String(), "times run backwards"); n != 1 {
		t.Errorf("%d log lines about the backwards row over three scrapes; want 1:\n%s", n, logs)
	}
	checkHistoryExposition(t, scrapeResponse(t, e, "").Body.String())
}

var updateHistory = flag.Bool("update-history", false, "rewrite "+historyExposition+" from TestHistoryHistogramsAreTheDatabasesDurations' last scrape")

// historyExposition is the history collector's exposition after real failovers, kept
// beside scenario.prom (whose scenario has none of the events its histograms observe):
// the names that alert rules, dashboards and docs may use are read from both
// (testutil.ExposedMetrics). Its values are one run's; its families, types and label
// names are what the collector exports, checked on every run.
const historyExposition = "testdata/history.prom"

// historyFamily matches the history collector's families' sample names.
var historyFamily = regexp.MustCompile(`^pg_liveness_(history_events_total|lease_leaderless_.*|lease_takeover_.*|lease_leadership_.*|instance_death_detection_.*)$`)

func checkHistoryExposition(t *testing.T, got string) {
	t.Helper()
	if *updateHistory {
		header := "# The history collector's exposition after the failovers of TestHistoryHistogramsAreTheDatabasesDurations\n" +
			"# (go test ./collector -run TestHistoryHistogramsAreTheDatabasesDurations -update-history). Its families, types and\n" +
			"# label names are checked on every run; its values are that run's.\n"
		var keep []string
		for line := range strings.Lines(got) {
			name := strings.FieldsFunc(line, func(r rune) bool { return r == '{' || r == ' ' })
			if len(name) > 2 && name[0] == "#" {
				name = name[2:]
			}
			if len(name) > 0 && historyFamily.MatchString(name[0]) {
				keep = append(keep, line)
			}
		}
		if err := os.WriteFile(historyExposition, []byte(header+strings.Join(keep, "")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(historyExposition)
	if err != nil {
		t.Fatal(err)
	}
	shape := func(text string) map[string]string { // family → its type and label names
		out := map[string]string{}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		for name, mf := range fams {
			if mf.GetType() != dto.MetricType_HISTOGRAM && !strings.Contains(name, "leaderless") && !strings.Contains(name, "history_events") {
				continue
			}
			labels := map[string]bool{}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = true
				}
			}
			out[name] = mf.GetType().String() + " " + strings.Join(slices.Sorted(maps.Keys(labels)), ",")
		}
		return out
	}
	if g, w := shape(got), shape(string(want)); !maps.Equal(g, w) {
		t.Errorf("the history collector's families %v; %s has %v (-update-history rewrites it)", g, historyExposition, w)
	}
}

// Lease labels are capped: past --collector.leases.max-series leases, the rest share
// lease="other", in the histograms and the leaderless gauge alike.
func TestHistoryLeaseLabelsAreCapped(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 2*time.Minute)
	e := newExporter(t, historyOnly(3), exporterPool(t, db.DSN, 2, nil), nil, nil)
	scrapeFamilies(t, e)
	// Ten leases expire unrenewed and are taken again.
	if _, err := pool.Exec(ctx, `SELECT liveness.lease_take('l' || g, 'a' || g, 0.05, NULL, 'h') FROM generate_series(1, 10) g`); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the leases expired", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM liveness.leases WHERE expires_at < now()`) == 10
	})
	got := scrapeFamilies(t, e)
	if n := len(got["pg_liveness_lease_leaderless_for_seconds"].GetMetric()); n != 4 {
		t.Errorf("%d leaderless_for series for 10 leases, cap 3; want 3 and other", n)
	}
	if _, err := pool.Exec(ctx, `SELECT liveness.lease_take('l' || g, 'b' || g, 60, NULL, 'h') FROM generate_series(1, 10) g`); err != nil {
		t.Fatal(err)
	}
	got = scrapeFamilies(t, e)
	var total uint64
	for _, m := range got["pg_liveness_lease_leaderless_seconds"].GetMetric() {
		total += m.GetHistogram().GetSampleCount()
	}
	if n := len(got["pg_liveness_lease_leaderless_seconds"].GetMetric()); n != 4 || total != 10 {
		t.Errorf("%d leaderless series holding %d observations; want 4 (3 leases and other) holding all 10", n, total)
	}
	if h := histogramOf(got, "pg_liveness_lease_leaderless_seconds", "lease", "other"); h.GetSampleCount() != 7 {
		t.Errorf("lease=other holds %d observations; want the 7 past the cap", h.GetSampleCount())
	}
}

// A backlog (rows written by hand, a storm of moves while nobody scraped) is read in
// bounded steps: at most historyBatch × historyBatches rows a scrape, the rest on the next
// ones, nothing counted twice or lost; rows with nothing to observe (no lease, no times)
// are counted and observe nothing.
func TestHistoryBacklogIsReadInBoundedSteps(t *testing.T) {
	db, _ := testdb.MigratedPool(t, 2)
	e := newExporter(t, historyOnly(10), exporterPool(t, db.DSN, 2, nil), nil, nil)
	scrapeFamilies(t, e)
	const rows = historyBatch*historyBatches + 12345
	db.Exec(t, `INSERT INTO liveness.history (at, kind) SELECT now(), 'acquired' FROM generate_series(1, $1)`, rows)
	// Rows the schema never writes: an infinite time (not read), an infinite since (no
	// duration), an unknown kind (not counted).
	db.Exec(t, `INSERT INTO liveness.history (at, kind, lease_name, how, since) VALUES ('infinity', 'acquired', 'x', 'released', now()),
		(now(), 'acquired', 'y', 'released', '-infinity'), (now(), 'nonsense', 'z', 'released', now())`)
	var seen []float64
	for range 3 {
		seen = append(seen, value(scrapeFamilies(t, e), "pg_liveness_history_events_total", "kind", "acquired"))
	}
	if want := []float64{historyBatch * historyBatches, rows + 1, rows + 1}; !slices.Equal(seen, want) {
		t.Errorf("acquisitions counted after each of three scrapes: %v; want %v (a bounded step, then the rest, then nothing new)", seen, want)
	}
	if h := histogramOf(scrapeFamilies(t, e), "pg_liveness_lease_leaderless_seconds"); h != nil {
		t.Errorf("rows without a lease or times observed a leaderless time: %v", h)
	}
}
