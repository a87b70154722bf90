package faults

import (
	"strings"
	"testing"
	"time"
)

// TestReportMarkdown renders a fixed report and compares it line by line.
func TestReportMarkdown(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	r := Report{
		Generated: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC),
		Revision:  "abc1234",
		Machine:   Machine{CPUs: 2, CPUModel: "Test CPU", Kernel: "6.1.0", PostgreSQL: "15.8", Go: "go1.26"},
		Defaults:  []Setting{{"agent.heartbeat-interval", "30s"}, {"agent.stale-threshold", "90s"}},
		Scenarios: []Scenario{
			{Number: 1, Name: "TestCrash", Title: "Crash", Settings: "defaults", Trials: 4,
				Quantities: []Quantity{
					{Name: "dead", Values: ms(100, 300, 200, 400), Window: time.Minute, Bound: "median < 2s, worst < 3s", Met: true},
					{Name: "takeover", Values: ms(900), Missed: 1, Window: time.Minute, Bound: "every trial < 3s"},
				},
				FalseDead: 0, DoubleHolders: 0, StaleEpochWrites: 0, Notes: []string{"a note"}},
			{Number: 3, Name: "TestHalfOpenPartition", Title: "Partition", Trials: 2,
				Quantities: []Quantity{{Name: "freed", Values: ms(30000, 31000), Window: time.Minute}},
				FalseDead:  0, DoubleHolders: 0, StaleEpochWrites: 0,
				TwoLeaders: &AlertCheck{Alert: "PgLivenessLeaseTwoLeaders", FencedRuns: 2, FiredWhileFenced: 1,
					BypassedRuns: 1, FiredWhenBypassed: 1}},
			{Number: 8, Name: "TestLeaseContention", Title: "Contention", Trials: 1,
				Quantities: []Quantity{{Name: "rounds", Values: ms(5000), Window: time.Minute}},
				FalseDead:  -1, DoubleHolders: 2, StaleEpochWrites: 3},
		},
	}
	var b strings.Builder
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"# Failover report",
		"- Date: 2026-01-02 03:04 UTC",
		"- Source revision: abc1234",
		"- Machine: 2 CPUs, Test CPU; Linux 6.1.0",
		"- PostgreSQL: 15.8; Go: go1.26",
		"- Agent defaults used unless a scenario says otherwise: `--agent.heartbeat-interval=30s`, `--agent.stale-threshold=90s`",
		"| # | Scenario | Measured | Trials | Median ms | Worst ms | Missed | Bound | Met |",
		"| 1 | Crash | dead | 4 | 250 | 400 | 0 | median < 2s, worst < 3s | yes |",
		"| 1 | Crash | takeover | 2 | > 60000 | > 60000 | 1 | every trial < 3s | **no** |",
		"| 8 | Contention | rounds | 1 | 5000 | 5000 | 0 | – | – |",
		"| # | Scenario | Trials | False-dead verdicts | Double holders | Stale-epoch writes |",
		"| 1 | Crash | 4 | 0 | 0 | 0 |",
		"| 8 | Contention | 1 | – | 2 | 3 |",
		"## Alerts",
		"| # | Scenario | Alert | Fencing works: runs | Fired | Fencing bypassed: runs | Fired |",
		"| 3 | Partition | PgLivenessLeaseTwoLeaders | 2 | **1** | 1 | 1 |",
		"### 1. Crash (`TestCrash`)",
		"Settings: defaults",
		"- a note",
		"### 8. Contention (`TestLeaseContention`)",
	}
	got := b.String()
	lines := map[string]bool{}
	for l := range strings.Lines(got) {
		lines[strings.TrimRight(l, "\n")] = true
	}
	for _, w := range want {
		if !lines[w] {
			t.Errorf("report lacks the line\n%s\ngot:\n%s", w, got)
		}
	}
	if strings.Index(got, "### 1.") > strings.Index(got, "### 8.") {
		t.Error("scenarios out of order")
	}
	// Only scenarios that check the alert are listed under Alerts.
	if alerts := got[strings.Index(got, "## Alerts"):strings.Index(got, "## Scenarios")]; strings.Contains(alerts, "| Crash |") {
		t.Errorf("the Alerts table lists a scenario without the check:\n%s", alerts)
	}
}

// The other majors' sections survive a run on the default major, and a run on one major
// rewrites only its own section, whatever the order of the runs.
func TestReportKeepsEachMajorsSection(t *testing.T) {
	at := func(h int) time.Time { return time.Date(2026, 1, 2, h, 0, 0, 0, time.UTC) }
	scenarios := []Scenario{{Number: 1, Name: "TestCrash", Title: "Crash", Trials: 3,
		Quantities: []Quantity{{Name: "dead", Values: []time.Duration{time.Second}, Window: time.Minute}}}}
	render := func(r Report, major int) string {
		var b strings.Builder
		var err error
		if major == 0 {
			err = r.WriteMarkdown(&b)
		} else {
			err = r.WriteMajorSection(&b, major)
		}
		if err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	run := func(doc string, major int, pg string, hour int) string {
		r := Report{Generated: at(hour), Machine: Machine{CPUs: 2, PostgreSQL: pg}, Scenarios: scenarios}
		sections := MajorSections(doc)
		if major == 0 {
			return SpliceMajors(render(r, 0), sections)
		}
		sections[major] = render(r, major)
		return SpliceMajors(doc, sections)
	}
	main := func(doc string) string { return doc[:strings.Index(doc+"\n"+majorsHeading, "\n"+majorsHeading)] }

	doc := run("", 0, "15.18", 1)
	doc = run(doc, 18, "18.4", 2)
	doc = run(doc, 14, "14.23", 3)
	before := main(doc)
	doc = run(doc, 18, "18.4", 4) // again: replaces 18's section
	if main(doc) != before {
		t.Errorf("a major's run changed the main report:\n%s", doc)
	}
	for _, want := range []string{"<!-- faults:major 14:begin -->", "<!-- faults:major 18:begin -->", majorsHeading,
		"### PostgreSQL 14.23", "### PostgreSQL 18.4", "- Date: 2026-01-02 04:00 UTC"} {
		if n := strings.Count(doc, want); n != 1 {
			t.Errorf("%q appears %d times, want once:\n%s", want, n, doc)
		}
	}
	if strings.Contains(doc, "2026-01-02 02:00") {
		t.Errorf("18's first section was kept beside its rerun")
	}
	if strings.Index(doc, "### PostgreSQL 14.23") > strings.Index(doc, "### PostgreSQL 18.4") {
		t.Errorf("sections out of order of their majors")
	}
	doc = run(doc, 0, "15.18", 5) // the default major again: new main report, sections kept
	if !strings.Contains(main(doc), "- Date: 2026-01-02 05:00 UTC") || len(MajorSections(doc)) != 2 {
		t.Errorf("a default run lost the majors' sections or kept the old main report:\n%s", doc)
	}
	if !strings.Contains(doc, "| 1 | Crash | 3 | 0 | 0 | 0 |") {
		t.Errorf("no safety row:\n%s", doc)
	}
}
