package main

// Discovery within a server against two real servers: each server's databases that hold
// the schema are found at start and exported on /metrics with their database label,
// those without it are not; a database created after start is found by a re-check, a
// dropped one goes; a SIGHUP that removes a server's entry removes its databases, and
// one that restores it brings them back; with one server stopped the other's databases answer within the
// scrape's deadline, and the stopped one's stay listed with pg_liveness_up 0; with it
// hung, the other's still answer up in the same scrape, sent at its deadline.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// metrics GETs /metrics with the scrape timeout header, returning the body and how long
// it took.
func (p *exporterProc) metrics(t testing.TB, timeout string) (string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/metrics", nil)
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", timeout)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error(), time.Since(start)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), time.Since(start)
}

// get GETs path and returns the body.
func (p *exporterProc) get(t testing.TB, path string) string {
	t.Helper()
	_, body := p.getStatus(t, path)
	return body
}

// upOf is the database's pg_liveness_up in body, "" when it has none.
func upOf(body, database string) string {
	m := regexp.MustCompile(`(?m)^pg_liveness_up\{database="` + regexp.QuoteMeta(database) + `"\} (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return m[1]
}

func TestDiscoveryWatchesEveryDatabaseWithTheSchema(t *testing.T) {
	t.Parallel()
	s1, s2 := pgtest.NewServer(t), pgtest.NewServer(t)
	type db struct {
		srv    string
		d      *pgtest.DB
		schema bool
	}
	var dbs []db
	for _, c := range []struct {
		srv    string
		s      *pgtest.Server
		schema bool
	}{{"s1", s1, true}, {"s1", s1, true}, {"s1", s1, false}, {"s2", s2, true}, {"s2", s2, false}} {
		d := db{c.srv, pgtest.NewDBOn(t, c.s), c.schema}
		if c.schema {
			seedService(t, d.d, "svc-"+d.d.Name)
		}
		dbs = append(dbs, d)
	}
	label := func(d db) string { return d.srv + "/" + d.d.Name }
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("credentials:\n")
	for i, s := range []*pgtest.Server{s1, s2} {
		pw := writeFile(t, dir, fmt.Sprintf("pw-%d", i+1), s.Password+"\n")
		fmt.Fprintf(&b, "  c%d: {user: %s, password_file: %s, sslmode: disable}\n", i+1, pgtest.Superuser, pw)
	}
	fmt.Fprintf(&b, "discover:\n  s1: {host: 127.0.0.1, port: %d, credentials: c1, interval: 1s}\n", s1.Port)
	withoutS2 := b.String()
	fmt.Fprintf(&b, "  s2: {host: 127.0.0.1, port: %d, credentials: c2, interval: 1s}\n", s2.Port)
	withS2 := b.String()
	cfg := writeFile(t, dir, "targets.yml", withS2)
	p := startExporter(t, nil, "--no-agent", "--config.file="+cfg, "--probe.max-conns=12", "--probe.max-conns-per-target=2")

	// Found at start: the databases with the schema, each with its own instance under its
	// database label; not those without it, nor the maintenance database.
	var body string
	testutil.Eventually(t, 30*time.Second, "the databases with the schema found", func() bool {
		body, _ = p.metrics(t, "5")
		for _, d := range dbs {
			if d.schema && upOf(body, label(d)) != "1" {
				return false
			}
		}
		return true
	})
	for _, d := range dbs {
		if !d.schema && strings.Contains(body, label(d)) {
			t.Errorf("%s has no schema but is exported:\n%s", label(d), body)
		}
		if d.schema && !regexp.MustCompile(`\{[^}]*database="`+regexp.QuoteMeta(label(d))+`"[^}]*service="svc-`+d.d.Name+`"`).MatchString(body) {
			t.Errorf("%s: its service is not exported with its database label:\n%s", label(d), body)
		}
		for _, other := range dbs {
			if other != d && regexp.MustCompile(`database="`+regexp.QuoteMeta(label(d))+`"[^}]*service="svc-`+other.d.Name+`"`).MatchString(body) {
				t.Errorf("%s shows %s's service", label(d), other.d.Name)
			}
		}
	}
	if strings.Contains(body, `database="s1/postgres"`) {
		t.Errorf("the maintenance database, without the schema, is exported")
	}
	// /targets lists the databases found, and only those.
	page := p.get(t, "/targets")
	for _, d := range dbs {
		if listed := strings.Contains(page, ">"+label(d)+"</a>"); listed != d.schema {
			t.Errorf("/targets lists %s: %v, want %v:\n%s", label(d), listed, d.schema, page)
		}
	}

	// A database created after start is found by a re-check; a dropped one goes.
	late := pgtest.NewDBOn(t, s1)
	seedService(t, late, "svc-late")
	if err := s1.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{dbs[1].d.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the new database found and the dropped one gone", func() bool {
		body, _ = p.metrics(t, "5")
		return upOf(body, "s1/"+late.Name) == "1" && !strings.Contains(body, label(dbs[1]))
	})

	// SIGHUP with s2's entry gone: its databases leave /metrics; with it back, return.
	writeFile(t, dir, "targets.yml", withoutS2)
	p.signal(t, syscall.SIGHUP)
	testutil.Eventually(t, 30*time.Second, "server 2's databases gone after SIGHUP", func() bool {
		body, _ = p.metrics(t, "5")
		return !strings.Contains(body, `database="s2/`) && upOf(body, label(dbs[0])) == "1"
	})
	writeFile(t, dir, "targets.yml", withS2)
	p.signal(t, syscall.SIGHUP)
	testutil.Eventually(t, 30*time.Second, "server 2's database back after SIGHUP", func() bool {
		body, _ = p.metrics(t, "5")
		return upOf(body, label(dbs[3])) == "1"
	})

	// s2 stops: s1's databases answer within the deadline (5 s less the 0.5 s offset),
	// s2's stay listed, down.
	s2.Stop()
	for round := range 3 {
		body, took := p.metrics(t, "5")
		if took >= 4500*time.Millisecond {
			t.Errorf("round %d, server 2 stopped: /metrics took %s, the whole deadline", round, took)
		}
		if upOf(body, label(dbs[0])) != "1" || upOf(body, "s1/"+late.Name) != "1" || upOf(body, label(dbs[3])) != "0" {
			t.Fatalf("round %d, server 2 stopped: want s1's databases up and s2's down:\n%s", round, body)
		}
	}

	// s2 comes back, then s1 hangs (every process stopped): s1's databases, scraped
	// first, take the whole deadline (3 s less the offset), and s2's still answer in that
	// same scrape, up, with the answer sent at the deadline, not after it.
	if err := s2.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "server 2's database up again", func() bool {
		body, _ := p.metrics(t, "5")
		return upOf(body, label(dbs[3])) == "1"
	})
	hang(t, s1)
	for round := range 2 {
		body, took := p.metrics(t, "3")
		if upOf(body, label(dbs[0])) != "0" || upOf(body, "s1/"+late.Name) != "0" || upOf(body, label(dbs[3])) != "1" {
			t.Fatalf("round %d, server 1 hung: want s1's databases down and s2's up:\n%s", round, body)
		}
		// Generous for a loaded machine, and still under two deadlines.
		if took > 4*time.Second {
			t.Errorf("round %d, server 1 hung: /metrics took %s", round, took)
		}
	}
	m, _ := p.metrics(t, "5")
	conns := regexp.MustCompile(`(?m)^pg_liveness_exporter_probe_connections (\d+)$`).FindStringSubmatch(m)
	if conns == nil {
		t.Fatalf("no pg_liveness_exporter_probe_connections:\n%s", m)
	}
	if n, _ := strconv.Atoi(conns[1]); n > 12 {
		t.Errorf("the pools hold %d connections, over --probe.max-conns=12", n)
	}
	for _, s := range []*pgtest.Server{s1, s2} {
		if strings.Contains(p.Logs(), s.Password) || strings.Contains(m, s.Password) {
			t.Errorf("a password is in the log or the metrics")
		}
	}
}

// A discovered database that is dropped, no longer accepts connections or may no longer
// be connected to reports pg_liveness_up 0 with the reason, although its server answers
// the shared read of pg_locks (its part of it, empty, needs no statement of its own): the
// server answering is not the database answering. A database beside them stays up, and
// the two that still exist stay listed, down, through the re-checks.
func TestDiscoveredDatabaseThatRefusesConnectionsIsDown(t *testing.T) {
	t.Parallel()
	s := pgtest.NewServer(t)
	const pw = "watcher-pw"
	ctx := context.Background()
	if err := s.Exec(ctx, `CREATE ROLE watcher LOGIN PASSWORD '`+pw+`'; GRANT pg_read_all_stats TO watcher`); err != nil {
		t.Fatal(err)
	}
	names := map[string]*pgtest.DB{}
	for _, name := range []string{"ok", "dropped", "closed", "revoked"} {
		d := pgtest.NewDBOn(t, s)
		seedService(t, d, "svc-"+name)
		d.Exec(t, `GRANT USAGE ON SCHEMA liveness TO watcher;
			GRANT SELECT ON liveness.instances, liveness.leases, liveness.schema_migrations,
			                liveness.instance_alive_locks, liveness.bigint_advisory_locks TO watcher`)
		names[name] = d
	}
	label := func(name string) string { return "s/" + names[name].Name }
	dir := t.TempDir()
	cfg := writeFile(t, dir, "targets.yml", fmt.Sprintf("credentials:\n  w: {user: watcher, password_file: %s, sslmode: disable}\n"+
		"discover:\n  s: {host: 127.0.0.1, port: %d, credentials: w, interval: 1s}\n", writeFile(t, dir, "pw", pw+"\n"), s.Port))
	p := startExporter(t, nil, "--no-agent", "--config.file="+cfg)
	testutil.Eventually(t, 30*time.Second, "the four databases up", func() bool {
		body, _ := p.metrics(t, "5")
		for name := range names {
			if upOf(body, label(name)) != "1" {
				return false
			}
		}
		return true
	})

	// The sessions the exporter holds keep working after ALTER DATABASE and REVOKE: they
	// are ended, so that its next scrape has to connect.
	terminate := func(db string) string {
		return `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '` + db + `' AND pid <> pg_backend_pid()`
	}
	for _, sql := range []string{
		"DROP DATABASE " + names["dropped"].Name + " WITH (FORCE)",
		"ALTER DATABASE " + names["closed"].Name + " ALLOW_CONNECTIONS false",
		terminate(names["closed"].Name),
		"REVOKE CONNECT ON DATABASE " + names["revoked"].Name + " FROM PUBLIC",
		terminate(names["revoked"].Name),
	} {
		if err := s.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	reason := func(body, db, r string) string {
		m := regexp.MustCompile(`(?m)^pg_liveness_database_down_reason\{database="` + regexp.QuoteMeta(label(db)) + `",reason="` + r + `"\} (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			return ""
		}
		return m[1]
	}
	// The scrapes after the change. The first may still find a pooled session that the
	// server ended (reason "connection") before a new one is refused; and a re-check
	// (every second) may drop the dropped database before a scrape reports it: then it
	// is gone, not up. Each must come to be down for its own reason.
	want := map[string]string{"dropped": "unavailable", "closed": "unavailable", "revoked": "auth"}
	var body string
	downForItsReason := func(db string) bool {
		return upOf(body, label(db)) == "0" && reason(body, db, want[db]) == "1"
	}
	testutil.Poll(15*time.Second, func() bool {
		body, _ = p.metrics(t, "5")
		for db := range want {
			if !downForItsReason(db) && (db != "dropped" || upOf(body, label(db)) != "") {
				return false
			}
		}
		return true
	})
	for db, r := range want {
		if !downForItsReason(db) && (db != "dropped" || upOf(body, label(db)) != "") {
			t.Errorf("%s: pg_liveness_up %q, down_reason %s %q; want 0 and 1", db, upOf(body, label(db)), r, reason(body, db, r))
		}
	}
	if upOf(body, label("ok")) != "1" {
		t.Errorf("the database beside them: pg_liveness_up %q", upOf(body, label("ok")))
	}
	if strings.Contains(p.Logs(), "cannot read the server's advisory locks once") {
		t.Errorf("the server's shared read of pg_locks failed: the test does not show what it should")
	}
	// A re-check (every second) drops the dropped database; the same re-check kept the
	// other two, listed, down.
	testutil.Eventually(t, 30*time.Second, "the dropped database gone after a re-check", func() bool {
		body, _ = p.metrics(t, "5")
		return upOf(body, label("dropped")) == ""
	})
	for db, r := range map[string]string{"closed": "unavailable", "revoked": "auth"} {
		if upOf(body, label(db)) != "0" || reason(body, db, r) != "1" {
			t.Errorf("after a re-check, %s: pg_liveness_up %q, down_reason %s %q; want listed, 0 and 1", db, upOf(body, label(db)), r, reason(body, db, r))
		}
	}
	if t.Failed() {
		var lines []string
		for l := range strings.Lines(body) {
			if strings.HasPrefix(l, "pg_liveness_up{") || strings.HasPrefix(l, "pg_liveness_database_down_reason{") {
				lines = append(lines, l)
			}
		}
		t.Logf("last scrape:\n%s", strings.Join(lines, ""))
	}
}

// A discover entry whose role may not read pg_database exports that it fails and why
// (pg_liveness_exporter_discover_entry_up 0, down_reason permission) and logs it once
// when it begins, not at every re-check; once the role may read it again, the entry is
// up, its databases found, and one line says so.
func TestDiscoverEntryThatMayNotListDatabasesSaysSo(t *testing.T) {
	t.Parallel()
	s := pgtest.NewServer(t)
	const pw = "lister-pw"
	ctx := context.Background()
	d := pgtest.NewDBOn(t, s)
	seedService(t, d, "svc-listed")
	d.Exec(t, `GRANT USAGE ON SCHEMA liveness TO PUBLIC; GRANT SELECT ON liveness.instances, liveness.leases TO PUBLIC`)
	// pg_database is shared, but its privileges are kept per database: this revokes it
	// where the entry reads it (its maintenance database, postgres).
	for _, sql := range []string{`CREATE ROLE lister LOGIN PASSWORD '` + pw + `'`, `REVOKE SELECT ON pg_catalog.pg_database FROM PUBLIC`} {
		if err := s.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = s.Exec(context.Background(), `GRANT SELECT ON pg_catalog.pg_database TO PUBLIC`) })
	dir := t.TempDir()
	cfg := writeFile(t, dir, "targets.yml", fmt.Sprintf("credentials:\n  l: {user: lister, password_file: %s, sslmode: disable}\n"+
		"discover:\n  s: {host: 127.0.0.1, port: %d, credentials: l, interval: 1s}\n", writeFile(t, dir, "pw", pw+"\n"), s.Port))
	p := startExporter(t, nil, "--no-agent", "--config.file="+cfg)
	body := p.waitFor(t, `(?m)^pg_liveness_exporter_discover_entry_up\{entry="s"\} 0$`, 30*time.Second)
	for _, r := range []string{"auth", "connection", "error", "permission", "timeout", "tls", "unavailable"} {
		want := "0"
		if r == "permission" {
			want = "1"
		}
		if line := `pg_liveness_exporter_discover_entry_down_reason{entry="s",reason="` + r + `"} ` + want; !strings.Contains(body, line+"\n") {
			t.Errorf("no %s in:\n%s", line, body)
		}
	}
	// One warning, whatever the re-checks (every second) that fail again.
	warnings := func() int {
		n := 0
		for l := range strings.Lines(p.Logs()) {
			if strings.Contains(l, "level=WARN") && strings.Contains(l, "cannot list the server's databases") {
				n++
			}
		}
		return n
	}
	waitLogCount(t, p, "cannot list the server's databases", 4) // the debug lines of three re-checks more
	if n := warnings(); n != 1 {
		t.Errorf("%d warnings for the same failure over four re-checks, want 1", n)
	}
	if !strings.Contains(p.Logs(), "permission denied") {
		t.Errorf("the warning does not say why")
	}

	if err := s.Exec(ctx, `GRANT SELECT ON pg_catalog.pg_database TO PUBLIC`); err != nil {
		t.Fatal(err)
	}
	body = p.waitFor(t, `(?m)^pg_liveness_exporter_discover_entry_up\{entry="s"\} 1$`, 30*time.Second)
	if !strings.Contains(body, `pg_liveness_exporter_discover_entry_down_reason{entry="s",reason="permission"} 0`) {
		t.Errorf("permission still given as the reason once the entry succeeds:\n%s", body)
	}
	testutil.Eventually(t, 30*time.Second, "the database found", func() bool {
		b, _ := p.metrics(t, "5")
		return upOf(b, "s/"+d.Name) == "1"
	})
	waitLog(t, p, "the server's databases are listed again")
	if n := warnings(); n != 1 {
		t.Errorf("%d warnings, want the one", n)
	}
}
