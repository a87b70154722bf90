package alerts

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/tools/markdown"
	"github.com/pg-liveness/pg_liveness_exporter/tools/promql"
)

// The files under test, in the root module, from this folder.
const (
	rulesFile      = "../../alerts/pg_liveness.rules.yml"
	testsDir       = "../../alerts/tests"
	runbooksFile   = "../../docs/runbooks.md"
	runbookURLBase = "https://github.com/pg-liveness/pg_liveness_exporter/blob/main/docs/runbooks.md#"
	// Every unit-test file names the rules with exactly this line, so that the mutation
	// test can point a copy of it at a modified rule file.
	ruleFilesLine = "  - ../pg_liveness.rules.yml"
)

var severities = []string{"critical", "warning", "info"}

// syntheticMetrics are series Prometheus writes itself for every target.
var syntheticMetrics = map[string]bool{"up": true}

// alertingRules flattens the groups to their alerting rules.
func alertingRules(t *testing.T, groups []apiGroup) []apiRule {
	t.Helper()
	var rules []apiRule
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Type != "alerting" {
				t.Errorf("group %s: rule %s is %s; this file holds alerting rules only", g.Name, r.Name, r.Type)
				continue
			}
			rules = append(rules, r)
		}
	}
	if len(rules) == 0 {
		t.Fatal("no alerting rules loaded")
	}
	return rules
}

func testFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(testsDir, "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no unit-test files in %s/ (%v)", testsDir, err)
	}
	return files
}

func runPromtool(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(proctest.NeedTool(t, "promtool", "prometheus"), args...).CombinedOutput()
	return string(out), err
}

// TestPromtoolCheckRules validates the rule file with promtool, lint errors included.
func TestPromtoolCheckRules(t *testing.T) {
	out, err := runPromtool(t, "check", "rules", "--lint=all", "--lint-fatal", rulesFile)
	if err != nil || !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool check rules %s: %v\n%s", rulesFile, err, out)
	}
}

// TestPromtoolUnitTests runs every unit-test file with promtool test rules.
func TestPromtoolUnitTests(t *testing.T) {
	files := testFiles(t)
	out, err := runPromtool(t, append([]string{"test", "rules"}, files...)...)
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	if got := strings.Count(out, "SUCCESS"); got != len(files) {
		t.Fatalf("promtool reported %d successes for %d files:\n%s", got, len(files), out)
	}
}

// databaseSuffix ends every summary: the database, in a fleet where one exporter or one
// job watches many.
const databaseSuffix = "{{ with $labels.database }} (database {{ . }}){{ end }}"

// TestRuleConventions checks labels, annotations and metric names of every alert.
func TestRuleConventions(t *testing.T) {
	rules := alertingRules(t, loadedRules(t))
	allowed := testutil.ExposedMetrics(t)
	anchors := runbookAnchors(t)
	seen := map[string]bool{}
	nameRE := regexp.MustCompile(`^PgLiveness[A-Z][A-Za-z]+$`)
	for _, r := range rules {
		if !nameRE.MatchString(r.Name) {
			t.Errorf("%s: alert names are PgLiveness followed by CamelCase words", r.Name)
		}
		if seen[r.Name] {
			t.Errorf("%s: defined twice", r.Name)
		}
		seen[r.Name] = true

		if sev := r.Labels["severity"]; !slices.Contains(severities, sev) {
			t.Errorf("%s: severity %q, want one of %v", r.Name, sev, severities)
		}
		for k := range r.Annotations {
			if k != "summary" && k != "description" && k != "runbook_url" {
				t.Errorf("%s: unexpected annotation %q", r.Name, k)
			}
		}
		// A summary is static text, but for the database it names when there is one
		// (/probe and discovery): the same words in single-database mode.
		summary := r.Annotations["summary"]
		static, named := strings.CutSuffix(summary, databaseSuffix+".")
		if !named || static == "" || strings.Contains(static, "{{") {
			t.Errorf("%s: summary %q must be static text ending with %q and a period", r.Name, summary, databaseSuffix)
		}
		if d := r.Annotations["description"]; !strings.Contains(d, "{{") {
			t.Errorf("%s: description %q must be templated", r.Name, d)
		}
		wantURL := runbookURLBase + strings.ToLower(r.Name)
		if u := r.Annotations["runbook_url"]; u != wantURL {
			t.Errorf("%s: runbook_url %q, want %q", r.Name, u, wantURL)
		} else if !anchors[strings.TrimPrefix(u, runbookURLBase)] {
			t.Errorf("%s: %s has no heading with anchor #%s", r.Name, runbooksFile, strings.ToLower(r.Name))
		}

		expr, err := promql.ParseExpr(r.Query)
		if err != nil {
			t.Errorf("%s: %v", r.Name, err)
			continue
		}
		names := promql.MetricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: expression %q selects no metric", r.Name, r.Query)
		}
		for _, n := range names {
			if !allowed[n] && !syntheticMetrics[n] {
				t.Errorf("%s: metric %s is not exported (not in %s)", r.Name, n, testutil.ScenarioExposition)
			}
		}
		for _, c := range promql.CounterCalls(expr) {
			if !strings.HasSuffix(c.Metric, "_total") {
				t.Errorf("%s: %s(%s): rate, irate and increase take a *_total counter", r.Name, c.Func, c.Metric)
			}
		}
	}
}

// runbookAnchors returns the anchors GitHub gives the headings of the runbooks.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	anchors, err := markdown.Anchors(runbooksFile)
	if err != nil {
		t.Fatalf("runbooks: %v", err)
	}
	return anchors
}

// TestRunbooksMatchAlerts checks that every alert has a "## <AlertName>" section and
// every such section has an alert.
func TestRunbooksMatchAlerts(t *testing.T) {
	rules := alertingRules(t, loadedRules(t))
	headings, err := markdown.Headings(runbooksFile)
	if err != nil {
		t.Fatalf("runbooks: %v", err)
	}
	sections := map[string]bool{}
	for _, h := range headings {
		if h.Level == 2 && strings.HasPrefix(h.Text, "PgLiveness") {
			sections[h.Text] = true
		}
	}
	alerts := map[string]bool{}
	for _, r := range rules {
		alerts[r.Name] = true
		if !sections[r.Name] {
			t.Errorf("%s has no \"## %s\" section in %s", r.Name, r.Name, runbooksFile)
		}
	}
	for s := range sections {
		if !alerts[s] {
			t.Errorf("%s: section \"## %s\" has no alert", runbooksFile, s)
		}
	}
}

// TestEveryAlertHasTests checks the layout of the unit tests: one file per alert, named
// after it, testing only that alert, with test groups named "fires: …", "quiet: …" and
// "missing: …" (the last feeds no series, or only some, of what the alert selects).
// TestUnitTestsCatchBrokenRules then proves the firing and quiet cases bite.
func TestEveryAlertHasTests(t *testing.T) {
	rules := alertingRules(t, loadedRules(t))
	alerts := map[string]bool{}
	for _, r := range rules {
		alerts[r.Name] = true
	}
	alertnameRE := regexp.MustCompile(`(?m)^\s*(?:-\s+)?alertname:\s*(\S+)\s*$`)
	groupNameRE := regexp.MustCompile(`(?m)^  - name: "(fires|quiet|missing): [^"]+"$`)
	covered := map[string]bool{}
	for _, f := range testFiles(t) {
		name := strings.TrimSuffix(filepath.Base(f), ".yml")
		if !alerts[name] {
			t.Errorf("%s: no alert named %s", f, name)
			continue
		}
		covered[name] = true
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if n := strings.Count(text, "\n"+ruleFilesLine+"\n"); n != 1 {
			t.Errorf("%s: want the rule_files entry %q once, found it %d times", f, strings.TrimSpace(ruleFilesLine), n)
		}
		for _, m := range alertnameRE.FindAllStringSubmatch(text, -1) {
			if m[1] != name {
				t.Errorf("%s: tests alert %s; keep each alert's tests in its own file", f, m[1])
			}
		}
		kinds := map[string]bool{}
		for _, m := range groupNameRE.FindAllStringSubmatch(text, -1) {
			kinds[m[1]] = true
		}
		if groups := strings.Count(text, "\n  - name: "); groups != len(groupNameRE.FindAllString(text, -1)) {
			t.Errorf("%s: every test group needs a name \"fires: …\", \"quiet: …\" or \"missing: …\"", f)
		}
		for _, k := range []string{"fires", "quiet", "missing"} {
			if !kinds[k] {
				t.Errorf("%s: no %q test group", f, k)
			}
		}
	}
	for name := range alerts {
		if !covered[name] {
			t.Errorf("%s has no unit tests: add %s/%s.yml", name, testsDir, name)
		}
	}
}

// TestUnitTestsCatchBrokenRules breaks each alert in two ways and checks that its own
// unit tests fail: removed, it must miss an expected firing; made to fire whenever its
// expression is empty, it must fire where a test expects silence. The unbroken rules,
// rendered the same way, must pass, so the failures come from the breakage.
func TestUnitTestsCatchBrokenRules(t *testing.T) {
	groups := loadedRules(t)
	rules := alertingRules(t, groups)
	dir := t.TempDir()

	// copyTests points copies of the unit-test files at rulePath.
	copyTests := func(t *testing.T, dir, rulePath string, files []string) []string {
		t.Helper()
		var out []string
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			text := strings.Replace(string(b), "\n"+ruleFilesLine+"\n", "\n  - "+rulePath+"\n", 1)
			if text == string(b) {
				t.Fatalf("%s: rule_files entry %q not found", f, strings.TrimSpace(ruleFilesLine))
			}
			dst := filepath.Join(dir, filepath.Base(f))
			if err := os.WriteFile(dst, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			out = append(out, dst)
		}
		return out
	}
	writeRules := func(t *testing.T, path string, groups []apiGroup) {
		t.Helper()
		b, err := ruleFileJSON(groups)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// mutate returns a copy of groups with rule name changed by f; f returning false
	// drops the rule.
	mutate := func(name string, f func(*apiRule) bool) []apiGroup {
		var out []apiGroup
		for _, g := range groups {
			ng := apiGroup{Name: g.Name}
			for _, r := range g.Rules {
				if r.Name == name && !f(&r) {
					continue
				}
				ng.Rules = append(ng.Rules, r)
			}
			out = append(out, ng)
		}
		return out
	}

	baseline := filepath.Join(dir, "baseline.rules.json")
	writeRules(t, baseline, groups)
	baseDir := filepath.Join(dir, "baseline")
	if err := os.Mkdir(baseDir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := copyTests(t, baseDir, baseline, testFiles(t))
	if out, err := runPromtool(t, append([]string{"test", "rules"}, files...)...); err != nil {
		t.Fatalf("unit tests fail on the rules as Prometheus loaded them: %v\n%s", err, out)
	}

	for _, r := range rules {
		testFile := filepath.Join(testsDir, r.Name+".yml")
		if _, err := os.Stat(testFile); err != nil {
			t.Errorf("%s: %v", r.Name, err)
			continue
		}
		for _, m := range []struct {
			name   string
			mutate func(*apiRule) bool
		}{
			{"removed", func(*apiRule) bool { return false }},
			{"always-fires", func(r *apiRule) bool {
				r.Query = "(" + r.Query + ") or on () vector(1)"
				return true
			}},
		} {
			t.Run(r.Name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				sub := filepath.Join(dir, r.Name+"-"+m.name)
				if err := os.Mkdir(sub, 0o700); err != nil {
					t.Fatal(err)
				}
				rulePath := filepath.Join(sub, "rules.json")
				writeRules(t, rulePath, mutate(r.Name, m.mutate))
				out, err := runPromtool(t, append([]string{"test", "rules"}, copyTests(t, sub, rulePath, []string{testFile})...)...)
				if err == nil {
					t.Errorf("%s still passes with %s %s:\n%s", testFile, r.Name, m.name, out)
				}
			})
		}
	}
}

// TestCriticalAlertsNameTheAction: a critical alert pages someone, so it must be one that
// needs action now, and its runbook section says which, in a paragraph that starts with
// "**Act now.**". Warnings and info alerts have none: they wait for working hours.
func TestCriticalAlertsNameTheAction(t *testing.T) {
	b, err := os.ReadFile(runbooksFile)
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	for _, part := range strings.Split(string(b), "\n## ")[1:] {
		name, body, _ := strings.Cut(part, "\n")
		sections[strings.TrimSpace(name)] = body
	}
	critical := 0
	for _, r := range alertingRules(t, loadedRules(t)) {
		act := strings.Contains(sections[r.Name], "\n**Act now.** ")
		switch sev := r.Labels["severity"]; {
		case sev == "critical" && !act:
			t.Errorf("%s is critical, but its runbook section names no action: add a paragraph starting **Act now.**", r.Name)
		case sev != "critical" && act:
			t.Errorf("%s is %s, but its runbook section says **Act now.**: page for it (critical) or drop the paragraph", r.Name, sev)
		}
		if r.Labels["severity"] == "critical" {
			critical++
		}
	}
	if critical == 0 {
		t.Error("no critical alert at all: nothing would page")
	}
}
