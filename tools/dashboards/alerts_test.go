package dashboards

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/pg-liveness/pg_liveness_exporter/tools/markdown"
	"github.com/pg-liveness/pg_liveness_exporter/tools/promql"
)

// The dashboards show the alerts' numbers and link to their runbooks. These tests read
// the rules file and the runbooks, so that a change on either side that the other does
// not follow fails here.

const (
	rulesFile      = "../../alerts/pg_liveness.rules.yml"
	runbooksFile   = "../../docs/runbooks.md"
	runbookURLBase = "https://github.com/pg-liveness/pg_liveness_exporter/blob/main/docs/runbooks.md#"
	// thresholdLegendSuffix marks a target that draws an alert's threshold: its legend is
	// "<alert> threshold", and its query is the right-hand side of the alert's comparison.
	thresholdLegendSuffix = " threshold"
)

// alertRule is one alert of the rules file, with the numbers the dashboards show.
type alertRule struct {
	name string
	expr parser.Expr
	// bound is the alert's first comparison against a number, depth first and left to
	// right: "pg_liveness_up == 0" is {==, 0}, "changes(...) >= 3 and ..." is {>=, 3}.
	// ok is false for an alert that compares with no number.
	bound comparison
	// rhs is the right-hand side of an alert that is one comparison of two vectors at its
	// top (the heartbeat write rates: measured > expected); nil otherwise. Such a
	// threshold moves with the fleet, so a dashboard draws it as a query.
	rhs parser.Expr
}

type comparison struct {
	op    string
	value float64
	ok    bool
}

func loadAlerts(t *testing.T) map[string]alertRule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	// The rules' own tests (tools/alerts) check the file with promtool and Prometheus;
	// here only the alerts' names and expressions matter.
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	out := map[string]alertRule{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			e, err := promql.ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("%s: %s: %v", rulesFile, r.Alert, err)
			}
			a := alertRule{name: r.Alert, expr: e, bound: firstBound(e)}
			if b, ok := e.(*parser.BinaryExpr); ok && b.Op.IsComparisonOperator() && !isNumber(b.LHS) && !isNumber(b.RHS) {
				a.rhs = b.RHS
			}
			out[r.Alert] = a
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no alerts", rulesFile)
	}
	return out
}

func isNumber(e parser.Expr) bool {
	_, ok := unparen(e).(*parser.NumberLiteral)
	return ok
}

func unparen(e parser.Expr) parser.Expr {
	for {
		p, ok := e.(*parser.ParenExpr)
		if !ok {
			return e
		}
		e = p.Expr
	}
}

// firstBound returns the first comparison against a number literal in e.
func firstBound(e parser.Expr) comparison {
	var found comparison
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		b, ok := n.(*parser.BinaryExpr)
		if found.ok || !ok || !b.Op.IsComparisonOperator() {
			return nil
		}
		if num, ok := unparen(b.RHS).(*parser.NumberLiteral); ok {
			found = comparison{op: b.Op.String(), value: num.Val, ok: true}
		}
		return nil
	})
	return found
}

// countUnits are the units of panels whose values are whole numbers.
var countUnits = []string{"short", "none"}

// wantSteps returns the threshold steps (beyond the base colour) and colours with which a
// panel of this unit colours exactly the values on which the alert's bound holds: Grafana
// colours a value with the last step at or below it, so "> 0" on a count is a step at 1,
// "> 300" on seconds a step at 300 (it differs only at 300 itself), ">= 0.75" a step at
// 0.75, and "== 0" of a 0/1 gauge a red base with green from 1.
func wantSteps(c comparison, unit string) (base string, step float64, color string, err error) {
	count := slices.Contains(countUnits, unit)
	switch {
	case c.op == ">=":
		return "green", c.value, "red", nil
	case c.op == ">" && count && c.value == math.Trunc(c.value):
		return "green", c.value + 1, "red", nil
	case c.op == ">":
		return "green", c.value, "red", nil
	case c.op == "==" && c.value == 0 && count:
		return "red", 1, "green", nil
	}
	return "", 0, "", fmt.Errorf("no threshold steps show the bound %s %v on a panel of unit %q", c.op, c.value, unit)
}

// stripFilters returns the expression as text without the dashboards' cluster, namespace,
// job, instance and database matchers, so that it can be compared with a rule's.
func stripFilters(e parser.Expr) string {
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			vs.LabelMatchers = slices.DeleteFunc(vs.LabelMatchers, func(m *labels.Matcher) bool {
				return m.Type == labels.MatchRegexp && m.Value == "$"+m.Name &&
					slices.Contains([]string{"cluster", "namespace", "job", "instance", "database"}, m.Name)
			})
		}
		return nil
	})
	return e.String()
}

// runbookAnchors returns the anchors GitHub gives the headings of the runbooks.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	anchors, err := markdown.Anchors(runbooksFile)
	if err != nil {
		t.Fatal(err)
	}
	return anchors
}

// linkedAlerts returns the alerts whose runbooks a panel links to.
func linkedAlerts(p panel) []string {
	var out []string
	for _, l := range p.Links {
		if a, ok := strings.CutPrefix(l.URL, runbookURLBase); ok && strings.HasPrefix(a, "pgliveness") {
			out = append(out, a)
		}
	}
	return out
}

func byAnchor(alerts map[string]alertRule) map[string]alertRule {
	out := map[string]alertRule{}
	for name, a := range alerts {
		out[strings.ToLower(name)] = a
	}
	return out
}

func TestWantSteps(t *testing.T) {
	for _, tc := range []struct {
		c     comparison
		unit  string
		base  string
		step  float64
		color string
		bad   bool
	}{
		{comparison{">", 0, true}, "short", "green", 1, "red", false},
		{comparison{">", 1, true}, "none", "green", 2, "red", false},
		{comparison{">", 300, true}, "s", "green", 300, "red", false},
		{comparison{">", 0.5, true}, "short", "green", 0.5, "red", false},
		{comparison{">=", 0.75, true}, "percentunit", "green", 0.75, "red", false},
		{comparison{"==", 0, true}, "none", "red", 1, "green", false},
		{comparison{"==", 0, true}, "s", "", 0, "", true},
		{comparison{"<", 5, true}, "s", "", 0, "", true},
	} {
		base, step, color, err := wantSteps(tc.c, tc.unit)
		if (err != nil) != tc.bad || base != tc.base || step != tc.step || color != tc.color {
			t.Errorf("wantSteps(%v, %q) = %q, %v, %q, %v", tc.c, tc.unit, base, step, color, err)
		}
	}
}

// TestThresholdsMatchAlerts checks every number a dashboard colours or draws against the
// alert it stands for: a panel with threshold steps links to the runbook of each alert
// they mirror and has exactly the steps of wantSteps for each; a target drawn as
// "<alert> threshold" is the right-hand side of that alert's comparison, the rule's own
// expression with the dashboards' filters; and every alert with such a moving threshold
// is drawn on some panel.
func TestThresholdsMatchAlerts(t *testing.T) {
	alerts := loadAlerts(t)
	anchored := byAnchor(alerts)
	drawn := map[string]bool{}
	for file, d := range loadDashboards(t) {
		for _, p := range allPanels(d.Panels) {
			if p.Type == "row" {
				continue
			}
			where := fmt.Sprintf("%s: panel %d %q", file, p.ID, p.Title)
			linked := linkedAlerts(p)
			steps := p.FieldConfig.Defaults.Thresholds.Steps
			if len(steps) == 0 || steps[0].Value != nil {
				t.Errorf("%s: thresholds must start with a base step (value null)", where)
				continue
			}
			if len(steps) > 1 {
				if len(linked) == 0 {
					t.Errorf("%s: has threshold steps but links to no alert's runbook; every threshold is an alert's", where)
				}
				if len(steps) != 2 {
					t.Errorf("%s: %d threshold steps beyond the base; an alert's bound is one step", where, len(steps)-1)
				}
				if p.Type == "timeseries" && p.FieldConfig.Defaults.Custom.ThresholdsStyle.Mode != "dashed" {
					t.Errorf("%s: draw the alert's threshold: fieldConfig.defaults.custom.thresholdsStyle.mode \"dashed\"", where)
				}
				for _, anchor := range linked {
					a, known := anchored[anchor]
					if !known {
						t.Errorf("%s: links to runbook #%s, which is no alert's", where, anchor)
						continue
					}
					if !a.bound.ok {
						t.Errorf("%s: threshold steps for %s, whose expression compares with no number", where, a.name)
						continue
					}
					base, step, color, err := wantSteps(a.bound, p.FieldConfig.Defaults.Unit)
					if err != nil {
						t.Errorf("%s: %s: %v", where, a.name, err)
						continue
					}
					got := steps[len(steps)-1]
					if steps[0].Color != base || got.Value == nil || *got.Value != step || got.Color != color {
						t.Errorf("%s: thresholds %s, then %s from %v; %s fires on %s %v, so want %s, then %s from %v",
							where, steps[0].Color, got.Color, deref(got.Value), a.name, a.bound.op, a.bound.value, base, color, step)
					}
				}
			}
			for _, tg := range p.Targets {
				name, ok := strings.CutSuffix(tg.LegendFormat, thresholdLegendSuffix)
				if !ok {
					continue
				}
				a, known := alerts[name]
				if !known || a.rhs == nil {
					t.Errorf("%s: target %s is drawn as %q, but %s is not an alert that compares two vectors", where, tg.RefID, tg.LegendFormat, name)
					continue
				}
				if !slices.Contains(linked, strings.ToLower(name)) {
					t.Errorf("%s: target %s draws %s's threshold; link to its runbook", where, tg.RefID, name)
				}
				e, err := parseExpr(tg.Expr)
				if err != nil {
					t.Errorf("%s: target %s: %v", where, tg.RefID, err)
					continue
				}
				if got, want := stripFilters(e), a.rhs.String(); got != want {
					t.Errorf("%s: target %s draws %s's threshold as\n\t%s\nbut the rule compares with\n\t%s", where, tg.RefID, name, got, want)
				}
				drawn[name] = true
			}
		}
	}
	for name, a := range alerts {
		if a.rhs != nil && !drawn[name] {
			t.Errorf("%s compares with a threshold that moves with the fleet; no panel draws it as a %q target", name, name+thresholdLegendSuffix)
		}
	}
}

func deref(v *float64) any {
	if v == nil {
		return "null"
	}
	return *v
}

var alertNameRE = regexp.MustCompile(`\bPgLiveness[A-Z][A-Za-z]+\b`)

// TestLinksResolve checks that every dashboard links to the other two and to the
// runbooks, that every link (of a dashboard or a panel) opens a shipped dashboard by its
// uid or a heading of docs/runbooks.md, and that a panel that names an alert links to its
// runbook.
func TestLinksResolve(t *testing.T) {
	alerts := loadAlerts(t)
	anchors := runbookAnchors(t)
	uids := map[string]bool{}
	for _, uid := range wantUIDs {
		uids[uid] = true
	}
	check := func(where string, l link) (uid, anchor string) {
		if l.Type != "link" || l.Title == "" {
			t.Errorf("%s: link %q: want type \"link\" with a title, got type %q", where, l.URL, l.Type)
		}
		if u, ok := strings.CutPrefix(l.URL, "/d/"); ok {
			if !uids[u] {
				t.Errorf("%s: link %q: no dashboard has uid %q", where, l.URL, u)
			}
			if !l.KeepTime || !l.IncludeVars {
				t.Errorf("%s: link %q to a dashboard must keep the time range and the variables", where, l.URL)
			}
			return u, ""
		}
		if a, ok := strings.CutPrefix(l.URL, runbookURLBase); ok {
			if !anchors[a] {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", where, l.URL, runbooksFile, a)
			}
			return "", a
		}
		t.Errorf("%s: link %q opens neither a dashboard (/d/<uid>) nor a runbook (%s<anchor>)", where, l.URL, runbookURLBase)
		return "", ""
	}
	for file, d := range loadDashboards(t) {
		linked := map[string]bool{}
		runbooks := false
		for _, l := range d.Links {
			uid, anchor := check(file, l)
			linked[uid] = true
			runbooks = runbooks || anchor != ""
		}
		for _, uid := range wantUIDs {
			if uid != d.UID && !linked[uid] {
				t.Errorf("%s: no link to dashboard %s", file, uid)
			}
		}
		if !runbooks {
			t.Errorf("%s: no link to the runbooks", file)
		}
		for _, p := range allPanels(d.Panels) {
			where := fmt.Sprintf("%s: panel %d %q", file, p.ID, p.Title)
			for _, l := range p.Links {
				check(where, l)
			}
			linkedHere := linkedAlerts(p)
			for _, name := range alertNameRE.FindAllString(p.Title+" "+p.Description, -1) {
				if _, ok := alerts[name]; !ok {
					t.Errorf("%s: names %s, which is not an alert in %s", where, name, rulesFile)
				} else if !slices.Contains(linkedHere, strings.ToLower(name)) {
					t.Errorf("%s: names %s but does not link to its runbook", where, name)
				}
			}
		}
	}
}
