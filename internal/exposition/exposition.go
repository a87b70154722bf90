// Package exposition writes and reads the Prometheus text exposition format.
//
// The exporter writes its samples with a Builder per collector, straight into buffers
// that are reused from scrape to scrape, instead of building a const metric per series
// and letting a registry check, sort and encode them. MetricNames reads metric names out
// of text exposition, so that tests can check alert rules, dashboards and the README
// against what the exporter really exposes (collector/testdata/scenario.prom, which the
// collector scenario test asserts).
package exposition

import (
	"fmt"
	"os"
	"strings"
)

// MetricNames returns the metric names declared by "# TYPE" lines, as written there
// (counters carry their _total suffix in the text format); histograms and summaries add
// the series names Prometheus stores for them. Every sample must belong to a declared
// family, or the set would silently miss it.
func MetricNames(text string) (map[string]bool, error) {
	names := map[string]bool{}
	var samples []string
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		switch {
		case len(f) == 4 && f[0] == "#" && f[1] == "TYPE":
			names[f[2]] = true
			switch f[3] {
			case "histogram":
				names[f[2]+"_bucket"], names[f[2]+"_sum"], names[f[2]+"_count"] = true, true, true
			case "summary":
				names[f[2]+"_sum"], names[f[2]+"_count"] = true, true
			}
		case len(f) > 0 && !strings.HasPrefix(f[0], "#"):
			samples = append(samples, strings.TrimSpace(line))
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no # TYPE lines")
	}
	for _, s := range samples {
		name := s
		if i := strings.IndexAny(s, "{ \t"); i >= 0 {
			name = s[:i]
		}
		if !names[name] {
			return nil, fmt.Errorf("sample %q has no # TYPE line", s)
		}
	}
	return names, nil
}

// FileMetricNames is MetricNames of a file.
func FileMetricNames(path string) (map[string]bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	names, err := MetricNames(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return names, nil
}
