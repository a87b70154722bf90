package status_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent"
	"github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Hostile values, as a database may hold them.
const (
	hostileLease = `</td><script>window.pwned=1</script><img src=x onerror="window.pwned=2">`
	hostileHost  = `"><svg onload=window.pwned=3>`
	hostileApp   = `app<script>window.pwned=4</script>`
	hostileMeta  = `{"note": "</script><script>window.pwned=5</script>"}`
)

func setup(t *testing.T) (*pgtest.DB, *pgxpool.Pool, context.Context) {
	t.Helper()
	db, pool := testdb.MigratedPool(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return db, pool, ctx
}

// fixture writes a zombie, a stale and two alive instances (one holding its lock through
// a session of its own), a lease with a hostile name held by the alive one, and two idle
// sessions of a hostile application each holding an advisory lock: the pool-starvation
// signature.
func fixture(t *testing.T, ctx context.Context, db *pgtest.DB, pool *pgxpool.Pool) map[string]uuid.UUID {
	t.Helper()
	ids := map[string]uuid.UUID{"alive": uuid.New(), "zombie": uuid.New(), "stale": uuid.New(), "heartbeat_only": uuid.New()}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%.60s: %v", sql, err)
		}
	}
	add := func(state, service string, age int, holds bool) {
		exec(`INSERT INTO liveness.instances (instance_id, service_name, host_name, process_id, last_heartbeat_at,
		          stale_threshold, definitive_dead_cutoff, lock_grace, holds_alive_lock, metadata)
		      VALUES ($1, $2, $3, 4242, now() - make_interval(secs => $4), '20 s', '60 s', '1 hour', $5, $6)`,
			ids[state], service, hostileHost, age, holds, hostileMeta)
	}
	add("alive", "checkout", 0, true)
	add("zombie", "checkout", 120, true)
	add("stale", "billing", 30, false)
	add("heartbeat_only", "billing", 0, false)
	for _, state := range []string{"alive", "zombie"} {
		if _, err := db.ConnAs(t, "checkout:alive-lock").Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, ids[state]); err != nil {
			t.Fatal(err)
		}
	}
	for k := range 2 {
		if _, err := db.ConnAs(t, hostileApp).Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(1000+k)); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO liveness.leases (name, holder, holder_instance_id, holder_host, expires_at)
	      VALUES ($1, 'h:1:ff', $2, $3, now() + interval '10 minutes')`, hostileLease, ids["alive"], hostileHost)
	return ids
}

func newHandler(t testing.TB, pool *pgxpool.Pool) *status.Handler {
	t.Helper()
	h, err := status.New(status.Config{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func get(t *testing.T, h http.Handler, target string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// The JSON form shows the states instance_states gives, the lease's holder, and the
// hostile application's pool-starvation signature.
func TestJSONMatchesTheDatabase(t *testing.T) {
	db, pool, ctx := setup(t)
	ids := fixture(t, ctx, db, pool)
	res, body := get(t, newHandler(t, pool), "/status.json")
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("%s %s\n%s", res.Status, res.Header.Get("Content-Type"), body)
	}
	var p status.Page
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	want := testdb.States(t, pool)
	if len(p.Instances.Rows) != len(ids) || p.Instances.Total != len(ids) {
		t.Fatalf("%d rows of %d, want %d", len(p.Instances.Rows), p.Instances.Total, len(ids))
	}
	for _, r := range p.Instances.Rows {
		if r.State != want[r.InstanceID] || ids[r.State].String() != r.InstanceID {
			t.Errorf("instance %s shown %s; the database says %s", r.InstanceID, r.State, want[r.InstanceID])
		}
	}
	if first := p.Instances.Rows[0]; first.State != "zombie" || !first.Problem || first.Host != hostileHost {
		t.Errorf("first row %+v, want the zombie", first)
	}
	// One dead instance each: by name.
	if len(p.Services) != 2 || p.Services[0].Name != "billing" || p.Services[0].Counts["stale"] != 1 ||
		p.Services[1].Name != "checkout" || p.Services[1].Counts["zombie"] != 1 || p.Services[1].Dead != 1 {
		t.Errorf("services %+v", p.Services)
	}
	if len(p.Leases.Rows) != 1 || p.Leases.Rows[0].Name != hostileLease || p.Leases.Rows[0].HolderInstanceID != ids["alive"].String() ||
		p.Leases.Rows[0].HolderState != "alive" || !p.Leases.Rows[0].Held || p.Leases.Rows[0].ExpiresInSeconds < 500 {
		t.Errorf("leases %+v", p.Leases.Rows)
	}
	var app *status.AppView
	for i, a := range p.AdvisoryLocks.Applications {
		if a.Name == hostileApp {
			app = &p.AdvisoryLocks.Applications[i]
		}
		if a.Name == "checkout:alive-lock" && (a.PoolStarvationSignature || !a.AliveLockSessions) {
			t.Errorf("alive-lock sessions flagged: %+v", a)
		}
	}
	if app == nil || !app.PoolStarvationSignature || app.IdleHolders != 2 || app.Backends != 2 {
		t.Errorf("hostile app %+v in %+v", app, p.AdvisoryLocks)
	}
	if p.AdvisoryLocks.AliveLocksGranted != 2 || p.AdvisoryLocks.OtherGranted != 2 {
		t.Errorf("locks %+v", p.AdvisoryLocks)
	}
	var meta map[string]string
	if err := json.Unmarshal(p.Instances.Rows[0].Metadata, &meta); err != nil || !strings.Contains(meta["note"], "pwned=5") {
		t.Errorf("metadata %s: %v", p.Instances.Rows[0].Metadata, err)
	}
	if p.Database != db.Name || strings.Contains(body, db.Server.Password) {
		t.Errorf("database %q, or the password is in the page", p.Database)
	}
}

// The HTML escapes every hostile value and allows only its own script and style.
func TestHTMLEscapes(t *testing.T) {
	db, pool, ctx := setup(t)
	fixture(t, ctx, db, pool)
	res, body := get(t, newHandler(t, pool), "/status")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s\n%s", res.Status, body)
	}
	for _, raw := range []string{"<script>window", "<img", "<svg onload", db.Server.Password} { // the page draws with <svg> of its own
		if strings.Contains(body, raw) {
			t.Errorf("the page holds %q unescaped", raw)
		}
	}
	for _, escaped := range []string{"&lt;/td&gt;&lt;script&gt;window.pwned=1", "app&lt;script&gt;window.pwned=4",
		"&#34;&gt;&lt;svg onload=window.pwned=3&gt;", "pool starvation signature"} {
		if !strings.Contains(body, escaped) {
			t.Errorf("the page lacks %q", escaped)
		}
	}
	csp := res.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'sha256-") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
	if strings.Count(body, "<script>") != 1 {
		t.Errorf("%d script elements, want the page's own only", strings.Count(body, "<script>"))
	}
}

func TestParametersAndPaging(t *testing.T) {
	db, pool, ctx := setup(t)
	ids := fixture(t, ctx, db, pool)
	h := newHandler(t, pool)
	for _, c := range []struct{ target, word string }{
		{"/status?page=0", "page"}, {"/status?page=x", "page"}, {"/status.json?lease_page=-1", "lease_page"},
		{"/status?instance=nope", "instance"}, {"/status?refresh=99999", "refresh"},
	} {
		res, body := get(t, h, c.target)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "parameter "+c.word+":") {
			t.Errorf("%s: %s %q", c.target, res.Status, body)
		}
	}
	var p status.Page
	_, body := get(t, h, "/status.json?service=billing")
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	if p.Instances.Total != 2 || p.Instances.Rows[0].State != "stale" || len(p.Services) != 2 {
		t.Fatalf("service billing: %+v", p.Instances)
	}
	_, body = get(t, h, "/status.json?instance="+ids["zombie"].String()+"&page=2")
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	if p.Instances.Total != 1 || len(p.Instances.Rows) != 0 || p.Instances.Page != 2 {
		t.Fatalf("page 2 of one instance: %+v", p.Instances)
	}
	// The lease's holder is not on a page of one other instance: its link leads to it.
	_, body = get(t, h, "/status?instance="+ids["zombie"].String())
	if want := `href="?instance=` + ids["alive"].String() + `#i-` + ids["alive"].String() + `"`; !strings.Contains(body, want) {
		t.Errorf("no %s in the page", want)
	}
	_, body = get(t, h, "/status")
	if want := `href="#i-` + ids["alive"].String() + `"`; !strings.Contains(body, want) {
		t.Errorf("no %s in the page", want)
	}
	res, _ := get(t, h, "/status.json")
	if res.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("Cache-Control %q", res.Header.Get("Cache-Control"))
	}
}

// A database that does not answer: 503, the reason without the password, and the rest
// of the page still there.
func TestDatabaseDown(t *testing.T) {
	const pw = "s3cret-pw"
	pool, err := pgxpool.New(context.Background(), fmt.Sprintf("host=127.0.0.1 port=1 user=x password=%s dbname=x connect_timeout=2", pw))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, target := range []string{"/status", "/status.json"} {
		res, body := get(t, newHandler(t, pool), target)
		if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "cannot read instances and leases") ||
			strings.Contains(body, pw) {
			t.Errorf("%s: %s\n%s", target, res.Status, body)
		}
	}
}

// A SQL_ASCII database hands out whatever bytes were stored. Every byte of both forms is
// valid UTF-8 (the bad ones replaced by U+FFFD), the JSON form is valid JSON, and the row
// is still shown.
func TestInvalidUTF8FromSQLASCII(t *testing.T) {
	ascii := pgtest.NewSQLASCIIDB(t)
	testdb.Migrate(t, ascii.DSN, defaults.Schema)
	pool := pgtest.Pool(t, ascii.DSN, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := uuid.New()
	for _, sql := range []string{
		`INSERT INTO liveness.instances (instance_id, service_name, host_name, metadata)
		 VALUES ('` + id.String() + `', E'caf\xe9', E'node\xff', E'{"note": "caf\xe9 \xff\xfe"}')`,
		`INSERT INTO liveness.leases (name, holder, holder_host, expires_at)
		 VALUES (E'cleanup\xff', 'h:1:ff', E'node\xfe', now() + interval '1 minute')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	h := newHandler(t, pool)
	for _, target := range []string{"/status.json", "/status"} {
		res, body := get(t, h, target)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s\n%s", target, res.Status, body)
		}
		for i := 0; i < len(body); {
			r, n := utf8.DecodeRuneInString(body[i:])
			if r == utf8.RuneError && n == 1 {
				t.Errorf("%s is not valid UTF-8 at byte %d: %.40q", target, i, body[i:])
				break
			}
			i += n
		}
		for _, want := range []string{"caf\uFFFD", "node\uFFFD", "cleanup\uFFFD"} {
			if !strings.Contains(body, want) {
				t.Errorf("%s lacks %q", target, want)
			}
		}
		if target != "/status.json" {
			continue
		}
		if !json.Valid([]byte(body)) {
			t.Fatalf("%s is not valid JSON", target)
		}
		var p status.Page
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatal(err)
		}
		if len(p.Instances.Rows) != 1 || !utf8.Valid(p.Instances.Rows[0].Metadata) ||
			!strings.Contains(string(p.Instances.Rows[0].Metadata), "caf\uFFFD \uFFFD\"") {
			t.Errorf("metadata %q, want the row with its bytes replaced", p.Instances.Rows[0].Metadata)
		}
	}
}

// Every parameter is checked before any statement: a bad one is a 400 with one line
// naming it, against a healthy database (it used to be a 503 with the SQLSTATE, read as
// an outage) and against one that is down (the database is never asked). Odd but valid
// values are served.
func TestParametersCheckedBeforeAnyStatement(t *testing.T) {
	db, pool, ctx := setup(t)
	fixture(t, ctx, db, pool)
	healthy := newHandler(t, pool)
	down, err := pgxpool.New(context.Background(), "host=127.0.0.1 port=1 user=x dbname=x connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	unreachable := newHandler(t, down)
	for _, c := range []struct{ query, param string }{
		{"service=a%00b", "service"},
		{"lease=%00", "lease"},
		{"service=%FF%FE", "service"},
		{"lease=%C0%80", "lease"}, // an overlong NUL
		{"service=%zz", "service"},
		{"lease=100%", "lease"},
		{"instance=00000000-0000-0000-0000-000000000000", "instance"},
		{"instance=7b4b8f1e-8c1e-4a57-9b7e", "instance"},
		{"instance=%zz", "instance"},
		{"refresh=3601", "refresh"},
		{"refresh=-1", "refresh"},
		{"refresh=18446744074", "refresh"}, // wraps to under an hour as nanoseconds
		{"page=1000001", "page"},
		{"lease_page=0", "lease_page"},
		{"history_page=0", "history_page"},
		{"history=0", "history"},
		{"history=59s", "history"},
		{"history=169h", "history"},
		{"history=1d", "history"},
		{"service=a&service=b", "service"},
		{"servce=checkout", `"servce"`},
		{"%zz=1", `"%zz"`},
	} {
		for _, h := range []*status.Handler{healthy, unreachable} {
			for _, path := range []string{"/status.json", "/status"} {
				res, body := get(t, h, path+"?"+c.query)
				if res.StatusCode != http.StatusBadRequest || !strings.HasPrefix(body, "parameter "+c.param+":") ||
					strings.Count(strings.TrimSpace(body), "\n") != 0 {
					t.Errorf("%s?%s: %s %.200q; want 400 and one line naming parameter %s", path, c.query, res.Status, body, c.param)
				}
			}
		}
	}
	for _, query := range []string{"service=%E2%9C%93", "lease=%25", "lease=%5C", "lease=", "service=", "instance=",
		"instance={7b4b8f1e-8c1e-4a57-9b7e-3f0a2e5c9d11}", "service=checkout&page=2&refresh=0", "lease=a;b",
		"history=1m", "history=168h", "history=1h30m"} {
		if res, body := get(t, healthy, "/status.json?"+query); res.StatusCode != http.StatusOK {
			t.Errorf("/status.json?%s: %s %.200q; want 200", query, res.Status, body)
		}
	}
}

// countingDB is the real pool, counting the statements the page sends and how many are
// open at once (until their rows are closed).
type countingDB struct {
	db                           liveness.Querier
	calls, inFlight, maxInFlight atomic.Int64
}

type countedRows struct {
	pgx.Rows
	db   *countingDB
	once sync.Once
}

func (r *countedRows) Close() {
	r.Rows.Close()
	r.once.Do(func() { r.db.inFlight.Add(-1) })
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.calls.Add(1)
	n := c.inFlight.Add(1)
	for m := c.maxInFlight.Load(); n > m && !c.maxInFlight.CompareAndSwap(m, n); m = c.maxInFlight.Load() {
	}
	rows, err := c.db.Query(ctx, sql, args...)
	if err != nil {
		c.inFlight.Add(-1)
		return nil, err
	}
	return &countedRows{Rows: rows, db: c}, nil
}

func countingHandler(t *testing.T, pool *pgxpool.Pool) (*status.Handler, *countingDB) {
	t.Helper()
	db := &countingDB{db: pool}
	h, err := status.New(status.Config{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	return h, db
}

// concurrently sends n requests at once, target(i) each, and returns their status codes.
func concurrently(t *testing.T, h http.Handler, n int, target func(i int) string) []*http.Response {
	t.Helper()
	out := make([]*http.Response, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target(i), nil))
			out[i] = rec.Result()
		})
	}
	close(start)
	wg.Wait()
	return out
}

// Identical requests at once share one evaluation (the page's three statements, once),
// and distinct ones read the database one at a time: the page never holds more than one
// of the pool's connections, whatever its load.
func TestPageEvaluationsShareAndQueue(t *testing.T) {
	db, pool, ctx := setup(t)
	fixture(t, ctx, db, pool)
	h, counted := countingHandler(t, pool)
	for _, res := range concurrently(t, h, 50, func(int) string { return "/status.json" }) {
		if res.StatusCode != http.StatusOK {
			t.Fatalf("an identical request: %s", res.Status)
		}
	}
	if n := counted.calls.Load(); n != 3 {
		t.Errorf("50 identical requests sent %d statements, want the one evaluation's 3", n)
	}
	h, counted = countingHandler(t, pool)
	for _, res := range concurrently(t, h, 30, func(i int) string { return fmt.Sprintf("/status?page=%d", i+1) }) {
		if res.StatusCode != http.StatusOK {
			t.Fatalf("a distinct request: %s", res.Status)
		}
	}
	if n, most := counted.calls.Load(), counted.maxInFlight.Load(); n != 90 || most != 1 {
		t.Errorf("30 distinct requests: %d statements, at most %d at once; want 90, one at a time", n, most)
	}
}

// lockInstances holds an ACCESS EXCLUSIVE lock on the instances table in a session of its
// own until the returned function rolls it back: every read of the page waits on it.
func lockInstances(t *testing.T, ctx context.Context, db *pgtest.DB) (release func()) {
	t.Helper()
	tx, err := db.Conn(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE liveness.instances IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// When the page cannot get its turn because the database blocks the read ahead of it
// (another session holds a lock on the instances table), the requests that waited for
// the database get 503 with Retry-After and that reason, and the database is not asked
// for them; the requests beyond the page's own share get 429 with Retry-After, without
// asking it either. Once the lock goes, the page answers again.
func TestPageWaitingOnTheDatabaseIs503AndOverItsShare429(t *testing.T) {
	db, pool, ctx := setup(t)
	fixture(t, ctx, db, pool)
	h, counted := countingHandler(t, pool)
	release := lockInstances(t, ctx, db)
	// The lock is released once 99 answers are in: the waiters gave up by then.
	results := make(chan *http.Response, 100)
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			path := "/status.json"
			if i%2 == 1 {
				path = "/status"
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, fmt.Sprintf("%s?page=%d", path, i+1), nil))
			results <- rec.Result()
		})
	}
	var res []*http.Response
	for len(res) < 99 {
		res = append(res, <-results)
	}
	release()
	wg.Wait()
	res = append(res, <-results)
	codes := map[int]int{}
	for _, r := range res {
		codes[r.StatusCode]++
		b, _ := io.ReadAll(r.Body)
		want := map[int][]string{
			http.StatusTooManyRequests:    {"busy", "database was not asked"},
			http.StatusServiceUnavailable: {"the database is slow to answer", "a lock on the instances table", "not asked again"},
		}[r.StatusCode]
		if want == nil {
			continue
		}
		if r.Header.Get("Retry-After") != "1" {
			t.Errorf("%d without Retry-After: 1: %v", r.StatusCode, r.Header)
		}
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%d body %q, want %q", r.StatusCode, b, w)
			}
		}
		// The HTML answer reloads itself, so that a screen showing the page goes on.
		if isHTML := strings.HasPrefix(r.Header.Get("Content-Type"), "text/html"); isHTML &&
			!strings.Contains(string(b), `<meta http-equiv="refresh" content="1">`) {
			t.Errorf("an HTML %d that does not reload itself: %q", r.StatusCode, b)
		}
	}
	// One evaluation got the database and waited for the lock; the admitted others waited
	// their 3 s for the database (503), the rest were not admitted (429).
	if codes[http.StatusOK] != 1 || codes[http.StatusServiceUnavailable] == 0 ||
		codes[http.StatusServiceUnavailable]+codes[http.StatusTooManyRequests] != 99 {
		t.Errorf("answers %v; want one 200 (the read that waited for the lock), 503s for those that waited for it and 429s for the rest", codes)
	}
	if n := counted.calls.Load(); n != 3 {
		t.Errorf("%d statements sent, want the one evaluation's 3", n)
	}
	if r, body := get(t, h, "/status.json?page=1000"); r.StatusCode != http.StatusOK {
		t.Errorf("after the lock: %s %.200q", r.Status, body)
	}
}

// A read that waits on a locked instances table for its whole time (10 s) is answered 503
// with the page and the reason, for every request that shared it, in every form: never a
// 429 saying the database was not asked, because the request's own time ran out while
// the database kept it waiting.
func TestPageReadTimingOutIs503WithTheReason(t *testing.T) {
	db, pool, ctx := setup(t)
	fixture(t, ctx, db, pool)
	h, counted := countingHandler(t, pool)
	release := lockInstances(t, ctx, db)
	defer release()
	// One evaluation (the query is the same), rendered in four forms, each asked twice.
	targets := []string{"/status.json", "/status", "/status?refresh=1", "/status?refresh=0"}
	for i, res := range concurrently(t, h, 8, func(i int) string { return targets[i%len(targets)] }) {
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "did not answer within 10s") {
			t.Errorf("%s with the instances table locked: %s, want 503 saying the database did not answer within 10s: %.300s", targets[i%len(targets)], res.Status, b)
		}
	}
	if n := counted.calls.Load(); n != 1 {
		t.Errorf("%d statements sent, want the one evaluation's read_fleet", n)
	}
}

// 10 KB service, host and lease names are shortened in the HTML tables, with the whole
// value behind each in a details element (or a link's title); they are never shown whole
// as text, and the JSON form has them whole.
func TestLongValuesShortenedInHTML(t *testing.T) {
	_, pool, ctx := setup(t)
	service, host, lease := "svc-"+strings.Repeat("s", 10000), "host-"+strings.Repeat("h", 10000), "lease-"+strings.Repeat("l", 10000)
	meta := `{"note": "` + strings.Repeat("m", 10000) + `"}`
	if _, err := pool.Exec(ctx, `INSERT INTO liveness.instances (instance_id, service_name, host_name, metadata)
		VALUES (gen_random_uuid(), $1, $2, $3)`, service, host, meta); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO liveness.leases (name, holder, holder_host, expires_at)
		VALUES ($1, 'x', $2, now() + interval '1 minute')`, lease, host); err != nil {
		t.Fatal(err)
	}
	h := newHandler(t, pool)
	for name, target := range map[string]string{
		"/status":                       "/status",
		"/status filtered by the names": "/status?service=" + url.QueryEscape(service) + "&lease=" + url.QueryEscape(lease),
	} {
		res, body := get(t, h, target)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", name, res.Status)
		}
		for _, long := range []string{service, host, lease, html.EscapeString(meta)} {
			whole := 0
			for i := 0; ; {
				j := strings.Index(body[i:], long)
				if j < 0 {
					break
				}
				at := i + j
				inTag := strings.LastIndexByte(body[:at], '<') > strings.LastIndexByte(body[:at], '>') // an attribute
				switch {
				case strings.HasSuffix(body[:at], `<span class="full">`):
					whole++
				case !inTag:
					t.Errorf("%s: %.20s… shown whole as text, after %.60q", name, long, body[max(at-60, 0):at])
				}
				i = at + len(long)
			}
			if whole == 0 {
				t.Errorf("%s: %.20s… is not available whole in a details element", name, long)
			}
			limit := maxShown(long)
			if summary := "<summary>" + string([]rune(html.UnescapeString(long))[:limit]); !strings.Contains(html.UnescapeString(body), summary+"…</summary>") {
				t.Errorf("%s: no summary of the first %d characters of %.20s…", name, limit, long)
			}
		}
	}
	_, body := get(t, h, "/status.json")
	for _, long := range []string{service, host, lease} {
		if !strings.Contains(body, `"`+long+`"`) {
			t.Errorf("/status.json lacks %.20s… whole", long)
		}
	}
}

// maxShown is how many characters of a value the HTML tables show: 160 of metadata, 80
// of a name.
func maxShown(s string) int {
	if strings.HasPrefix(s, "{") {
		return 160
	}
	return 80
}

type fixedAgent liveness.AgentSnapshot

func (a fixedAgent) Snapshot() liveness.AgentSnapshot { return liveness.AgentSnapshot(a) }

type fixedNodeAgent nodeagent.Snapshot

func (n fixedNodeAgent) Snapshot() nodeagent.Snapshot { return nodeagent.Snapshot(n) }

// The page shows the agent's shard sets and the node agent it runs: the processes
// attached and the locks held, in both forms.
func TestPageShowsShardsAndTheNodeAgent(t *testing.T) {
	_, pool, _ := setup(t)
	h, err := status.New(status.Config{DB: pool,
		Agent: fixedAgent{InstanceID: uuid.New(), ServiceName: "svc", Mode: liveness.ModeAdvisoryLockWhenAvailable,
			Shards: []liveness.ShardSetStats{{Set: "orders", Members: 4, Shards: 64, Owned: 16, Acquired: 20, Released: 4}}},
		NodeAgent: fixedNodeAgent{Socket: "/run/pg-liveness/agent.sock", ListenAddress: "[::]:9817", SessionUp: true, Listening: true,
			Attached: 12, LocksHeld: 11}})
	if err != nil {
		t.Fatal(err)
	}
	_, body := get(t, h, "/status.json")
	var p status.Page
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	if p.NodeAgent == nil || p.NodeAgent.Attached != 12 || p.NodeAgent.LocksHeld != 11 || !p.NodeAgent.SessionUp ||
		p.NodeAgent.ListenAddress != "[::]:9817" {
		t.Errorf("node agent in the JSON: %+v", p.NodeAgent)
	}
	if p.Agent == nil || len(p.Agent.Shards) != 1 || p.Agent.Shards[0].Owned != 16 || p.Agent.Shards[0].Members != 4 {
		t.Errorf("shard sets in the JSON: %+v", p.Agent)
	}
	_, page := get(t, h, "/status")
	for _, want := range []string{`id="node-agent-attached">12, 11 alive locks held`, `: owns 16 of 64, 4 members`,
		`id="node-agent-tcp"><code>[::]:9817</code>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
}
