package dashboards

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

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
	Expr       string `json:"expr"`
	RefID      string `json:"refId"`
	Datasource *dsRef `json:"datasource"`
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
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"` // a collapsed row's panels
}

type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

func loadDashboards(t *testing.T) map[string]dashboard {
	t.Helper()
	files, err := filepath.Glob("*.json")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]dashboard{}
	for _, f := range files {
		b, err := os.ReadFile(f)
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

// selector is one vector selector of an expression: a metric name and the text between
// its braces.
type selector struct {
	Name     string
	Matchers string
}

var (
	keywords = map[string]bool{
		"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true,
		"group_left": true, "group_right": true, "inf": true, "nan": true,
	}
	labelListKeywords = map[string]bool{
		"by": true, "without": true, "on": true, "ignoring": true,
		"group_left": true, "group_right": true,
	}
	aggregations = map[string]bool{
		"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
		"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true,
		"quantile": true, "limitk": true, "limit_ratio": true,
	}
)

func identStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func identChar(c byte) bool { return identStart(c) || (c >= '0' && c <= '9') }

// skipString returns the index after the string literal that starts at i.
func skipString(s string, i int) int {
	q := s[i]
	for i++; i < len(s) && s[i] != q; i++ {
		if s[i] == '\\' && q != '`' {
			i++
		}
	}
	return i + 1
}

// selectors scans a PromQL expression for its vector selectors. It skips strings,
// ranges, numbers, keywords, function and aggregation names, and the label lists of
// grouping clauses; Prometheus itself parses the expressions in TestQueriesParse.
func selectors(expr string) []selector {
	var out []selector
	brackets, parens := 0, 0
	var labelLists []int
	expectList := false
	skipSpace := func(j int) int {
		for j < len(expr) && strings.ContainsRune(" \t\r\n", rune(expr[j])) {
			j++
		}
		return j
	}
	// braces returns the matcher text of the {…} at i and the index after it.
	braces := func(i int) (string, int) {
		start := i + 1
		for i++; i < len(expr) && expr[i] != '}'; {
			if expr[i] == '"' || expr[i] == '\'' || expr[i] == '`' {
				i = skipString(expr, i)
			} else {
				i++
			}
		}
		return expr[start:min(i, len(expr))], i + 1
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(expr, i)
		case c == '{': // a selector with no metric name
			m, next := braces(i)
			out = append(out, selector{Matchers: m})
			i = next
		case c == '[':
			brackets++
			i++
		case c == ']':
			brackets--
			i++
		case c == '(':
			parens++
			if expectList {
				labelLists = append(labelLists, parens)
				expectList = false
			}
			i++
		case c == ')':
			if n := len(labelLists); n > 0 && labelLists[n-1] == parens {
				labelLists = labelLists[:n-1]
			}
			parens--
			i++
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (identChar(expr[i]) || expr[i] == '.') {
				i++
			}
		case identStart(c):
			start := i
			for i < len(expr) && identChar(expr[i]) {
				i++
			}
			word := expr[start:i]
			lw := strings.ToLower(word)
			if brackets > 0 || len(labelLists) > 0 {
				continue
			}
			if keywords[lw] {
				expectList = labelListKeywords[lw]
				continue
			}
			expectList = false
			j := skipSpace(i)
			if j < len(expr) && expr[j] == '(' {
				continue // function or aggregation
			}
			k := j
			for k < len(expr) && identChar(expr[k]) {
				k++
			}
			if next := strings.ToLower(expr[j:k]); aggregations[lw] && (next == "by" || next == "without") {
				continue
			}
			sel := selector{Name: word}
			if j < len(expr) && expr[j] == '{' {
				sel.Matchers, i = braces(j)
			}
			out = append(out, sel)
		default:
			i++
		}
	}
	return out
}

var matcherRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)

// hasMatcher reports whether the matcher text contains label op "value".
func hasMatcher(matchers, label, op, value string) bool {
	for _, m := range matcherRE.FindAllStringSubmatch(matchers, -1) {
		if m[1] == label && m[2] == op && m[3] == value {
			return true
		}
	}
	return false
}

var (
	counterCallRE = regexp.MustCompile(`\b(rate|irate|increase)\s*\(`)
	// counterCallArgRE matches a call whose argument is one selector with its range.
	counterCallArgRE = regexp.MustCompile(`\b(rate|irate|increase)\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?\s*\[([^\]]*)\]\s*\)`)
	variableRE       = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?`)
	labelValuesRE    = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
)

// checkExpr returns what is wrong with one panel query.
func checkExpr(expr string, allowed map[string]bool, vars []string) []string {
	var errs []string
	sels := selectors(expr)
	if len(sels) == 0 {
		errs = append(errs, "selects no metric")
	}
	for _, s := range sels {
		if s.Name != "" && !allowed[s.Name] {
			errs = append(errs, fmt.Sprintf("metric %s is not exported (not in %s)", s.Name, scenarioExposition))
		}
		if !hasMatcher(s.Matchers, "job", "=~", "$job") || !hasMatcher(s.Matchers, "instance", "=~", "$instance") {
			errs = append(errs, fmt.Sprintf(`selector %s{%s} lacks job=~"$job",instance=~"$instance"`, s.Name, s.Matchers))
		}
	}
	calls := counterCallRE.FindAllString(expr, -1)
	args := counterCallArgRE.FindAllStringSubmatch(expr, -1)
	if len(args) != len(calls) {
		errs = append(errs, "rate, irate and increase must take one counter selector with a range")
	}
	for _, a := range args {
		if !strings.HasSuffix(a[2], "_total") {
			errs = append(errs, fmt.Sprintf("%s(%s): only *_total counters take rate, irate or increase", a[1], a[2]))
		}
		if a[4] != "$__rate_interval" {
			errs = append(errs, fmt.Sprintf("%s(%s[%s]): use [$__rate_interval]", a[1], a[2], a[4]))
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
	allowed := map[string]bool{"a_total": true, "g": true}
	vars := []string{"job", "instance", "service"}
	const f = `job=~"$job",instance=~"$instance"`
	for _, tc := range []struct {
		expr string
		bad  bool
	}{
		{`sum by (x) (rate(a_total{` + f + `}[$__rate_interval])) / on (job) group_left g{` + f + `,service=~"$service"}`, false},
		{`max by (l) (changes(g{` + f + `}[5m])) > 0 and g{` + f + `}`, false},
		{`g{job=~"$job"}`, true},                                    // no instance filter
		{`g{` + f + `} / g`, true},                                  // unfiltered selector
		{`{` + f + `} or {job="x"}`, true},                          // nameless selector without filters
		{`rate(a_total{` + f + `}[5m])`, true},                      // fixed range
		{`rate(g{` + f + `}[$__rate_interval])`, true},              // rate of a gauge
		{`increase((a_total{` + f + `})[$__rate_interval:])`, true}, // not a plain selector
		{`unknown_metric{` + f + `}`, true},                         // not exported
		{`g{` + f + `,lease=~"$lease"}`, true},                      // unknown variable
		{`g{` + f + `,x="a\"}b"} + g{` + f + `}`, false},            // braces inside strings
		{`sum without (instance) (g{` + f + `}) by (job)`, false},   // label lists
		{`count by (job) (g{` + f + `}) + count{` + f + `}`, true},  // "count" metric not exported
	} {
		if errs := checkExpr(tc.expr, allowed, vars); (len(errs) > 0) != tc.bad {
			t.Errorf("checkExpr(%s): %q, want bad=%v", tc.expr, errs, tc.bad)
		}
	}
}

func TestDashboardConventions(t *testing.T) {
	allowed := exposedMetrics(t)
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
		for _, name := range []string{"job", "instance"} {
			if _, ok := byName[name]; !ok {
				t.Errorf("%s: variable %s is missing", file, name)
			}
		}
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
				t.Errorf("%s: variable %s must use the datasource variable", file, v.Name)
			}
			if !v.IncludeAll || v.AllValue != ".+" {
				t.Errorf("%s: variable %s needs includeAll and allValue \".+\"", file, v.Name)
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
			sels := selectors(m[1])
			if len(sels) != 1 || !allowed[sels[0].Name] {
				t.Errorf("%s: variable %s: %q is not one selector of an exported metric", file, v.Name, m[1])
				continue
			}
			job := hasMatcher(sels[0].Matchers, "job", "=~", "$job")
			inst := hasMatcher(sels[0].Matchers, "instance", "=~", "$instance")
			switch v.Name {
			case "job":
				if sels[0].Name != "pg_liveness_up" || sels[0].Matchers != "" {
					t.Errorf("%s: variable job: want label_values(pg_liveness_up, job), got %q", file, q)
				}
			case "instance":
				if sels[0].Name != "pg_liveness_up" || !job || inst {
					t.Errorf("%s: variable instance: want label_values(pg_liveness_up{job=~\"$job\"}, instance), got %q", file, q)
				}
			default:
				if !job || !inst {
					t.Errorf("%s: variable %s: %q must filter by job and instance", file, v.Name, q)
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

// TestQueriesParse runs every panel query through promtool: the queries, with the
// variables replaced, become recording rules in a temporary rule file, and promtool
// check rules parses them as PromQL.
func TestQueriesParse(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: apt-get install prometheus")
	}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	var where []string
	for file, d := range loadDashboards(t) {
		for _, p := range allPanels(d.Panels) {
			for _, tg := range p.Targets {
				expr := strings.ReplaceAll(tg.Expr, "$__rate_interval", "1m")
				expr = variableRE.ReplaceAllString(expr, ".+")
				rules = append(rules, rule{Record: fmt.Sprintf("dashboard_query_%d", len(rules)), Expr: expr})
				where = append(where, fmt.Sprintf("%s panel %d %q target %s", file, p.ID, p.Title, tg.RefID))
			}
		}
	}
	if len(rules) == 0 {
		t.Fatal("no queries")
	}
	file := map[string]any{"groups": []any{map[string]any{"name": "dashboards", "rules": rules}}}
	b, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.rules.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput()
	if err != nil {
		for i, r := range rules {
			if strings.Contains(string(out), `"`+r.Record+`"`) {
				t.Logf("%s: %s", where[i], r.Expr)
			}
		}
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("SUCCESS: %d rules found", len(rules)); !strings.Contains(string(out), want) {
		t.Fatalf("promtool check rules: want %q in\n%s", want, out)
	}
}
