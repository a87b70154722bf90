package collector

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

var dbCollectors = []string{NameAdvisoryLocks, NameHistory, NameInstances, NameLeases, NameStatements}

// TestDatabaseDownThenBack: with the server stopped, /metrics still answers 200 at once
// with up 0 and every database collector failed; once the server is back, up is 1 again
// without a new exporter or pool.
func TestDatabaseDownThenBack(t *testing.T) {
	t.Parallel() // a server of its own: start it alongside the others
	srv, db := stoppableDB(t)
	e := newExporter(t, DefaultConfig(), exporterPool(t, db.DSN, 2, nil), testAgent, nil)

	check := func(wantUp float64) {
		t.Helper()
		start := time.Now()
		rec := scrapeResponse(t, e, "5")
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("scrape took %s, want well under the 4.5s budget", took)
		}
		if rec.Code != http.StatusOK {
			t.Fatalf("status %d, want 200: %s", rec.Code, rec.Body.String())
		}
		mfs := parseText(t, rec.Body)
		if got := value(mfs, "pg_liveness_up"); got != wantUp {
			t.Errorf("pg_liveness_up = %v, want %v", got, wantUp)
		}
		for _, c := range dbCollectors {
			if got := value(mfs, "pg_liveness_scrape_collector_success", "collector", c); got != wantUp {
				t.Errorf("success{collector=%q} = %v, want %v", c, got, wantUp)
			}
		}
		// The agent does not need the database.
		if got := value(mfs, "pg_liveness_scrape_collector_success", "collector", NameAgent); got != 1 {
			t.Errorf("success{collector=agent} = %v, want 1", got)
		}
	}
	check(1)
	srv.Stop()
	check(0)
	check(0)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	check(1)
}

// TestScrapeDeadline: a collector blocked in the database misses the deadline the
// scraper's header sets; the response still comes in time, with success 0 for it and 1
// for the others, and the straggler lets go of its connection.
func TestScrapeDeadline(t *testing.T) {
	db := testdb.Migrated(t)
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	// Three connections: the leases collector and the history's (which reads the leases
	// too) wait on the lock, each on one; the others share the third.
	pool := exporterPool(t, db.DSN, 3, nil)
	e := newExporter(t, DefaultConfig(), pool, nil, nil)

	locker := db.Conn(t)
	ctx := testutil.Context(t, 30*time.Second)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE liveness.leases IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	done := make(chan *httptest.ResponseRecorder, 1)
	// A 3s scrape timeout, less the 0.5s offset: the leases query waits out its 2.5s; the
	// other collectors, sharing the pool's third connection, have all of it, which they
	// need on a loaded machine (with a 1s timeout, pg_stat_statements missed it under load).
	go func() { done <- scrapeResponse(t, e, "3") }()
	var rec *httptest.ResponseRecorder
	select {
	case rec = <-done:
	case <-time.After(8 * time.Second):
		t.Fatal("no response 8s into a scrape with a 3s timeout") // the rollback then frees it
	}
	took := time.Since(start)
	if took > 5*time.Second {
		t.Errorf("scrape took %s with a 3s scrape timeout", took)
	}
	if took < 2400*time.Millisecond {
		t.Errorf("scrape took %s: the leases query should have waited for the deadline", took)
	}
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	mfs := parseText(t, rec.Body)
	for _, c := range dbCollectors {
		want := 1.0
		if c == NameLeases || c == NameHistory {
			want = 0
		}
		if got := value(mfs, "pg_liveness_scrape_collector_success", "collector", c); got != want {
			t.Errorf("success{collector=%q} = %v, want %v", c, got, want)
		}
	}
	if got := value(mfs, "pg_liveness_up"); got != 1 {
		t.Errorf("pg_liveness_up = %v, want 1 (the other collectors got answers)", got)
	}
	if got := value(mfs, "pg_liveness_scrape_collector_duration_seconds", "collector", NameLeases); !(got >= 2.4 && got < 4.5) {
		t.Errorf("duration{collector=leases} = %v, want about the 2.5s budget", got)
	}
	if _, ok := mfs["pg_liveness_lease_held"]; ok {
		t.Error("a collector that missed the deadline exported metrics")
	}
	testutil.Eventually(t, 3*time.Second, "the straggler to release its connection", func() bool {
		return pool.Stat().AcquiredConns() == 0
	})
}

// TestUpWhenServerAnswersWithError: an ERROR from PostgreSQL (here: the schema was never
// migrated) fails the collector but proves the server is up.
func TestUpWhenServerAnswersWithError(t *testing.T) {
	db := pgtest.NewDB(t)
	cfg := DefaultConfig()
	cfg.Leases.Enabled, cfg.Statements.Enabled, cfg.AdvisoryLocks.Enabled, cfg.Agent.Enabled = false, false, false, false
	cfg.History.Enabled = false
	e := newExporter(t, cfg, exporterPool(t, db.DSN, 1, nil), nil, nil)
	mfs := scrapeFamilies(t, e)
	if got := value(mfs, "pg_liveness_scrape_collector_success", "collector", NameInstances); got != 0 {
		t.Errorf("success{collector=instances} = %v without the schema, want 0", got)
	}
	if got := value(mfs, "pg_liveness_up"); got != 1 {
		t.Errorf("pg_liveness_up = %v, want 1: the server answered", got)
	}
}

// TestSecretsStayOut scrapes with debug logging, with the database up and down, and
// looks for the server's password in the logs and in /metrics.
func TestSecretsStayOut(t *testing.T) {
	t.Parallel() // a server of its own: start it alongside the others
	srv, db := stoppableDB(t)
	if !strings.Contains(db.DSN, srv.Password) {
		t.Fatal("the test DSN carries no password; the test would prove nothing")
	}
	logger, logs := logbuf.Logger()
	e := newExporter(t, DefaultConfig(), exporterPool(t, db.DSN, 2, nil), testAgent, logger)

	var bodies strings.Builder
	scrape := func() {
		rec := scrapeResponse(t, e, "3")
		bodies.WriteString(rec.Body.String())
	}
	scrape() // up, without pg_stat_statements: logged
	srv.Stop()
	scrape() // down: every database collector logs its error
	scrape()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	scrape()

	if !strings.Contains(logs.String(), "collector failed") {
		t.Fatalf("no collector error was logged while the database was down; logs:\n%s", logs)
	}
	if strings.Contains(logs.String(), srv.Password) {
		t.Errorf("the password appears in the logs:\n%s", logs)
	}
	if strings.Contains(bodies.String(), srv.Password) {
		t.Error("the password appears in /metrics")
	}
}

// TestFailuresLoggedOnce: a database that stays down is one warning per collector, not
// one per scrape; the recovery is logged once.
func TestFailuresLoggedOnce(t *testing.T) {
	t.Parallel() // a server of its own: start it alongside the others
	srv, db := stoppableDB(t)
	logger, logs := logbuf.Logger()
	cfg := DefaultConfig()
	cfg.Leases.Enabled, cfg.Statements.Enabled, cfg.AdvisoryLocks.Enabled, cfg.History.Enabled = false, false, false, false
	e := newExporter(t, cfg, exporterPool(t, db.DSN, 1, nil), nil, logger)

	srv.Stop()
	for range 3 {
		scrapeResponse(t, e, "3")
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	scrapeResponse(t, e, "3")
	out := logs.String()
	if n := strings.Count(out, "level=WARN msg=\"collector failed\""); n != 1 {
		t.Errorf("%d warnings for a database down during 3 scrapes, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "level=DEBUG msg=\"collector failed\""); n != 2 {
		t.Errorf("%d debug lines for the repeated failure, want 2:\n%s", n, out)
	}
	if n := strings.Count(out, "collector recovered"); n != 1 {
		t.Errorf("%d recovery lines, want 1:\n%s", n, out)
	}
}

// TestHandlerHTTP serves through a real HTTP server: status, content type, the extra
// gatherer's metrics, and the scrape-timeout header.
func TestHandlerHTTP(t *testing.T) {
	db := testdb.Migrated(t)
	e := newExporter(t, DefaultConfig(), exporterPool(t, db.DSN, 2, nil), testAgent, nil)
	extra := prometheus.NewRegistry()
	extra.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "extra_gauge", Help: "From the caller's registry."},
		func() float64 { return 7 }))
	srv := httptest.NewServer(e.Handler(extra))
	t.Cleanup(srv.Close)

	req, _ := http.NewRequestWithContext(testutil.Context(t, 10*time.Second), http.MethodGet, srv.URL, nil)
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type = %q, want the text exposition format", ct)
	}
	if !resp.Uncompressed { // the transport asked for gzip and decompressed it
		t.Error("the answer was not gzipped although the client accepts gzip")
	}
	mfs := parseText(t, strings.NewReader(string(body)))
	if got := value(mfs, "extra_gauge"); got != 7 {
		t.Errorf("extra_gauge = %v, want 7 from the extra gatherer", got)
	}
	if got := value(mfs, "pg_liveness_up"); got != 1 {
		t.Errorf("pg_liveness_up = %v, want 1", got)
	}
}

func TestAcceptsGzip(t *testing.T) {
	for header, want := range map[string]bool{
		"":                      false,
		"gzip":                  true,
		"GZIP":                  true,
		"deflate, gzip;q=0.5":   true,
		"gzip;q=0":              false,
		"gzip; q=0.0, identity": false,
		"identity, br":          false,
		"x-gzip":                false,
		"br, gzip ; q=1":        true,
		"gzip;q=nonsense":       false,
	} {
		h := http.Header{}
		if header != "" {
			h.Set("Accept-Encoding", header)
		}
		if got := acceptsGzip(h); got != want {
			t.Errorf("Accept-Encoding %q: gzip %v, want %v", header, got, want)
		}
	}
}

func TestScrapeTimeout(t *testing.T) {
	e := &Exporter{cfg: DefaultConfig()}
	for _, c := range []struct {
		header string
		want   time.Duration
	}{
		{"", 10 * time.Second},          // no header: --scrape.default-timeout
		{"2", 1500 * time.Millisecond},  // less --scrape.timeout-offset
		{"10.5", 10 * time.Second},      // fractional seconds
		{"0.4", 200 * time.Millisecond}, // the offset would leave nothing: half
		{"abc", 10 * time.Second},       // unparsable: the default
		{"-1", 10 * time.Second},        // nonsense: the default
		// Values that parse as floats but are no timeout are treated as absent; NaN used
		// to turn into no deadline at all.
		{"NaN", 10 * time.Second},
		{"nan", 10 * time.Second},
		{"Inf", 10 * time.Second},
		{"+Inf", 10 * time.Second},
		{"-Inf", 10 * time.Second},
		{"0", 10 * time.Second},
		{"-0", 10 * time.Second},
		{"1e300", 10 * time.Second},
		{"86401", 10 * time.Second},
		{"0x10", 10 * time.Second}, // hexadecimal floats are no header Prometheus sends
		{"1_0", 10 * time.Second},
	} {
		h := http.Header{}
		if c.header != "" {
			h.Set("X-Prometheus-Scrape-Timeout-Seconds", c.header)
		}
		if got := e.cfg.scrapeTimeout(h); got != c.want {
			t.Errorf("header %q: timeout %s, want %s", c.header, got, c.want)
		}
		if got := e.cfg.scrapeTimeout(h); got <= 0 || got > 24*time.Hour {
			t.Errorf("header %q: timeout %s is no deadline", c.header, got)
		}
	}
}

// TestNoDatabaseCollectorPings: with only the agent collector, up comes from a ping.
func TestNoDatabaseCollectorPings(t *testing.T) {
	t.Parallel() // a server of its own: start it alongside the others
	srv := pgtest.NewServer(t)
	db := pgtest.NewDBOn(t, srv)
	cfg := Config{Agent: AgentConfig{Enabled: true}, ScrapeDefaultTimeout: 3 * time.Second}
	e := newExporter(t, cfg, exporterPool(t, db.DSN, 1, nil), testAgent, nil)
	if got := e.Enabled(); len(got) != 1 || got[0] != NameAgent {
		t.Fatalf("Enabled() = %v, want [agent]", got)
	}
	if got := value(scrapeFamilies(t, e), "pg_liveness_up"); got != 1 {
		t.Errorf("pg_liveness_up = %v with the database up, want 1", got)
	}
	srv.Stop()
	if got := value(scrapeFamilies(t, e), "pg_liveness_up"); got != 0 {
		t.Errorf("pg_liveness_up = %v with the database down, want 0", got)
	}
}

type panicky struct{}

func (panicky) Update(context.Context, *exposition.Builder) error { panic("boom") }

type failing struct{}

func (failing) Update(_ context.Context, out *exposition.Builder) error {
	out.Add(upDesc, 42) // must not be exported
	return errors.New("half way")
}

// stuck ignores its context, like a collector blocked on a lock in this process would.
// Once released it still sends a metric, after the scrape has long returned.
type stuck struct{ release, finished chan struct{} }

func (s stuck) Update(_ context.Context, out *exposition.Builder) error {
	defer close(s.finished)
	<-s.release
	out.Add(upDesc, 1)
	return nil
}

// TestStragglersAreNotAwaited: a collector that ignores its context does not hold the
// scrape past its deadline, and what it sends afterwards goes nowhere, without a panic.
func TestStragglersAreNotAwaited(t *testing.T) {
	s := stuck{release: make(chan struct{}), finished: make(chan struct{})}
	e := &Exporter{cfg: DefaultConfig(), logger: discard(), collectors: []*entry{
		{name: "agent", c: testAgentCollector(t)},
		{name: "stuck", c: s},
	}}
	var once sync.Once
	release := func() { once.Do(func() { close(s.release) }) }
	defer release()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- scrapeResponse(t, e, "0.8") }() // 0.3s after the offset
	var rec *httptest.ResponseRecorder
	select {
	case rec = <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("no response 2s into a scrape with a 0.3s budget")
	}
	mfs := parseText(t, rec.Body)
	if got := value(mfs, "pg_liveness_scrape_collector_success", "collector", "stuck"); got != 0 {
		t.Errorf("success{collector=stuck} = %v, want 0", got)
	}
	if got := value(mfs, "pg_liveness_scrape_collector_success", "collector", "agent"); got != 1 {
		t.Errorf("success{collector=agent} = %v, want 1", got)
	}
	release()
	select {
	case <-s.finished:
	case <-time.After(3 * time.Second):
		t.Fatal("the straggler could not finish sending")
	}
}

// TestCollectorFailuresAreContained: a panic or an error fails only that collector and
// drops what it sent before failing.
func TestCollectorFailuresAreContained(t *testing.T) {
	e := &Exporter{cfg: DefaultConfig(), logger: discard(), collectors: []*entry{
		{name: "agent", c: testAgentCollector(t)},
		{name: "failing", c: failing{}},
		{name: "panicky", c: panicky{}},
	}}
	mfs := parseText(t, scrapeResponse(t, e, "5").Body)
	for c, want := range map[string]float64{"agent": 1, "failing": 0, "panicky": 0} {
		if got := value(mfs, "pg_liveness_scrape_collector_success", "collector", c); got != want {
			t.Errorf("success{collector=%q} = %v, want %v", c, got, want)
		}
	}
	if got := value(mfs, "pg_liveness_up"); got != 0 {
		t.Errorf("pg_liveness_up = %v, want 0 (no pool, no database collector)", got)
	}
}

// A refused Config names the field, and starts with it: the binary turns the field into
// its flag (a flag-naming package of its own would not know the binary's flags).
func TestConfigErrorsNameTheField(t *testing.T) {
	for field, mutate := range map[string]func(*Config){
		"Config.Instances.MaxSeries":           func(c *Config) { c.Instances.MaxSeries = -1 },
		"Config.Instances.MaxServices":         func(c *Config) { c.Instances.MaxServices = -1 },
		"Config.Leases.Table":                  func(c *Config) { c.Leases.Table = "a.b.c" },
		"Config.Leases.MaxSeries":              func(c *Config) { c.Leases.MaxSeries = -1 },
		"Config.AdvisoryLocks.MaxApplications": func(c *Config) { c.AdvisoryLocks.MaxApplications = 0 },
		"Config.Statements.Patterns":           func(c *Config) { c.Statements.Patterns = []string{"bad=("} },
		"Config.Statements.CacheSize":          func(c *Config) { c.Statements.CacheSize = 0 },
		"Config.ScrapeTimeoutOffset":           func(c *Config) { c.ScrapeTimeoutOffset = -time.Second },
		"Config.ScrapeDefaultTimeout":          func(c *Config) { c.ScrapeDefaultTimeout = 0 },
	} {
		cfg := DefaultConfig()
		mutate(&cfg)
		_, err := New(cfg, nil, nil, nil)
		if err == nil || !strings.HasPrefix(err.Error(), field+" ") && !strings.HasPrefix(err.Error(), field+":") {
			t.Errorf("%s: error %v, want one that starts with the field", field, err)
		}
	}
	// Each bad value alone, so that each check is shown to work by itself.
	for _, bad := range []string{"noequals", "=regex", "name=[", ""} {
		cfg := DefaultConfig()
		cfg.Statements.Patterns = []string{bad}
		if _, err := New(cfg, nil, nil, nil); err == nil || !strings.HasPrefix(err.Error(), "Config.Statements.Patterns: ") {
			t.Errorf("pattern %q: error %v, want one naming Config.Statements.Patterns", bad, err)
		}
	}
	for _, bad := range []string{".leases", "x.", "a.b.c", "."} {
		cfg := DefaultConfig()
		cfg.Leases.Table = bad
		if _, err := New(cfg, nil, nil, nil); err == nil || !strings.HasPrefix(err.Error(), "Config.Leases.Table: ") {
			t.Errorf("table %q: error %v, want one naming Config.Leases.Table", bad, err)
		}
	}
	if _, err := New(DefaultConfig(), nil, nil, nil); err == nil || !strings.Contains(err.Error(), "pool") {
		t.Errorf("no pool: error %v, want one saying a pool is needed", err)
	}
}

// A limit refuses a value below its least, naming its field and the rule, and takes the
// least itself.
func TestLimitCheck(t *testing.T) {
	for _, c := range []struct {
		least, value int
		want         string // "" for no error
	}{
		{0, -1, "Config.X.Max must be 0 or more, got -1"},
		{0, 0, ""},
		{1, 0, "Config.X.Max must be at least 1, got 0"},
		{1, 1, ""},
		{1, 500, ""},
	} {
		v := c.value
		err := limit{field: "Config.X.Max", value: &v, least: c.least}.check()
		if (err == nil) != (c.want == "") || (err != nil && err.Error() != c.want) {
			t.Errorf("least %d, value %d: %v, want %q", c.least, c.value, err, c.want)
		}
	}
}

// Patterns are merged over the defaults by name: a pattern of a default's name replaces it
// in place, an empty one removes it, a new name comes after the defaults.
func TestPatternsMergeOverTheDefaults(t *testing.T) {
	patterns, err := parsePatterns([]string{"heartbeat=my_heartbeat", "cleanup=", `reports=^/\* reports`})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range patterns {
		got = append(got, p.name+"="+p.re.String())
	}
	var wantList []string
	for _, name := range store.Tags() {
		switch name {
		case "heartbeat":
			wantList = append(wantList, `heartbeat=my_heartbeat`) // overridden in place
		case "cleanup": // removed
		default:
			wantList = append(wantList, name+`=pg_liveness:`+name+`\b`)
		}
	}
	want := strings.Join(append(wantList, `reports=^/\* reports`), "\n")
	if strings.Join(got, "\n") != want {
		t.Errorf("patterns:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
}
