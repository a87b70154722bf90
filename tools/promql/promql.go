// Package promql parses PromQL with Prometheus' own parser, for the tests of the alert
// rules (alerts/) and the dashboards (dashboards/): the metric names an expression
// selects, its selectors' label matchers, and its calls of the counter functions. It is
// in the tools module because the Prometheus module it needs must not reach the
// exporter's dependencies.
package promql

import (
	"slices"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// promqlParser parses with the grammar and the default options of a Prometheus server.
var promqlParser = parser.NewParser(parser.Options{})

// ParseExpr parses a PromQL expression as Prometheus does.
func ParseExpr(expr string) (parser.Expr, error) {
	return promqlParser.ParseExpr(expr)
}

// Selector is one vector selector of an expression.
type Selector struct {
	// Name is the metric name, from the name before the braces or a __name__="…"
	// matcher; empty when the selector names no single metric.
	Name string
	// Matchers are the label matchers other than the one on the metric name.
	Matchers []*labels.Matcher
}

// Has reports whether the selector has the matcher label op "value".
func (s Selector) Has(label string, op labels.MatchType, value string) bool {
	return slices.ContainsFunc(s.Matchers, func(m *labels.Matcher) bool {
		return m.Name == label && m.Type == op && m.Value == value
	})
}

// Selectors returns the vector selectors of a parsed expression, depth first, which is
// the order they are written in.
func Selectors(expr parser.Expr) []Selector {
	var out []Selector
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := Selector{Name: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel {
				s.Matchers = append(s.Matchers, m)
			} else if m.Type == labels.MatchEqual {
				s.Name = m.Value
			}
		}
		out = append(out, s)
		return nil
	})
	return out
}

// MetricNames returns the metric names an expression selects, in the order they are
// written, without duplicates.
func MetricNames(expr parser.Expr) []string {
	var names []string
	for _, s := range Selectors(expr) {
		if s.Name != "" && !slices.Contains(names, s.Name) {
			names = append(names, s.Name)
		}
	}
	return names
}

// CounterCall is a call of rate, irate or increase, the functions that only make sense on
// a counter.
type CounterCall struct {
	Func string
	// Metric is the metric of the argument when the argument is a plain selector with a
	// range (metric{…}[range]); empty otherwise (a subquery, or a selector by matchers
	// only), since then which series it reads cannot be checked.
	Metric string
	Range  time.Duration
}

// CounterCalls returns the calls of rate, irate and increase in a parsed expression.
func CounterCalls(expr parser.Expr) []CounterCall {
	var out []CounterCall
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		call, ok := n.(*parser.Call)
		if !ok || !slices.Contains([]string{"rate", "irate", "increase"}, call.Func.Name) {
			return nil
		}
		c := CounterCall{Func: call.Func.Name}
		if ms, ok := call.Args[0].(*parser.MatrixSelector); ok {
			if s := Selectors(ms.VectorSelector); len(s) == 1 {
				c.Metric, c.Range = s[0].Name, ms.Range
			}
		}
		out = append(out, c)
		return nil
	})
	return out
}
