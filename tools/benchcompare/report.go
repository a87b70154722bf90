package benchcompare

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// Markers delimit the generated section of docs/performance.md.
const (
	BeginMarker = "<!-- bench-compare:begin (written by make bench-compare) -->"
	EndMarker   = "<!-- bench-compare:end -->"
)

// Budget is the goal, ours / theirs: scrape median, exporter CPU per scrape,
// anonymous RSS, database CPU per scrape.
var Budget = [4]float64{0.25, 0.5, 0.8, 0.3}

// ratios returns a run's four ratios, ours / theirs.
func ratios(m [2]Measurement) [4]float64 {
	o, t := m[0], m[1]
	return [4]float64{
		div(o.Median.Seconds(), t.Median.Seconds()),
		div(o.CPU.Seconds(), t.CPU.Seconds()),
		div(o.AnonRSS, t.AnonRSS),
		div(o.DBCPU.Seconds(), t.DBCPU.Seconds()),
	}
}

func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Table renders the results as Markdown: per scale, each ratio as its mean over the runs
// with the spread (lowest–highest), then the absolute figures.
func Table(results []Result) string {
	var b strings.Builder
	b.WriteString("| instances / leases | scrape median | exporter CPU per scrape | anonymous RSS | DB backend CPU per scrape | server execution / scrape median, ours / theirs |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s / %s |", thousands(r.Scale.Instances), thousands(r.Scale.Leases))
		for k := range 4 {
			lo, hi, sum := 0.0, 0.0, 0.0
			for i, run := range r.Runs {
				v := ratios(run)[k]
				if i == 0 || v < lo {
					lo = v
				}
				if i == 0 || v > hi {
					hi = v
				}
				sum += v
			}
			mean := sum / float64(len(r.Runs))
			mark := ""
			if hi > Budget[k] {
				mark = " ✗"
			}
			fmt.Fprintf(&b, " %.2f (%.2f–%.2f)%s |", mean, lo, hi, mark)
		}
		var share [2]float64
		for _, run := range r.Runs {
			for i := range share {
				share[i] += div(run[i].Exec.Seconds(), run[i].Median.Seconds()) / float64(len(r.Runs))
			}
		}
		fmt.Fprintf(&b, " %.2f / %.2f |\n", share[0], share[1])
	}
	b.WriteString("\nAbsolute figures, ours / theirs, per run:\n\n")
	b.WriteString("| instances | run | scrape median | exporter CPU per scrape | peak RSS | anonymous RSS | DB backend CPU per scrape | server execution per scrape |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		for i, run := range r.Runs {
			o, t := run[0], run[1]
			fmt.Fprintf(&b, "| %s | %d | %s / %s | %s / %s | %.1f / %.1f MiB | %.1f / %.1f MiB | %s / %s | %s / %s |\n",
				thousands(r.Scale.Instances), i+1, ms(o.Median), ms(t.Median), ms(o.CPU), ms(t.CPU),
				o.PeakRSS, t.PeakRSS, o.AnonRSS, t.AnonRSS, ms(o.DBCPU), ms(t.DBCPU), ms(o.Exec), ms(t.Exec))
		}
	}
	return b.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// Section is the generated part of docs/performance.md: method, machine and table.
func Section(results []Result, cfg Config, when time.Time, machine string) string {
	var b strings.Builder
	b.WriteString(BeginMarker + "\n")
	fmt.Fprintf(&b, "Measured %s at revision %s on %s, with %d scrapes of each exporter per run, interleaved, and %d runs "+
		"(each with freshly started exporters); ratios are ours / theirs, the mean of the runs with the "+
		"lowest and highest in brackets, ✗ where a run missed the goal (%.2f×, %.2f×, %.2f×, %.2f×).",
		when.UTC().Format("2006-01-02"), cfg.Revision, machine, cfg.Scrapes, cfg.Runs, Budget[0], Budget[1], Budget[2], Budget[3])
	if len(results) > 0 {
		fmt.Fprintf(&b, " Theirs: %s.", results[0].Theirs)
	}
	b.WriteString("\n\n")
	b.WriteString(Table(results))
	b.WriteString("\nBefore each measurement both exporters were scraped at the same instant and agreed on every compared series (")
	for i, r := range results {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s at %s instances", thousands(r.Series), thousands(r.Scale.Instances))
	}
	b.WriteString("). Anonymous RSS is the largest resident anonymous memory (heap, stacks, runtime) seen after a scrape; " +
		"the rest of the peak RSS is mostly pages of the binary. Server execution is the planning and execution time " +
		"pg_stat_statements counts for the exporter's role per scrape: elapsed time, so ours, which sends its " +
		"four statements at once, sums their waits for the two cores too and can exceed the median; the " +
		"database's work is the backend CPU.\n" + EndMarker + "\n")
	return b.String()
}

// Machine describes this machine: CPU model, cores, Go version.
func Machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d cores (%s, %s/%s)", model, runtime.NumCPU(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Rewrite replaces the generated section of doc (between the markers), or appends it
// under a heading of its own when there is none.
func Rewrite(doc, section string) string {
	i := strings.Index(doc, BeginMarker)
	j := strings.Index(doc, EndMarker)
	if i < 0 || j < i {
		return strings.TrimRight(doc, "\n") + "\n\n## Side by side with postgres_exporter\n\n" + section
	}
	return doc[:i] + section + strings.TrimPrefix(doc[j+len(EndMarker):], "\n")
}
