package promql

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// exprCase is an expression and what a function of its parse returns for it.
type exprCase[E comparable] struct {
	expr string
	want []E
}

// checkExprs parses each case's expression and checks what f returns for it.
func checkExprs[E comparable](t *testing.T, name string, f func(parser.Expr) []E, cases []exprCase[E]) {
	t.Helper()
	for _, tc := range cases {
		e, err := ParseExpr(tc.expr)
		if err != nil {
			t.Errorf("ParseExpr(%q): %v", tc.expr, err)
			continue
		}
		if got := f(e); !slices.Equal(got, tc.want) {
			t.Errorf("%s(%q) = %+v, want %+v", name, tc.expr, got, tc.want)
		}
	}
}

func TestMetricNames(t *testing.T) {
	checkExprs(t, "MetricNames", MetricNames, []exprCase[string]{
		{`up{job=~"pg_liveness.*"} == 0`, []string{"up"}},
		{`-pg_liveness_lease_expires_in_seconds > 300`, []string{"pg_liveness_lease_expires_in_seconds"}},
		{`time() - pg_liveness_agent_last_heartbeat_timestamp_seconds > 120`,
			[]string{"pg_liveness_agent_last_heartbeat_timestamp_seconds"}},
		{`sum without (backend_state) (pg_liveness_advisory_lock_holders{backend_state=~"idle.*"}) / on (job, instance, application_name) group_left (foo) pg_liveness_backends >= 0.75`,
			[]string{"pg_liveness_advisory_lock_holders", "pg_liveness_backends"}},
		{`sum(x) by (job) and ignoring(instance) y offset 5m unless on() vector(1)`, []string{"x", "y"}},
		{"a_metric{l=\"say \\\"hi\\\" b_metric\"} # c_metric in a comment\n or max_over_time(d_metric[1h30m:5m])",
			[]string{"a_metric", "d_metric"}},
		{`max_over_time(pg_liveness_lease_epoch[30m]) + 1e3 * 0x1f + inf + nan`, []string{"pg_liveness_lease_epoch"}},
		{`histogram_quantile(0.9, sum by (le) (rate(req_duration_seconds_bucket[5m]))) > bool 1`,
			[]string{"req_duration_seconds_bucket"}},
		{`pg_livenes_up == 0`, []string{"pg_livenes_up"}}, // a typo is a name, and the exposed set rejects it
		{`vector(1)`, nil},
		{"count without(instance)\n(up) + count", []string{"up", "count"}}, // a metric may be named like an aggregation
		{`{__name__="by_matcher", job="x"} or x`, []string{"by_matcher", "x"}},
		{`x + x`, []string{"x"}},
	})
}

func TestParseExprRejectsWhatPrometheusRejects(t *testing.T) {
	for _, expr := range []string{
		`sum by (job) (x`,           // unbalanced
		`rate(x_total)`,             // rate needs a range
		`x{job="a"`,                 // unclosed braces
		`no_such_function(x)`,       // unknown function
		`x and on (a) group_left y`, // group_left with a set operator
		`{job=~".*"}`,               // a selector that matches every series
	} {
		if _, err := ParseExpr(expr); err == nil {
			t.Errorf("ParseExpr(%q) succeeded, want an error", expr)
		}
	}
}

func TestSelectorMatchers(t *testing.T) {
	e, err := ParseExpr(`a{job=~"$job",instance=~"$instance"} / {__name__="b", x!="1"}`)
	if err != nil {
		t.Fatal(err)
	}
	s := Selectors(e)
	if len(s) != 2 || s[0].Name != "a" || s[1].Name != "b" {
		t.Fatalf("selectors: %+v", s)
	}
	if !s[0].Has("job", labels.MatchRegexp, "$job") || !s[0].Has("instance", labels.MatchRegexp, "$instance") {
		t.Errorf("a: matchers %v lack the job and instance filters", s[0].Matchers)
	}
	if s[0].Has("job", labels.MatchEqual, "$job") || len(s[1].Matchers) != 1 || !s[1].Has("x", labels.MatchNotEqual, "1") {
		t.Errorf("matchers: a %v, b %v", s[0].Matchers, s[1].Matchers)
	}
}

func TestCounterCalls(t *testing.T) {
	checkExprs(t, "CounterCalls", CounterCalls, []exprCase[CounterCall]{
		{`rate(pg_liveness_statement_calls_total{statement="heartbeat"}[10m])`,
			[]CounterCall{{"rate", "pg_liveness_statement_calls_total", 10 * time.Minute}}},
		{`increase( pg_liveness_agent_heartbeats_total [5m]) - irate(x_total[1m])`,
			[]CounterCall{{"increase", "pg_liveness_agent_heartbeats_total", 5 * time.Minute}, {"irate", "x_total", time.Minute}}},
		{`sum(increase(pg_liveness_lease_epoch{lease="a"}[1h]))`,
			[]CounterCall{{"increase", "pg_liveness_lease_epoch", time.Hour}}},
		{`rate((x_total)[5m:])`, []CounterCall{{Func: "rate"}}}, // not a plain selector: cannot be checked
		{`changes(pg_liveness_lease_epoch[30m]) + deriv(pg_liveness_up[5m])`, nil},
	})
}
