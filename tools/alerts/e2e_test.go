package alerts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"

	"github.com/pg-liveness/pg_liveness_exporter/dashboards"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
	"github.com/pg-liveness/pg_liveness_exporter/tools/promql"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	// e2eJob matches the rules' assumption that the scrape job starts with "pg_liveness".
	e2eJob = "pg_liveness"
	// e2eFor replaces every "for:" of the rules, so that alerts fire within seconds.
	e2eFor = "2s"
	// e2eWait bounds every wait of the end-to-end test.
	e2eWait = 60 * time.Second
	// e2eHolder holds the test's leases, in the exporter's host:pid:hex holder format.
	e2eHolder = "e2e-host:1:abcd"
	// e2eRateInterval stands in for Grafana's $__rate_interval: with 1 s scrapes, rate()
	// and increase() over it have data two scrapes after a series appears.
	e2eRateInterval = "15s"
)

// Short agent timings for both exporters: stale after 4 s without a heartbeat.
var e2eAgentFlags = []string{
	"--agent.heartbeat-interval=1s",
	"--agent.heartbeat-slow-interval=2s",
	"--agent.stale-threshold=4s",
	"--agent.definitive-dead-cutoff=15s",
	"--agent.reaper-interval=1s",
}

// TestEndToEnd runs the real exporter binary, Prometheus and Alertmanager against a real
// PostgreSQL. An observer exporter (an agent of service e2e-observer, with the reaper) is
// scraped, with an exporter of many databases (--config.file) beside it for the families
// only such an exporter has; a victim exporter (an agent of e2e-victim) is SIGKILLed. The
// kernel closes its alive-lock session, so its lock is gone and, with its heartbeat
// stopped, its row turns
// stale: PgLivenessInstancesStale must reach the webhook receiver firing, then resolved
// once the observer's reaper deletes the row. The test holds the reaper's lease until the
// firing notification arrives; otherwise the reaper would delete the row as soon as it
// turns stale, before any "for:" could elapse. The same setup then evaluates every
// dashboard query against the Prometheus that scraped it all.
func TestEndToEnd(t *testing.T) {
	alertmanager := proctest.NeedTool(t, "prometheus-alertmanager", "prometheus-alertmanager")
	exporter := proctest.BuildExporter(t)

	db := setupE2EDatabase(t)

	observerAddr, victimAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	env := []string{"DATA_SOURCE_NAME=" + db.DSN} // keeps the password off the process list
	// The observer is its node's agent too (--node-agent.socket; its own agent attaches to
	// it): the node agent's families, which rules and panels use.
	observer := proctest.Start(t, "observer", proctest.Options{Env: env}, exporter, append([]string{
		"--web.listen-address=" + observerAddr, "--agent.service-name=e2e-observer",
		"--node-agent.socket=" + filepath.Join(t.TempDir(), "agent.sock")}, e2eAgentFlags...)...)
	victim := proctest.Start(t, "victim", proctest.Options{Env: env}, exporter, append([]string{
		"--web.listen-address=" + victimAddr, "--agent.service-name=e2e-victim", "--no-agent.reaper"}, e2eAgentFlags...)...)
	// A third exporter of many databases (--config.file, one target it is never asked to
	// probe): the families only such an exporter has, which rules use too.
	proberAddr, dir := testutil.FreeAddr(t), t.TempDir()
	dsnFile, targetsFile := filepath.Join(dir, "dsn"), filepath.Join(dir, "targets.yml")
	if err := os.WriteFile(dsnFile, []byte(db.DSN+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(targetsFile, []byte("targets:\n  e2e: {dsn_file: "+dsnFile+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prober := proctest.Start(t, "prober", proctest.Options{}, exporter,
		"--web.listen-address="+proberAddr, "--no-agent", "--config.file="+targetsFile)
	observer.WaitReady(t, "http://"+observerAddr+"/metrics", e2eWait)
	victim.WaitReady(t, "http://"+victimAddr+"/metrics", e2eWait)
	prober.WaitReady(t, "http://"+proberAddr+"/metrics", e2eWait)

	hook := newWebhook(t)
	amAddr := startAlertmanager(t, alertmanager, hook.URL)
	promAddr := startPrometheus(t, []string{observerAddr, proberAddr}, amAddr, probeJobs(observerAddr, proberAddr)...)
	prom := promAPI{addr: promAddr}

	t.Run("stale instance alert fires and resolves", func(t *testing.T) {
		// The victim is seen alive first, so the stale state comes from the kill.
		waitFor(t, "Prometheus to see the victim alive", func() bool {
			return prom.nonEmpty(t, `pg_liveness_instances{service="e2e-victim",state="alive"} == 1`)
		})
		// The victim leads a job (a lease naming its instance), which is taken over once
		// it is dead: the failover history's panels then have a takeover to show.
		db.Exec(t, `INSERT INTO liveness.leases (name, holder, holder_instance_id, taken_at, expires_at)
			SELECT 'e2e-victim-job', 'e2e-victim-token', instance_id, now(), now() + interval '1 hour'
			  FROM liveness.instances WHERE service_name = 'e2e-victim'`)
		if a := hook.find("firing", "PgLivenessInstancesStale", "e2e-victim"); a != nil {
			t.Fatalf("PgLivenessInstancesStale fired before the victim was killed: %v", a.Labels)
		}
		victim.Kill(t)
		killed := time.Now()

		var firing *amAlert
		waitFor(t, "a firing PgLivenessInstancesStale notification for e2e-victim", func() bool {
			firing = hook.find("firing", "PgLivenessInstancesStale", "e2e-victim")
			return firing != nil
		})
		t.Logf("firing notification %.1fs after the kill", time.Since(killed).Seconds())
		if n := db.QueryInt(t, `SELECT count(*) FROM liveness.lease_take('e2e-victim-job', 'e2e-heir-token', 3600, NULL, 'e2e-heir') t
			WHERE t.epoch IS NOT NULL`); n != 1 {
			t.Fatal("the dead victim's lease could not be taken over")
		}
		for k, want := range map[string]string{
			"severity": "warning", "state": "stale", "job": e2eJob,
		} {
			if got := firing.Labels[k]; got != want {
				t.Errorf("firing alert: label %s = %q, want %q", k, got, want)
			}
		}
		// A database-wide alert is raised once for the job, not once per exporter.
		if got, ok := firing.Labels["instance"]; ok {
			t.Errorf("firing alert: label instance = %q, want none", got)
		}
		const anchor = "pglivenessinstancesstale"
		if got := firing.Annotations["runbook_url"]; got != runbookURLBase+anchor {
			t.Errorf("firing alert: runbook_url %q, want %q", got, runbookURLBase+anchor)
		}
		if !runbookAnchors(t)[anchor] {
			t.Errorf("%s has no heading with anchor #%s", runbooksFile, anchor)
		}
		if !strings.Contains(firing.Annotations["description"], "e2e-victim") {
			t.Errorf("firing alert: description does not name the service: %q", firing.Annotations["description"])
		}

		// Hand the reaper its lease: it deletes the victim's row, the service disappears
		// from pg_liveness_instances, and the alert resolves.
		db.Exec(t, `DELETE FROM liveness.leases WHERE name = $1 AND holder = $2`, defaults.ReaperLease, e2eHolder)
		released := time.Now()
		waitFor(t, "a resolved PgLivenessInstancesStale notification for e2e-victim", func() bool {
			return hook.find("resolved", "PgLivenessInstancesStale", "e2e-victim") != nil
		})
		t.Logf("resolved notification %.1fs after the reaper's lease was released", time.Since(released).Seconds())
		if n := db.QueryInt(t, `SELECT count(*) FROM liveness.instances WHERE service_name = 'e2e-victim'`); n != 0 {
			t.Errorf("%d e2e-victim rows left after the alert resolved; want the reaper to have deleted them", n)
		}
		// The alert may resolve on a scrape of another exporter before Prometheus has
		// scraped the observer's counter after the reap: wait for that scrape.
		waitFor(t, "the observer reporting the reaped instance", func() bool {
			return prom.nonEmpty(t, `pg_liveness_agent_instances_reaped_total{job="`+e2eJob+`"} >= 1`)
		})
	})

	t.Run("rules evaluate without errors", func(t *testing.T) {
		// Vector-matching errors only show with real series, at evaluation time.
		for _, g := range prom.ruleGroups(t) {
			for _, r := range g.Rules {
				if r.Health != "ok" {
					t.Errorf("rule %s: health %q: %s", r.Name, r.Health, r.LastError)
				}
			}
		}
	})

	// Every exporter of the one database, the observer's /metrics and the prober's /probe
	// answer alike, names it by one database_id, which PgLivenessLeaseTwoLeaders joins the
	// agents' beliefs and the lease rows by: the observer's belief in the reaper's lease
	// meets that lease's row.
	t.Run("agents and lease rows meet by the database's identity", func(t *testing.T) {
		const join = ` * ignoring (lease, database_id, datname) group_left (database_id, datname) pg_liveness_database_info`
		waitFor(t, "one database_id, and a belief and a row joined by it", func() bool {
			return prom.nonEmpty(t, `count(count by (database_id) (pg_liveness_database_info{datname="`+db.Name+`"})) == 1`) &&
				prom.nonEmpty(t, `count(pg_liveness_database_info) >= 2`) &&
				prom.nonEmpty(t, `max by (database_id, lease) (pg_liveness_agent_lease_epoch`+join+`)
					== on (database_id, lease) max by (database_id, lease) (pg_liveness_lease_epoch`+join+`)`)
		})
	})

	t.Run("every metric a rule uses is scraped", func(t *testing.T) {
		for _, g := range prom.ruleGroups(t) {
			for _, r := range g.Rules {
				expr, err := promql.ParseExpr(r.Query)
				if err != nil {
					t.Fatalf("rule %s: %v", r.Name, err)
				}
				for _, name := range promql.MetricNames(expr) {
					if !prom.nonEmpty(t, name) {
						t.Errorf("rule %s: metric %s has no series in Prometheus", r.Name, name)
					}
				}
			}
		}
	})

	// The exporter answers OpenMetrics to whoever prefers it, Prometheus included (it
	// scraped every target above in it): each answer parses with Prometheus' own
	// OpenMetrics parser to its # EOF, and, as client_golang's promhttp, without _created
	// samples (--web.openmetrics-created-samples is off).
	t.Run("OpenMetrics answers parse", func(t *testing.T) {
		for _, url := range []string{"http://" + observerAddr + "/metrics", "http://" + proberAddr + "/probe?target=e2e"} {
			body := getOpenMetrics(t, url)
			p := textparse.NewOpenMetricsParser(body, labels.NewSymbolTable())
			samples, created := 0, false
			for {
				e, err := p.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("%s: Prometheus' OpenMetrics parser: %v", url, err)
				}
				if e == textparse.EntrySeries {
					samples++
					if name, _, _ := p.Series(); strings.HasPrefix(string(name), "pg_liveness_agent_heartbeats_total") && p.StartTimestamp() != 0 {
						created = true
					}
				}
			}
			if samples == 0 {
				t.Errorf("%s: no samples", url)
			}
			if created {
				t.Errorf("%s: pg_liveness_agent_heartbeats_total has a _created by default", url)
			}
		}
	})

	// A dashboard filtered to the probe job (a multi-target install's databases) shows
	// every panel: the agents' panels too, which the agents' own job serves.
	t.Run("every dashboard query returns data for the probe job", func(t *testing.T) {
		waitForData(t, prom, "every dashboard query to return data for job pg_liveness_probe",
			dashboardQueries(t, map[string]string{"job": "pg_liveness_probe", "instance": ".+", "database": "e2e"}))
	})

	t.Run("every dashboard query returns data", func(t *testing.T) {
		// The reaper's lease is released above; release it here as well in case that
		// subtest stopped early, since the agent lease panels need the observer to hold it
		// once.
		db.Exec(t, `DELETE FROM liveness.leases WHERE name = $1 AND holder = $2`, defaults.ReaperLease, e2eHolder)
		waitForData(t, prom, "every dashboard query to return data", dashboardQueries(t, nil))
	})
}

// waitForData waits until every query returns data, and fails the test naming those that
// return none.
func waitForData(t *testing.T, prom promAPI, what string, queries []dashboardQuery) {
	t.Helper()
	empty := map[string]string{}
	waitFor(t, what, func() bool {
		clear(empty)
		for _, q := range queries {
			res, err := prom.query(t, q.expr)
			if err != nil {
				t.Fatalf("%s: %v\n\t%s", q.where, err, q.expr)
			}
			if res == 0 {
				empty[q.where] = q.expr
			}
		}
		return len(empty) == 0
	}, func() string {
		var b strings.Builder
		for where, expr := range empty {
			fmt.Fprintf(&b, "\n%s returns no data:\n\t%s", where, expr)
		}
		return b.String()
	})
}

// getOpenMetrics GETs url with the Accept header Prometheus sends and returns the
// OpenMetrics answer.
func getOpenMetrics(t *testing.T, url string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
	resp, err := apiClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/openmetrics-text; version=1.0.0") {
		t.Fatalf("GET %s: %s, Content-Type %q, %v", url, resp.Status, resp.Header.Get("Content-Type"), err)
	}
	return b
}

// probeJobs are the scrape jobs of a multi-target install beside e2eJob: the prober's
// target e2e as /probe answers it (job pg_liveness_probe, labelled database=e2e, as the
// scrape_config of docs/many-databases.md and the chart's Probe label it), and the
// observer's agent scraped as the agents' job with its database's label, as that page
// says to.
func probeJobs(observerAddr, proberAddr string) []any {
	return []any{
		map[string]any{
			"job_name": "pg_liveness_probe", "metrics_path": "/probe",
			"static_configs": []any{map[string]any{"targets": []string{"e2e"}}},
			"relabel_configs": []any{
				map[string]any{"source_labels": []string{"__address__"}, "target_label": "__param_target"},
				map[string]any{"source_labels": []string{"__param_target"}, "target_label": "database"},
				map[string]any{"source_labels": []string{"__param_target"}, "target_label": "instance"},
				map[string]any{"target_label": "__address__", "replacement": proberAddr},
			},
		},
		map[string]any{
			"job_name":       "pg_liveness_agent",
			"static_configs": []any{map[string]any{"targets": []string{observerAddr}, "labels": map[string]string{"database": "e2e"}}},
		},
	}
}

// setupE2EDatabase makes a database with data for every dashboard panel: the liveness
// schema, pg_stat_statements, leases (one held, one expired, and the reaper's, held by
// the test) and an advisory lock held by an idle backend with a second backend waiting
// for it.
func setupE2EDatabase(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := migrations.Apply(ctx, db.Conn(t), defaults.Schema); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	db.Exec(t, `INSERT INTO liveness.leases (name, holder, taken_at, expires_at) VALUES
		($1, $2, now(), now() + interval '1 hour'),
		('e2e-job', $2, now() - interval '10 seconds', now() + interval '1 hour'),
		('e2e-expired', 'e2e-host:2:dcba', now() - interval '2 minutes', now() - interval '1 minute')`,
		defaults.ReaperLease, e2eHolder)

	holder := db.ConnAs(t, "e2e-app")
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(42)`); err != nil {
		t.Fatal(err)
	}
	waiter := db.ConnAs(t, "e2e-app")
	wctx, stop := context.WithTimeout(context.Background(), 10*time.Minute)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() }) // before the connections close
	wg.Go(func() { _, _ = waiter.Exec(wctx, `SELECT pg_advisory_lock(42)`) })
	waitFor(t, "the advisory lock waiter", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 1
	})
	return db
}

// shortenedRules is the rule file with every "for:" set to e2eFor.
func shortenedRules(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	forRE := regexp.MustCompile(`(?m)^(\s+for:\s*)\S+[ \t]*$`)
	all := regexp.MustCompile(`(?m)^\s+for:`).FindAll(b, -1)
	if n := len(forRE.FindAll(b, -1)); n == 0 || n != len(all) {
		t.Fatalf("%s: the rewrite matches %d of %d for: lines", rulesFile, n, len(all))
	}
	return forRE.ReplaceAll(b, []byte("${1}"+e2eFor))
}

// startPrometheus runs Prometheus scraping the exporters at targets every second, with the
// shortened rules, alerting to Alertmanager at am, and returns its address.
func startPrometheus(t *testing.T, targets []string, am string, extraJobs ...any) string {
	t.Helper()
	rules := filepath.Join(t.TempDir(), "pg_liveness.rules.yml")
	if err := os.WriteFile(rules, shortenedRules(t), 0o600); err != nil {
		t.Fatal(err)
	}
	return proctest.StartPrometheus(t, map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"rule_files": []string{rules},
		"alerting": map[string]any{"alertmanagers": []any{
			map[string]any{"static_configs": []any{map[string]any{"targets": []string{am}}}},
		}},
		"scrape_configs": append([]any{map[string]any{
			"job_name":       e2eJob,
			"static_configs": []any{map[string]any{"targets": targets}},
		}}, extraJobs...),
	}).Addr
}

// startAlertmanager runs a single, unclustered Alertmanager that posts every group
// change to hook within about a second, and returns its address.
func startAlertmanager(t *testing.T, alertmanager, hook string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := map[string]any{
		"route": map[string]any{
			"receiver": "test", "group_by": []string{"alertname", "service"},
			"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h",
		},
		"receivers": []any{map[string]any{
			"name":            "test",
			"webhook_configs": []any{map[string]any{"url": hook, "send_resolved": true}},
		}},
	}
	cfgPath := proctest.WriteJSON(t, dir, "alertmanager.yml", cfg)
	addr := testutil.FreeAddr(t)
	p := proctest.Start(t, "alertmanager", proctest.Options{}, alertmanager,
		"--config.file="+cfgPath,
		"--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--cluster.listen-address=")
	p.WaitReady(t, "http://"+addr+"/-/ready", e2eWait)
	return addr
}

// amAlert is one alert of an Alertmanager webhook notification.
type amAlert struct {
	Status      string            `json:"status"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// webhook records the alerts Alertmanager posts to it.
type webhook struct {
	URL    string
	mu     sync.Mutex
	alerts []amAlert
}

func newWebhook(t *testing.T) *webhook {
	t.Helper()
	h := &webhook{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var msg struct {
			Alerts []amAlert `json:"alerts"`
		}
		if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.mu.Lock()
		h.alerts = append(h.alerts, msg.Alerts...)
		h.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	h.URL = srv.URL + "/alerts"
	return h
}

// find returns the first received alert with this status, alertname and service, of
// the job e2eJob (the probe job's copy of a database-wide alert is its own).
func (h *webhook) find(status, alertname, service string) *amAlert {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range h.alerts {
		if a.Status == status && a.Labels["alertname"] == alertname && a.Labels["service"] == service && a.Labels["job"] == e2eJob {
			return &a
		}
	}
	return nil
}

// promAPI queries Prometheus' HTTP API.
type promAPI struct{ addr string }

var apiClient = &http.Client{Timeout: 5 * time.Second}

func (p promAPI) get(t *testing.T, path string, v any) {
	t.Helper()
	resp, err := apiClient.Get("http://" + p.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

// query runs an instant query and returns the number of samples it gave, or the error
// Prometheus reported (a parse error, for one).
func (p promAPI) query(t *testing.T, expr string) (int, error) {
	t.Helper()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	p.get(t, "/api/v1/query?query="+url.QueryEscape(expr), &body)
	if body.Status != "success" {
		return 0, fmt.Errorf("status %q: %s", body.Status, body.Error)
	}
	if body.Data.ResultType == "scalar" || body.Data.ResultType == "string" {
		return 1, nil
	}
	var result []json.RawMessage
	if err := json.Unmarshal(body.Data.Result, &result); err != nil {
		return 0, err
	}
	return len(result), nil
}

func (p promAPI) nonEmpty(t *testing.T, expr string) bool {
	t.Helper()
	n, err := p.query(t, expr)
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return n > 0
}

type evaluatedRule struct {
	Name      string `json:"name"`
	Query     string `json:"query"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

func (p promAPI) ruleGroups(t *testing.T) []struct{ Rules []evaluatedRule } {
	t.Helper()
	var body struct {
		Data struct {
			Groups []struct{ Rules []evaluatedRule } `json:"groups"`
		} `json:"data"`
	}
	p.get(t, "/api/v1/rules", &body)
	if len(body.Data.Groups) == 0 {
		t.Fatal("Prometheus loaded no rule groups")
	}
	return body.Data.Groups
}

type dashboardQuery struct{ where, expr string }

// dashboardQueries returns every panel query of the shipped dashboards, with
// $__rate_interval set to e2eRateInterval and every template variable set as in
// values, or else matching all values, as the dashboards' "All" does: its allValue (the
// database's, ".*", matches the series of this exporter of one database, which have no
// database label).
func dashboardQueries(t *testing.T, values map[string]string) []dashboardQuery {
	t.Helper()
	type panel struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	variableRE := regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?`)
	var out []dashboardQuery
	var allValues map[string]string // of the dashboard being walked
	var walk func(file string, raw []json.RawMessage)
	walk = func(file string, raw []json.RawMessage) {
		for _, r := range raw {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			for _, tg := range p.Targets {
				expr := strings.ReplaceAll(tg.Expr, "$__rate_interval", e2eRateInterval)
				expr = variableRE.ReplaceAllStringFunc(expr, func(v string) string {
					name := variableRE.FindStringSubmatch(v)[1]
					if set, ok := values[name]; ok {
						return set
					}
					if all, ok := allValues[name]; ok {
						return all
					}
					t.Fatalf("%s: panel %d uses $%s, which is no variable with an allValue", file, p.ID, name)
					return ""
				})
				out = append(out, dashboardQuery{
					where: fmt.Sprintf("%s panel %d %q target %s", file, p.ID, p.Title, tg.RefID), expr: expr})
			}
			walk(file, p.Panels)
		}
	}
	files, err := fs.Glob(dashboards.Files, "*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards (%v)", err)
	}
	for _, f := range files {
		b, err := fs.ReadFile(dashboards.Files, f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels     []json.RawMessage `json:"panels"`
			Templating struct {
				List []struct {
					Name     string `json:"name"`
					AllValue string `json:"allValue"`
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		allValues = map[string]string{}
		for _, v := range d.Templating.List {
			if v.AllValue != "" {
				allValues[v.Name] = v.AllValue
			}
		}
		walk(f, d.Panels)
	}
	slices.SortFunc(out, func(a, b dashboardQuery) int { return strings.Compare(a.where, b.where) })
	return out
}

// waitFor polls cond for up to e2eWait; detail, if given, explains a timeout.
func waitFor(t *testing.T, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	if testutil.Poll(e2eWait, cond) {
		return
	}
	msg := ""
	for _, d := range detail {
		msg += d()
	}
	t.Fatalf("timed out after %s waiting for %s%s", e2eWait, what, msg)
}
