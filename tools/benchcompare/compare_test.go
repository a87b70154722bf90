//go:build benchcompare

package benchcompare

import (
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	report  = flag.String("compare.report", "", "rewrite this docs/performance.md with the table")
	scales  = flag.String("compare.scales", "1000,10000,100000", "numbers of instances, comma-separated")
	scrapes = flag.Int("compare.scrapes", 60, "scrapes of each exporter per run")
	runs    = flag.Int("compare.runs", 2, "runs per scale")
)

// TestBenchCompare is make bench-compare: it builds the binary, compares it with
// postgres_exporter at each scale and, with -compare.report, rewrites the table.
func TestBenchCompare(t *testing.T) {
	cfg := Config{Scrapes: *scrapes, Runs: *runs}
	for _, s := range strings.Split(*scales, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 100 {
			t.Fatalf("-compare.scales: %q is not a number of instances of at least 100", s)
		}
		cfg.Scales = append(cfg.Scales, n)
	}
	cfg.OurBin, cfg.Revision = BuildOurs(t, "../.."), Revision("../..")
	results := Compare(t, cfg)
	section := Section(results, cfg, time.Now(), Machine())
	t.Logf("\n%s", section)
	if *report == "" {
		return
	}
	doc, err := os.ReadFile(*report)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(*report, []byte(Rewrite(string(doc), section)), 0o644); err != nil {
		t.Fatal(err)
	}
}
