package dashboards

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/tools/promql"
)

// dashboardsDir is the folder of the dashboards under test, in the root module.
const dashboardsDir = "../../dashboards"

// wantUIDs are the fixed uids of the dashboards; links and provisioning rely on them.
var wantUIDs = map[string]string{
	"overview.json":       "pg-liveness-overview",
	"leases.json":         "pg-liveness-leases",
	"advisory-locks.json": "pg-liveness-advisory-locks",
}

const minSchemaVersion = 39

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *dsRef          `json:"datasource"`
	IncludeAll bool            `json:"includeAll"`
	AllValue   string          `json:"allValue"`
}

// queryText returns a variable's query, written either as a string or as the query
// editor's {"query": "…"} object.
func (v variable) queryText() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(v.Query, &o)
	return o.Query
}

type target struct {
	Expr         string `json:"expr"`
	RefID        string `json:"refId"`
	LegendFormat string `json:"legendFormat"`
	Datasource   *dsRef `json:"datasource"`
}

// link is a dashboard's or a panel's link.
type link struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	URL         string `json:"url"`
	KeepTime    bool   `json:"keepTime"`
	IncludeVars bool   `json:"includeVars"`
}

type thresholdStep struct {
	Color string   `json:"color"`
	Value *float64 `json:"value"`
}

type panel struct {
	ID          int                       `json:"id"`
	Type        string                    `json:"type"`
	Title       string                    `json:"title"`
	Description string                    `json:"description"`
	Datasource  *dsRef                    `json:"datasource"`
	GridPos     *struct{ H, W, X, Y int } `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit       string `json:"unit"`
			Thresholds struct {
				Steps []thresholdStep `json:"steps"`
			} `json:"thresholds"`
			Custom struct {
				ThresholdsStyle struct {
					Mode string `json:"mode"`
				} `json:"thresholdsStyle"`
			} `json:"custom"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Links   []link   `json:"links"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"` // a collapsed row's panels
}

// importInput and importRequire are grafana.com's import header: what the dashboard asks
// for when it is imported (a data source), and what it needs (Grafana, the data source's
// plugin, its panels' plugins).
type importInput struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	PluginID string `json:"pluginId"`
}

type importRequire struct {
	Type string `json:"type"`
	ID   string `json:"id"`
	Name string `json:"name"`
}

type dashboard struct {
	Inputs        []importInput   `json:"__inputs"`
	Requires      []importRequire `json:"__requires"`
	UID           string          `json:"uid"`
	Title         string          `json:"title"`
	SchemaVersion int             `json:"schemaVersion"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Links  []link  `json:"links"`
	Panels []panel `json:"panels"`
}

func loadDashboards(t *testing.T) map[string]dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]dashboard{}
	for _, path := range files {
		f := filepath.Base(path)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		dec := json.NewDecoder(strings.NewReader(string(b)))
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[f] = d
	}
	for f := range wantUIDs {
		if _, ok := out[f]; !ok {
			t.Errorf("dashboard %s is missing", f)
		}
	}
	return out
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

var (
	variableRE    = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?`)
	labelValuesRE = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
)

// rateIntervalStandIn replaces Grafana's $__rate_interval before an expression is
// parsed, so that the range of every rate, irate and increase can be checked to be it.
// No panel writes this range itself.
const (
	rateIntervalStandIn = "4321s"
	rateInterval        = 4321 * time.Second
)

// parseExpr parses a panel query with Prometheus' own parser. Grafana variables inside
// label matchers ("$job") are valid PromQL strings and stay as they are.
func parseExpr(expr string) (parser.Expr, error) {
	return promql.ParseExpr(strings.ReplaceAll(expr, "$__rate_interval", rateIntervalStandIn))
}

// filtered reports whether a selector filters by the cluster, namespace, job, instance
// and database variables; an agent's metric (pg_liveness_agent_*, and the node agent's,
// pg_liveness_node_agent_*, which an agent's process serves) by the cluster, namespace
// and database only. The cluster and namespace variables are kube-prometheus'
// (a Prometheus or a global ruler of several clusters; their All matches an empty label
// too, so a Prometheus outside Kubernetes needs neither). The agents are scraped by a job
// of their own (pg_liveness_agent) beside the observer's or the probes'
// (pg_liveness_probe), so a job or instance filter would empty every agent panel of a
// dashboard showing the probe job; their database label (docs/many-databases.md: scrape
// agents with their database's) is what ties them to the fleet shown. The database's
// identity (pg_liveness_database_info) is every process's, the agents' included, and is
// filtered as theirs.
func filtered(s promql.Selector) bool {
	where := s.Has("cluster", labels.MatchRegexp, "$cluster") && s.Has("namespace", labels.MatchRegexp, "$namespace") &&
		s.Has("database", labels.MatchRegexp, "$database")
	if strings.HasPrefix(s.Name, "pg_liveness_agent_") || strings.HasPrefix(s.Name, "pg_liveness_node_agent_") ||
		s.Name == "pg_liveness_database_info" {
		return where && !slices.ContainsFunc(s.Matchers, func(m *labels.Matcher) bool { return m.Name == "job" || m.Name == "instance" })
	}
	return where && s.Has("job", labels.MatchRegexp, "$job") && s.Has("instance", labels.MatchRegexp, "$instance")
}

// checkExpr returns what is wrong with one panel query.
func checkExpr(expr string, allowed map[string]bool, vars []string) []string {
	var errs []string
	e, err := parseExpr(expr)
	if err != nil {
		return []string{err.Error()}
	}
	sels := promql.Selectors(e)
	if len(sels) == 0 {
		errs = append(errs, "selects no metric")
	}
	for _, s := range sels {
		if s.Name != "" && !allowed[s.Name] {
			errs = append(errs, fmt.Sprintf("selector %s%v: metric %s is not exported (not in %s)", s.Name, s.Matchers, s.Name, testutil.ScenarioExposition))
		}
		if !filtered(s) {
			errs = append(errs, fmt.Sprintf(`selector %s%v lacks cluster=~"$cluster",namespace=~"$namespace",job=~"$job",instance=~"$instance",database=~"$database"`, s.Name, s.Matchers))
		}
	}
	for _, c := range promql.CounterCalls(e) {
		switch {
		case c.Metric == "":
			errs = append(errs, c.Func+" must take one counter selector with a range")
		case !strings.HasSuffix(c.Metric, "_total") && !histogramSample(allowed, c.Metric):
			errs = append(errs, fmt.Sprintf("%s(%s): only *_total counters and a histogram's samples take rate, irate or increase", c.Func, c.Metric))
		case c.Range != rateInterval:
			errs = append(errs, fmt.Sprintf("%s(%s[%s]): use [$__rate_interval]", c.Func, c.Metric, c.Range))
		}
	}
	for _, m := range variableRE.FindAllStringSubmatch(expr, -1) {
		if m[1] != "__rate_interval" && !slices.Contains(vars, m[1]) {
			errs = append(errs, fmt.Sprintf("unknown variable $%s", m[1]))
		}
	}
	return errs
}

func TestCheckExpr(t *testing.T) {
	allowed := map[string]bool{"a_total": true, "g": true, "pg_liveness_agent_x": true}
	vars := []string{"cluster", "namespace", "job", "instance", "database", "service"}
	const cn = `cluster=~"$cluster",namespace=~"$namespace"`
	const f = cn + `,job=~"$job",instance=~"$instance",database=~"$database"`
	for _, tc := range []struct {
		expr string
		bad  bool
	}{
		{`sum by (x) (rate(a_total{` + f + `}[$__rate_interval])) / on (job) group_left g{` + f + `,service=~"$service"}`, false},
		{`max by (l) (changes(g{` + f + `}[5m])) > 0 and g{` + f + `}`, false},
		{`g{job=~"$job"}`, true},                                                                     // no instance filter
		{`g{job=~"$job",instance=~"$instance"}`, true},                                               // no database filter
		{`g{` + f + `} / g`, true},                                                                   // unfiltered selector
		{`{` + f + `} or {job="x"}`, true},                                                           // nameless selector without filters
		{`rate(a_total{` + f + `}[5m])`, true},                                                       // fixed range
		{`rate(g{` + f + `}[$__rate_interval])`, true},                                               // rate of a gauge
		{`increase((a_total{` + f + `})[$__rate_interval:])`, true},                                  // not a plain selector
		{`unknown_metric{` + f + `}`, true},                                                          // not exported
		{`g{` + f + `,lease=~"$lease"}`, true},                                                       // unknown variable
		{`g{` + f + `,x="a\"}b"} + g{` + f + `}`, false},                                             // braces inside strings
		{`sum without (instance) (g{` + f + `})`, false},                                             // label lists
		{`g{` + f + `} +`, true},                                                                     // does not parse
		{`count by (job) (g{` + f + `}) + count{` + f + `}`, true},                                   // "count" metric not exported
		{`pg_liveness_agent_x{` + cn + `,database=~"$database"}`, false},                             // an agent's metric, by database
		{`pg_liveness_agent_x{` + f + `}`, true},                                                     // an agent's metric by job: empty for the probe job
		{`pg_liveness_agent_x{database=~"$database"}`, true},                                         // an agent's metric without cluster and namespace
		{`g{job=~"$job",instance=~"$instance",database=~"$database"}`, true},                         // no cluster, no namespace
		{`g{cluster=~"$cluster",job=~"$job",instance=~"$instance",database=~"$database"}`, true},     // no namespace
		{`g{namespace=~"$namespace",job=~"$job",instance=~"$instance",database=~"$database"}`, true}, // no cluster
		{`g{` + f + `} / on (job) g{job=~"$job",instance=~"$instance",database=~"$database"}`, true}, // one selector without
	} {
		if errs := checkExpr(tc.expr, allowed, vars); (len(errs) > 0) != tc.bad {
			t.Errorf("checkExpr(%s): %q, want bad=%v", tc.expr, errs, tc.bad)
		}
	}
}

func TestDashboardConventions(t *testing.T) {
	allowed := testutil.ExposedMetrics(t)
	uids := map[string]string{}
	for file, d := range loadDashboards(t) {
		want, known := wantUIDs[file]
		if !known {
			t.Errorf("%s: unknown dashboard; add its fixed uid to wantUIDs", file)
		} else if d.UID != want {
			t.Errorf("%s: uid %q, want %q", file, d.UID, want)
		}
		if other, dup := uids[d.UID]; dup {
			t.Errorf("%s and %s share uid %q", file, other, d.UID)
		}
		uids[d.UID] = file
		if !strings.HasPrefix(d.Title, "pg_liveness") {
			t.Errorf("%s: title %q should start with pg_liveness", file, d.Title)
		}
		if d.SchemaVersion < minSchemaVersion {
			t.Errorf("%s: schemaVersion %d, want at least %d", file, d.SchemaVersion, minSchemaVersion)
		}

		// grafana.com's import header: one Prometheus data source to pick, and what the
		// dashboard needs, Grafana, Prometheus and each panel type it uses, nothing more.
		if len(d.Inputs) != 1 || d.Inputs[0].Type != "datasource" || d.Inputs[0].PluginID != "prometheus" || !strings.HasPrefix(d.Inputs[0].Name, "DS_") {
			t.Errorf("%s: __inputs %+v, want one input of type datasource, pluginId prometheus, named DS_…", file, d.Inputs)
		}
		wantRequires := map[string]bool{"grafana/grafana": true, "datasource/prometheus": true}
		for _, p := range allPanels(d.Panels) {
			if p.Type != "row" {
				wantRequires["panel/"+p.Type] = true
			}
		}
		gotRequires := map[string]bool{}
		for _, r := range d.Requires {
			gotRequires[r.Type+"/"+r.ID] = true
			if r.Name == "" {
				t.Errorf("%s: __requires %s/%s has no name", file, r.Type, r.ID)
			}
		}
		if !maps.Equal(gotRequires, wantRequires) {
			t.Errorf("%s: __requires %v, want %v", file, slices.Sorted(maps.Keys(gotRequires)), slices.Sorted(maps.Keys(wantRequires)))
		}

		// Variables.
		var names []string
		byName := map[string]variable{}
		for _, v := range d.Templating.List {
			names = append(names, v.Name)
			byName[v.Name] = v
		}
		if ds, ok := byName["datasource"]; !ok || ds.Type != "datasource" || ds.queryText() != "prometheus" {
			t.Errorf("%s: want a variable datasource of type datasource and query prometheus", file)
		}
		for _, name := range []string{"cluster", "namespace", "job", "instance", "database"} {
			if _, ok := byName[name]; !ok {
				t.Errorf("%s: variable %s is missing", file, name)
			}
		}
		if i := slices.Index(names, "cluster"); i != 1 || len(names) < 3 || names[2] != "namespace" {
			t.Errorf("%s: variables %v: want cluster and namespace right after datasource, as kube-prometheus' dashboards have them", file, names)
		}
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
				t.Errorf("%s: variable %s must use the datasource variable", file, v.Name)
			}
			// All databases must match the series without a database label too: those of
			// an exporter that watches one database (--db.dsn); all clusters and
			// namespaces those of a Prometheus that does not label them.
			allValue := ".+"
			if v.Name == "database" || v.Name == "cluster" || v.Name == "namespace" {
				allValue = ".*"
			}
			if !v.IncludeAll || v.AllValue != allValue {
				t.Errorf("%s: variable %s needs includeAll and allValue %q", file, v.Name, allValue)
			}
			q := v.queryText()
			if v.Definition != "" && v.Definition != q {
				t.Errorf("%s: variable %s: definition %q differs from query %q", file, v.Name, v.Definition, q)
			}
			m := labelValuesRE.FindStringSubmatch(q)
			if m == nil || m[2] != v.Name {
				t.Errorf("%s: variable %s: query %q, want label_values(<selector>, %s)", file, v.Name, q, v.Name)
				continue
			}
			e, err := promql.ParseExpr(m[1])
			if err != nil {
				t.Errorf("%s: variable %s: %v", file, v.Name, err)
				continue
			}
			sels := promql.Selectors(e)
			if _, plain := e.(*parser.VectorSelector); !plain || len(sels) != 1 || !allowed[sels[0].Name] {
				t.Errorf("%s: variable %s: %q is not one selector of an exported metric", file, v.Name, m[1])
				continue
			}
			job := sels[0].Has("job", labels.MatchRegexp, "$job")
			inst := sels[0].Has("instance", labels.MatchRegexp, "$instance")
			dbf := sels[0].Has("database", labels.MatchRegexp, "$database")
			cl := sels[0].Has("cluster", labels.MatchRegexp, "$cluster")
			ns := sels[0].Has("namespace", labels.MatchRegexp, "$namespace")
			if v.Name != "cluster" && (!cl || v.Name != "namespace" && !ns) {
				t.Errorf("%s: variable %s: %q must filter by cluster and namespace (namespace by cluster)", file, v.Name, q)
			}
			switch v.Name {
			case "cluster":
				if sels[0].Name != "pg_liveness_up" || len(sels[0].Matchers) != 0 {
					t.Errorf("%s: variable cluster: want label_values(pg_liveness_up, cluster), got %q", file, q)
				}
			case "namespace":
				if sels[0].Name != "pg_liveness_up" || len(sels[0].Matchers) != 1 {
					t.Errorf("%s: variable namespace: want label_values(pg_liveness_up{cluster=~\"$cluster\"}, namespace), got %q", file, q)
				}
			case "job":
				if sels[0].Name != "pg_liveness_up" || len(sels[0].Matchers) != 2 {
					t.Errorf("%s: variable job: want label_values(pg_liveness_up{cluster=~\"$cluster\",namespace=~\"$namespace\"}, job), got %q", file, q)
				}
			case "instance":
				if sels[0].Name != "pg_liveness_up" || !job || inst {
					t.Errorf("%s: variable instance: want label_values(pg_liveness_up{job=~\"$job\"}, instance), got %q", file, q)
				}
			case "database":
				if sels[0].Name != "pg_liveness_up" || !job || !inst || dbf {
					t.Errorf("%s: variable database: want label_values(pg_liveness_up{job=~\"$job\",instance=~\"$instance\"}, database), got %q", file, q)
				}
			default:
				if !job || !inst || !dbf {
					t.Errorf("%s: variable %s: %q must filter by job, instance and database", file, v.Name, q)
				}
			}
		}

		// Panels.
		panels := allPanels(d.Panels)
		if len(panels) == 0 {
			t.Errorf("%s: no panels", file)
		}
		ids := map[int]bool{}
		for _, p := range panels {
			where := fmt.Sprintf("%s: panel %d %q", file, p.ID, p.Title)
			if p.ID == 0 || ids[p.ID] {
				t.Errorf("%s: missing or duplicate id", where)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				continue
			}
			// Each panel answers one question an operator asks, and its title asks it.
			if !strings.HasSuffix(p.Title, "?") {
				t.Errorf("%s: the title must be the question the panel answers, ending in \"?\"", where)
			}
			if p.Title == "" || p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
				t.Errorf("%s: needs a title and a gridPos", where)
			}
			if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: datasource must be {prometheus, ${datasource}}", where)
			}
			if strings.TrimSpace(p.Description) == "" {
				t.Errorf("%s: no description", where)
			}
			if p.FieldConfig.Defaults.Unit == "" {
				t.Errorf("%s: no fieldConfig.defaults.unit", where)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: no targets", where)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.Datasource == nil || tg.Datasource.Type != "prometheus" || tg.Datasource.UID != "${datasource}" {
					t.Errorf("%s: target %s: datasource must be {prometheus, ${datasource}}", where, tg.RefID)
				}
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("%s: target refId %q missing or duplicate", where, tg.RefID)
				}
				refs[tg.RefID] = true
				for _, e := range checkExpr(tg.Expr, allowed, names) {
					t.Errorf("%s: target %s: %s\n\t%s", where, tg.RefID, e, tg.Expr)
				}
			}
		}
	}
}

// histogramSample reports whether name is a histogram's _bucket, _sum or _count among the
// exposed names (which list a histogram's family and its three sample names).
func histogramSample(exposed map[string]bool, name string) bool {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && exposed[base] && exposed[base+"_bucket"] {
			return true
		}
	}
	return false
}
