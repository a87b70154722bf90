package alerts

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The module does not depend on github.com/prometheus/prometheus, so expressions are not
// parsed with promql/parser here. promtool and Prometheus parse them (see rules_test.go);
// these helpers only scan the text. metricNamesInExpr skips string literals, comments,
// label matchers ({...}), ranges ([...]), numbers and durations, keywords, function names
// (an identifier followed by "(") and the label lists of by, without, on, ignoring,
// group_left and group_right; every identifier left is a metric name. Names given only
// through a {__name__="..."} matcher are not seen.

// promqlKeywords are identifiers that are operators or modifiers, not metric names.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "inf": true, "nan": true,
}

// aggregations can take their by or without clause before the parenthesised argument.
var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true,
	"quantile": true, "limitk": true, "limit_ratio": true,
}

// nextWord returns the identifier s starts with, if any.
func nextWord(s string) string {
	i := 0
	for i < len(s) && isIdentChar(s[i]) {
		i++
	}
	return s[:i]
}

// labelListKeywords are followed by a parenthesised list of label names.
var labelListKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true,
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentChar(c byte) bool {
	return isIdentStart(c) || (c >= '0' && c <= '9')
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// metricNamesInExpr returns the metric names a PromQL expression selects, in order of
// first appearance, without duplicates.
func metricNamesInExpr(expr string) []string {
	var names []string
	braces, brackets, parens := 0, 0, 0
	var labelLists []int // paren depths at which a label list was opened
	expectLabelList := false
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i++
			for i < len(expr) && expr[i] != c {
				if expr[i] == '\\' && c != '`' {
					i++
				}
				i++
			}
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '{':
			braces++
			i++
		case c == '}':
			braces--
			i++
		case c == '[':
			brackets++
			i++
		case c == ']':
			brackets--
			i++
		case c == '(':
			parens++
			if expectLabelList {
				labelLists = append(labelLists, parens)
				expectLabelList = false
			}
			i++
		case c == ')':
			if n := len(labelLists); n > 0 && labelLists[n-1] == parens {
				labelLists = labelLists[:n-1]
			}
			parens--
			i++
		case isDigit(c) || (c == '.' && i+1 < len(expr) && isDigit(expr[i+1])):
			// Numbers, hex, exponents and durations: 1.5, 0x1f, 1e3, 5m, 1h30m.
			for i < len(expr) && (isIdentChar(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			start := i
			for i < len(expr) && isIdentChar(expr[i]) {
				i++
			}
			word := expr[start:i]
			if braces > 0 || brackets > 0 || len(labelLists) > 0 {
				continue // a label name or a duration
			}
			if promqlKeywords[strings.ToLower(word)] {
				expectLabelList = labelListKeywords[strings.ToLower(word)]
				continue
			}
			expectLabelList = false
			j := i
			for j < len(expr) && (expr[j] == ' ' || expr[j] == '\t' || expr[j] == '\n' || expr[j] == '\r') {
				j++
			}
			if j < len(expr) && expr[j] == '(' {
				continue // a function call, or an aggregation with its clause after it
			}
			if k := strings.ToLower(nextWord(expr[j:])); aggregations[strings.ToLower(word)] && (k == "by" || k == "without") {
				continue // sum by (…) (…)
			}
			if !slices.Contains(names, word) {
				names = append(names, word)
			}
		default:
			i++
		}
	}
	return names
}

// syntheticMetrics are series Prometheus writes itself for every target.
var syntheticMetrics = map[string]bool{"up": true}

// counterFuncRE finds the first argument of rate(), irate() and increase().
var counterFuncRE = regexp.MustCompile(`\b(rate|irate|increase)\s*\(\s*([^\s{\[(),]*)`)

// counterFuncMisuse returns the calls of rate, irate or increase whose argument is not a
// plain selector of a *_total counter: these functions are meaningless on a gauge.
func counterFuncMisuse(expr string) []string {
	var bad []string
	for _, m := range counterFuncRE.FindAllStringSubmatch(expr, -1) {
		if !strings.HasSuffix(m[2], "_total") {
			bad = append(bad, m[1]+"("+m[2]+")")
		}
	}
	return bad
}

func TestMetricNamesInExpr(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up{job=~"pg_liveness.*"} == 0`, []string{"up"}},
		{`pg_liveness_up == 0`, []string{"pg_liveness_up"}},
		{`-pg_liveness_lease_expires_in_seconds > 300`, []string{"pg_liveness_lease_expires_in_seconds"}},
		{`time() - pg_liveness_agent_last_heartbeat_timestamp_seconds > 120`,
			[]string{"pg_liveness_agent_last_heartbeat_timestamp_seconds"}},
		{`sum by (job, instance) (rate(pg_liveness_statement_calls_total{statement="heartbeat"}[10m])) > 1.5 * sum by (job, instance) (pg_liveness_instances{state=~"alive|lock_only"}) / 30`,
			[]string{"pg_liveness_statement_calls_total", "pg_liveness_instances"}},
		{`sum without (backend_state) (pg_liveness_advisory_lock_holders{backend_state=~"idle.*"}) / on (job, instance, application_name) group_left (foo) pg_liveness_backends >= 0.75`,
			[]string{"pg_liveness_advisory_lock_holders", "pg_liveness_backends"}},
		{`sum(x) by (job) and ignoring(instance) y offset 5m unless on() vector(1)`, []string{"x", "y"}},
		{"a_metric{l=\"say \\\"hi\\\" b_metric\"} # c_metric in a comment\n or d_metric[1h30m:5m]",
			[]string{"a_metric", "d_metric"}},
		{`max_over_time(pg_liveness_lease_epoch[30m]) + 1e3 * 0x1f + inf + nan`, []string{"pg_liveness_lease_epoch"}},
		{`x * on(a) group_left y`, []string{"x", "y"}},
		{`histogram_quantile(0.9, sum by (le) (rate(req_duration_seconds_bucket[5m]))) > bool 1`,
			[]string{"req_duration_seconds_bucket"}},
		{`pg_livenes_up == 0`, []string{"pg_livenes_up"}}, // a typo is a name, and the exposed set rejects it
		{`vector(1)`, nil},
		{"count without(instance)\n(up) + count", []string{"up", "count"}}, // a metric may be named like an aggregation
	} {
		if got := metricNamesInExpr(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("metricNamesInExpr(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

func TestCounterFuncMisuse(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`rate(pg_liveness_statement_calls_total{statement="heartbeat"}[10m])`, nil},
		{`increase( pg_liveness_agent_heartbeats_total [5m]) - irate(x_total[1m])`, nil},
		{`rate(pg_liveness_instances[5m])`, []string{"rate(pg_liveness_instances)"}},
		{`sum(increase(pg_liveness_lease_epoch{lease="a"}[1h]))`, []string{"increase(pg_liveness_lease_epoch)"}},
		{`rate((x_total)[5m:])`, []string{"rate()"}}, // not a plain selector: cannot be checked
		{`changes(pg_liveness_lease_epoch[30m]) + deriv(pg_liveness_up[5m])`, nil},
	} {
		if got := counterFuncMisuse(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("counterFuncMisuse(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}
