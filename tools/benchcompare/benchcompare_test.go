package benchcompare

import (
	"strings"
	"testing"
	"time"
)

// The timed comparison runs only in make bench-compare (compare_test.go, build tag
// benchcompare); its value check runs in make test at a small scale (values_test.go).
// These tests keep the parts that need neither exporter honest.

func TestSamplesMapNamesAndDropTheirServerLabel(t *testing.T) {
	ours, err := Samples(strings.NewReader(`# TYPE pg_liveness_backends gauge
pg_liveness_backends{application_name="svc"} 3
# TYPE pg_liveness_instances gauge
pg_liveness_instances{service="a",state="alive"} 7
# TYPE pg_liveness_up gauge
pg_liveness_up 1
`))
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := Samples(strings.NewReader(`# TYPE pg_liveness_app_backends gauge
pg_liveness_app_backends{application_name="svc",server="127.0.0.1:5432"} 3
# TYPE pg_liveness_instances gauge
pg_liveness_instances{server="127.0.0.1:5432",service="a",state="alive"} 7
`))
	if err != nil {
		t.Fatal(err)
	}
	if same, diffs := Diff(ours, theirs); same != 2 || len(diffs) != 0 {
		t.Fatalf("same %d, diffs %q; want 2 equal series (pg_liveness_up is not compared)", same, diffs)
	}
}

func TestDiffFindsMissingAndDifferentSeries(t *testing.T) {
	ours := map[string]float64{
		`pg_liveness_instances{service="a",state="alive"}`:                        7,
		`pg_liveness_instance_oldest_heartbeat_age_seconds{service="a"}`:          100,
		`pg_liveness_lease_held{lease="x"}`:                                       1,
		`pg_liveness_lease_expires_in_seconds{lease="only-ours"}`:                 5,
		`pg_liveness_instance_heartbeat_age_seconds{instance_id="1",service="a"}`: 10,
	}
	theirs := map[string]float64{
		`pg_liveness_instances{service="a",state="alive"}`:                        8,     // counts are exact
		`pg_liveness_instance_oldest_heartbeat_age_seconds{service="a"}`:          100.6, // ages within 1 s
		`pg_liveness_lease_held{lease="x"}`:                                       1,
		`pg_liveness_lease_held{lease="only-theirs"}`:                             1,
		`pg_liveness_instance_heartbeat_age_seconds{instance_id="1",service="a"}`: 12,
	}
	same, diffs := Diff(ours, theirs)
	want := []string{
		`only ours: pg_liveness_lease_expires_in_seconds{lease="only-ours"}`,
		`only theirs: pg_liveness_lease_held{lease="only-theirs"}`,
		`pg_liveness_instance_heartbeat_age_seconds{instance_id="1",service="a"}: ours 10, theirs 12`,
		`pg_liveness_instances{service="a",state="alive"}: ours 7, theirs 8`,
	}
	if same != 2 || strings.Join(diffs, "\n") != strings.Join(want, "\n") {
		t.Fatalf("same %d, diffs:\n%s\nwant 2 and:\n%s", same, strings.Join(diffs, "\n"), strings.Join(want, "\n"))
	}
}

func TestSectionRatiosAndRewrite(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	results := []Result{{
		Series: 1234,
		Theirs: "postgres_exporter, version 0.11.1",
		Runs: [][2]Measurement{
			{{Median: ms(10), CPU: ms(4), DBCPU: ms(2), Exec: ms(10), PeakRSS: 20, AnonRSS: 4},
				{Median: ms(40), CPU: ms(10), DBCPU: ms(10), Exec: ms(20), PeakRSS: 25, AnonRSS: 8}},
			{{Median: ms(12), CPU: ms(4), DBCPU: ms(2.4), Exec: ms(12), PeakRSS: 20, AnonRSS: 5.5},
				{Median: ms(40), CPU: ms(8), DBCPU: ms(10), Exec: ms(20), PeakRSS: 25, AnonRSS: 8}},
		},
	}}
	results[0].Scale.Instances, results[0].Scale.Leases = 10000, 1000
	sec := Section(results, Config{Scrapes: 60, Runs: 2, Revision: "0123abcd"}, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), "a test machine")
	for _, want := range []string{
		// The median's goal is 0.25: run 2 misses it. Anonymous RSS is the ratio's, not peak RSS.
		"| 10,000 / 1,000 | 0.28 (0.25–0.30) ✗ | 0.45 (0.40–0.50) | 0.59 (0.50–0.69) | 0.22 (0.20–0.24) | 1.00 / 0.50 |",
		"| 10,000 | 2 | 12.0 ms / 40.0 ms | 4.0 ms / 8.0 ms | 20.0 / 25.0 MiB | 5.5 / 8.0 MiB | 2.4 ms / 10.0 ms | 12.0 ms / 20.0 ms |",
		"(0.25×, 0.50×, 0.80×, 0.30×)",
		"Measured 2026-12-01 at revision 0123abcd on a test machine",
		"1,234 at 10,000 instances",
	} {
		if !strings.Contains(sec, want) {
			t.Errorf("section lacks %q:\n%s", want, sec)
		}
	}
	results[0].Runs[1][0].CPU = ms(6) // 0.75: past the 0.5 goal
	if !strings.Contains(Table(results), "0.57 (0.40–0.75) ✗") {
		t.Errorf("a missed goal is not marked:\n%s", Table(results))
	}

	doc := "# Performance\n\nintro\n"
	once := Rewrite(doc, sec)
	if !strings.HasPrefix(once, doc) || !strings.Contains(once, "## Side by side with postgres_exporter\n\n"+BeginMarker) {
		t.Fatalf("first rewrite:\n%s", once)
	}
	again := Rewrite(once+"\n## Later\n", strings.Replace(sec, "2026-12-01", "2026-12-02", 1))
	if strings.Count(again, BeginMarker) != 1 || !strings.Contains(again, "2026-12-02") ||
		strings.Contains(again, "2026-12-01") || !strings.HasSuffix(again, "\n## Later\n") {
		t.Fatalf("second rewrite:\n%s", again)
	}
}

func TestDiffBetweenTakesCountersThatMovedWithin(t *testing.T) {
	const k = `pg_liveness_statement_calls_total{statement="instances"}`
	before, after := map[string]float64{k: 5}, map[string]float64{k: 7}
	if same, diffs := DiffBetween(before, map[string]float64{k: 6}, after); same != 1 || len(diffs) != 0 {
		t.Errorf("6 within 5 and 7: same %d, diffs %q", same, diffs)
	}
	want := k + ": ours 5 then 7, theirs 8"
	if same, diffs := DiffBetween(before, map[string]float64{k: 8}, after); same != 0 || len(diffs) != 1 || diffs[0] != want {
		t.Errorf("8 beyond 7: same %d, diffs %q; want %q", same, diffs, want)
	}
}
