package main

// The databases discovery finds beyond /metrics, against a real server: each has its
// status page, linked from /targets, on the pool its scrapes use; unknown path parts are
// 404 naming them; --discover.max-series keeps whole databases in label order and says
// what it dropped; a SIGHUP starts, changes and stops discovery.

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// getStatus GETs path and returns the status code and body.
func (p *exporterProc) getStatus(t testing.TB, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// discoverConfig writes --config.file: credentials c (the server's superuser, with a
// wrong password when wrong), then the discover entries and the targets given.
func discoverConfig(t *testing.T, dir string, s *pgtest.Server, wrong bool, discover, targets string) string {
	t.Helper()
	pw := s.Password
	if wrong {
		pw = "not-" + pw
	}
	pwFile := writeFile(t, dir, "pw", pw+"\n")
	b := fmt.Sprintf("credentials:\n  c: {user: %s, password_file: %s, sslmode: disable}\n", pgtest.Superuser, pwFile)
	if discover != "" {
		b += "discover:\n" + discover
	}
	if targets != "" {
		b += "targets:\n" + targets
	}
	return writeFile(t, dir, "targets.yml", b)
}

// seriesOf counts the samples in body labelled database="label".
func seriesOf(body, label string) int {
	return strings.Count(body, `database="`+label+`"`)
}

// probeConns counts the exporter's probe connections to database db, as the server sees them.
func probeConns(t *testing.T, on *pgtest.DB, db string) int {
	return on.QueryInt(t, `SELECT count(*)::int FROM pg_stat_activity WHERE datname = $1 AND application_name = 'pg_liveness_exporter:probe'`, db)
}

func TestDiscoveredDatabasesHaveStatusPages(t *testing.T) {
	t.Parallel()
	s := pgtest.NewServer(t)
	a, b := pgtest.NewDBOn(t, s), pgtest.NewDBOn(t, s)
	seedService(t, a, "svc-a")
	seedService(t, b, "svc-b")
	// Databases whose names a path takes for something else: a '/', a '%', '?' and '#',
	// the current and the parent folder, and the '~' their links are written with. Each
	// is a copy of the first, migrated, with a service of its own.
	hostile := []string{"with/slash", ".", "..", "100%", "a?b#c", "~tilde", "~."}
	if err := s.Exec(context.Background(), `CREATE DATABASE "`+hostile[0]+`"`); err != nil {
		t.Fatal(err)
	}
	testdb.Migrate(t, s.DSN(hostile[0]), "liveness")
	for _, name := range hostile[1:] {
		if err := s.Exec(context.Background(), `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()+` TEMPLATE "`+hostile[0]+`"`); err != nil {
			t.Fatal(err)
		}
	}
	for i, name := range hostile {
		if _, err := pgtest.Pool(t, s.DSN("'"+name+"'"), 1).Exec(context.Background(),
			`INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at) VALUES (gen_random_uuid(), $1, now())`, fmt.Sprintf("svc-hostile-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	// A target named like the discover entry: its page has one path segment less.
	cfg := discoverConfig(t, dir, s, false, "  s1: {host: 127.0.0.1, port: "+strconv.Itoa(s.Port)+", credentials: c, interval: 1s}\n",
		"  s1: {host: 127.0.0.1, port: "+strconv.Itoa(s.Port)+", database: "+b.Name+", credentials: c}\n")
	p := startExporter(t, nil, "--no-agent", "--config.file="+cfg, "--probe.max-conns=8", "--probe.max-conns-per-target=2")
	testutil.Eventually(t, 30*time.Second, "every database found", func() bool {
		body, _ := p.metrics(t, "5")
		for _, name := range append([]string{a.Name, b.Name}, hostile...) {
			if upOf(body, "s1/"+name) != "1" {
				return false
			}
		}
		return true
	})

	// /targets links each database found to its page, and each page is its own
	// database's, in both forms, followed as the link is written (the client sends the
	// path as it is) through the real server.
	list := p.get(t, "/targets")
	pages := []struct{ db, own string }{{a.Name, "svc-a"}, {b.Name, "svc-b"}}
	for i, name := range hostile {
		pages = append(pages, struct{ db, own string }{name, fmt.Sprintf("svc-hostile-%d", i)})
	}
	for _, c := range pages {
		m := regexp.MustCompile(`<a href="([^"]*)">` + regexp.QuoteMeta(html.EscapeString("s1/"+c.db)) + `</a>`).FindStringSubmatch(list)
		if m == nil {
			t.Errorf("/targets has no link for s1/%s:\n%s", c.db, list)
			continue
		}
		link := html.UnescapeString(m[1])
		// A browser removes a segment that reads as the current or the parent folder
		// ("." or "..", %2E or %2e for a dot) before it sends the request.
		for seg := range strings.SplitSeq(strings.ToLower(link), "/") {
			if seg = strings.ReplaceAll(seg, "%2e", "."); seg == "." || seg == ".." {
				t.Errorf("s1/%s: the link %s has a dot segment, which a browser would remove", c.db, link)
			}
		}
		for _, suffix := range []string{"status", "status.json"} {
			path := strings.TrimSuffix(link, "status") + suffix
			code, body := p.getStatus(t, path)
			if code != http.StatusOK || !strings.Contains(body, c.own) {
				t.Errorf("%s (s1/%s): %d, want 200 with %s:\n%.300s", path, c.db, code, c.own, body)
			}
			for _, other := range pages {
				if other.own != c.own && strings.Contains(body, `"`+other.own+`"`) {
					t.Errorf("%s (s1/%s) shows %s, another database's", path, c.db, other.own)
				}
			}
		}
	}
	// The named target of the same name keeps its page.
	if code, body := p.getStatus(t, "/targets/s1/status.json"); code != http.StatusOK || !strings.Contains(body, "svc-b") || strings.Contains(body, "svc-a") {
		t.Errorf("/targets/s1/status.json (the target): %d:\n%s", code, body)
	}
	// Unknown parts: 404 naming the part, never a 5xx.
	for path, want := range map[string]string{
		"/targets/nope/" + a.Name + "/status": `"nope" is no discover entry`,
		"/targets/s1/nope/status.json":        `database "nope" is not one that discover entry "s1" found`,
		"/targets/s1/postgres/status":         `database "postgres" is not one`, // on the server, without the schema
		"/targets/nope/status":                `"nope" is no target`,
	} {
		if code, body := p.getStatus(t, path); code != http.StatusNotFound || !strings.Contains(body, want) {
			t.Errorf("%s: %d %q, want 404 with %q", path, code, body, want)
		}
	}
	// Pages read on the database's own pool (a's: the target is b): many requests
	// (distinct, so none is served from the one-second cache) hold no more connections
	// than its pool may.
	for i := range 20 {
		if code, body := p.getStatus(t, fmt.Sprintf("/targets/s1/%s/status.json?refresh=%d", a.Name, i+1)); code != http.StatusOK {
			t.Fatalf("page %d: %d %s", i, code, body)
		}
	}
	if n := probeConns(t, b, a.Name); n > 2 {
		t.Errorf("%d connections to %s after 20 page requests, over --probe.max-conns-per-target=2: a pool per request", n, a.Name)
	}
}

func TestDiscoverMaxSeriesKeepsWholeDatabasesInOrder(t *testing.T) {
	t.Parallel()
	s := pgtest.NewServer(t)
	dbs := []*pgtest.DB{pgtest.NewDBOn(t, s), pgtest.NewDBOn(t, s), pgtest.NewDBOn(t, s)}
	slices.SortFunc(dbs, func(a, b *pgtest.DB) int { return strings.Compare(a.Name, b.Name) })
	labels := make([]string, len(dbs))
	for i, d := range dbs {
		labels[i] = "s1/" + d.Name
		seedService(t, d, "svc-"+d.Name)
		// Smaller by label order, so that a cap that went on to a later, smaller database
		// after one that did not fit would show.
		for j := range (len(dbs) - 1 - i) * 5 {
			d.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at) VALUES (gen_random_uuid(), $1, now())`, fmt.Sprintf("extra-%d", j))
		}
	}
	cfg := discoverConfig(t, t.TempDir(), s, false, "  s1: {host: 127.0.0.1, port: "+strconv.Itoa(s.Port)+", credentials: c, interval: 1s}\n", "")

	// Uncapped (the default): every database whole; that measures each one's series.
	// Without the advisory-locks collector: its series count the exporter's own
	// connections, idle or not at that moment, so a database's size would vary.
	p := startExporter(t, nil, "--no-agent", "--config.file="+cfg, "--no-collector.advisory_locks")
	var body string
	sizes := make([]int, len(labels))
	testutil.Eventually(t, 30*time.Second, "every database found, its series the same in two scrapes", func() bool {
		body, _ = p.metrics(t, "5")
		if upOf(body, labels[0]) != "1" || upOf(body, labels[1]) != "1" || upOf(body, labels[2]) != "1" {
			return false
		}
		same := true
		for i, l := range labels {
			n := seriesOf(body, l)
			same = same && n == sizes[i]
			sizes[i] = n
		}
		return same
	})
	if v := metricValue(t, body, `pg_liveness_exporter_discover_databases_dropped{reason="max_series"}`); v != 0 {
		t.Errorf("dropped %v databases under the default cap", v)
	}
	if got := metricValue(t, body, "pg_liveness_exporter_discover_series"); int(got) != sizes[0]+sizes[1]+sizes[2] {
		t.Errorf("pg_liveness_exporter_discover_series %v, want %d (%v)", got, sizes[0]+sizes[1]+sizes[2], sizes)
	}
	p.Stop(10 * time.Second)

	// Capped one short of all three, then where the first and the third would fit but not
	// the second: the databases from the first that does not fit on keep only their own
	// gauges.
	if sizes[1] <= sizes[2] {
		t.Fatalf("the second database is not larger than the third: %v", sizes)
	}
	for _, c := range []struct {
		max  int
		kept int
	}{{sizes[0] + sizes[1] + sizes[2] - 1, 2}, {sizes[0] + sizes[2], 1}} {
		p := startExporter(t, nil, "--no-agent", "--config.file="+cfg, "--no-collector.advisory_locks", "--discover.max-series="+strconv.Itoa(c.max))
		testutil.Eventually(t, 30*time.Second, "every database found, the first whole", func() bool {
			body, _ = p.metrics(t, "5")
			return upOf(body, labels[0]) == "1" && upOf(body, labels[1]) == "1" && upOf(body, labels[2]) == "1" && seriesOf(body, labels[0]) == sizes[0]
		})
		for round := range 3 { // the same answer every scrape, logged once
			body, _ = p.metrics(t, "5")
			kept := 0
			for i, l := range labels {
				whole := regexp.MustCompile(`pg_liveness_instances\{database="` + regexp.QuoteMeta(l) + `"`).MatchString(body)
				success := regexp.MustCompile(`pg_liveness_scrape_collector_success\{database="` + regexp.QuoteMeta(l) + `",collector="instances"\} 1`).MatchString(body)
				if whole != (i < c.kept) || !success {
					t.Errorf("max %d, round %d: %s whole %v (want %v), its scrape gauges %v:\n%s", c.max, round, l, whole, i < c.kept, success, body)
				}
				if whole {
					kept += sizes[i]
					if n := seriesOf(body, l); n != sizes[i] {
						t.Errorf("max %d: %s kept with %d series, not its %d", c.max, l, n, sizes[i])
					}
				}
			}
			if v := metricValue(t, body, `pg_liveness_exporter_discover_databases_dropped{reason="max_series"}`); int(v) != len(labels)-c.kept {
				t.Errorf("max %d: %v databases dropped, want %d", c.max, v, len(labels)-c.kept)
			}
			if v := metricValue(t, body, "pg_liveness_exporter_discover_series"); int(v) != kept || int(v) > c.max {
				t.Errorf("max %d: pg_liveness_exporter_discover_series %v, want %d", c.max, v, kept)
			}
			if v := metricValue(t, body, "pg_liveness_exporter_discover_series_dropped"); v <= 0 {
				t.Errorf("max %d: pg_liveness_exporter_discover_series_dropped %v", c.max, v)
			}
		}
		if n := len(regexp.MustCompile(`level=WARN .*exceed --discover.max-series`).FindAllString(p.Logs(), -1)); n != 1 {
			t.Errorf("max %d: the drop logged %d times over 4 or more scrapes, want once:\n%s", c.max, n, p.Logs())
		}
		list := p.get(t, "/targets")
		if !strings.Contains(list, fmt.Sprintf("%d of them over <code>--discover.max-series</code>", len(labels)-c.kept)) ||
			strings.Count(list, "(series dropped") != len(labels)-c.kept {
			t.Errorf("max %d: /targets does not show the databases dropped:\n%s", c.max, list)
		}
		p.Stop(10 * time.Second)
	}
}

func TestSIGHUPStartsChangesAndStopsDiscovery(t *testing.T) {
	t.Parallel()
	s := pgtest.NewServer(t)
	a, b := pgtest.NewDBOn(t, s), pgtest.NewDBOn(t, s)
	seedService(t, a, "svc-a")
	seedService(t, b, "svc-b")
	dir := t.TempDir()
	target := "  t: {host: 127.0.0.1, port: " + strconv.Itoa(s.Port) + ", database: " + a.Name + ", credentials: c}\n"
	entry := func(interval string) string {
		return "  s1: {host: 127.0.0.1, port: " + strconv.Itoa(s.Port) + ", credentials: c, interval: " + interval + "}\n"
	}
	cfg := discoverConfig(t, dir, s, false, "", target)
	p := startExporter(t, nil, "--no-agent", "--config.file="+cfg, "--probe.max-conns=8")
	testutil.Eventually(t, 15*time.Second, "the exporter serving", func() bool {
		code, _, _ := p.probe(t, "target=t", "5")
		return code == http.StatusOK
	})
	if body, _ := p.metrics(t, "5"); strings.Contains(body, `database="s1/`) {
		t.Fatalf("databases on /metrics before any discover entry:\n%s", body)
	}

	// Added: the first entry starts discovery.
	discoverConfig(t, dir, s, false, entry("1h"), target)
	p.signal(t, syscall.SIGHUP)
	testutil.Eventually(t, 30*time.Second, "the databases found after the SIGHUP that added the entry", func() bool {
		body, _ := p.metrics(t, "5")
		return upOf(body, "s1/"+a.Name) == "1" && upOf(body, "s1/"+b.Name) == "1"
	})

	// A file with a mistake is refused: what runs stays.
	writeFile(t, dir, "targets.yml", "discover:\n  s1: {host: 127.0.0.1, port: nope}\n")
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, "refused --config.file")
	if body, _ := p.metrics(t, "5"); upOf(body, "s1/"+a.Name) != "1" {
		t.Fatalf("the refused file changed what runs:\n%s", body)
	}

	// Changed credentials (a wrong password) apply: the databases stay listed, down.
	// The interval is an hour: only the change itself can have re-checked the entry.
	before := strings.Count(p.Logs(), "cannot list the server's databases")
	discoverConfig(t, dir, s, true, entry("1h"), target)
	p.signal(t, syscall.SIGHUP)
	testutil.Eventually(t, 30*time.Second, "the databases down with the wrong password", func() bool {
		body, _ := p.metrics(t, "5")
		return upOf(body, "s1/"+a.Name) == "0" && upOf(body, "s1/"+b.Name) == "0"
	})
	waitLogCount(t, p, "cannot list the server's databases", before+1) // re-checked at once, not in an hour
	// A database created now is found by the re-check the next change brings.
	late := pgtest.NewDBOn(t, s)
	seedService(t, late, "svc-late")
	discoverConfig(t, dir, s, false, entry("2h"), target)
	p.signal(t, syscall.SIGHUP)
	testutil.Eventually(t, 30*time.Second, "up again with the right password, and the new database found", func() bool {
		body, _ := p.metrics(t, "5")
		return upOf(body, "s1/"+a.Name) == "1" && upOf(body, "s1/"+late.Name) == "1"
	})

	// Removed, the last entry: discovery stops, its databases and their pools go.
	discoverConfig(t, dir, s, false, "", target)
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, "discovery stopped")
	if body, _ := p.metrics(t, "5"); strings.Contains(body, `database="s1/`) {
		t.Errorf("databases on /metrics after their entry was removed:\n%s", body)
	}
	if code, _ := p.getStatus(t, "/targets/s1/"+b.Name+"/status"); code != http.StatusNotFound {
		t.Errorf("the page of a database of a removed entry: %d, want 404", code)
	}
	testutil.Eventually(t, 15*time.Second, "the removed entry's pools closed", func() bool {
		return probeConns(t, a, b.Name) == 0 && probeConns(t, a, late.Name) == 0
	})
	// And back: it starts again.
	discoverConfig(t, dir, s, false, entry("1s"), target)
	p.signal(t, syscall.SIGHUP)
	testutil.Eventually(t, 30*time.Second, "the databases found again", func() bool {
		body, _ := p.metrics(t, "5")
		return upOf(body, "s1/"+b.Name) == "1"
	})
	if n := strings.Count(p.Logs(), "discovery started"); n != 2 {
		t.Errorf("discovery started %d times, want 2 (each SIGHUP that brought a first entry)", n)
	}
}
