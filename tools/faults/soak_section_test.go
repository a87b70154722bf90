package faults

import (
	"strings"
	"testing"
	"time"
)

// The soak's section, written by make soak between its markers, survives a run of the
// fault suite on the default major and on another major, and stays last.
func TestReportKeepsTheSoakSection(t *testing.T) {
	const soak = "<!-- soak:begin -->\n## Soak\n\nseed 29, all zero\n<!-- soak:end -->\n"
	r := Report{Generated: time.Date(2026, 1, 2, 1, 0, 0, 0, time.UTC), Machine: Machine{CPUs: 2, PostgreSQL: "15.18"},
		Scenarios: []Scenario{{Number: 1, Name: "TestCrash", Title: "Crash", Trials: 1}}}
	var main, major strings.Builder
	if err := r.WriteMarkdown(&main); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteMajorSection(&major, 18); err != nil {
		t.Fatal(err)
	}
	old := main.String() + "\n" + soak
	// The default major: a new main report, the old one's sections kept.
	doc := SpliceMajors(main.String(), MajorSections(old))
	if strings.Count(doc, soak) != 1 {
		t.Fatalf("a default run lost the soak's section:\n%s", doc)
	}
	// Another major: its section added, the soak's kept, last.
	sections := MajorSections(doc)
	sections[18] = major.String()
	doc = SpliceMajors(doc, sections)
	if strings.Count(doc, soak) != 1 || !strings.HasSuffix(doc, soak) || !strings.Contains(doc, "<!-- faults:major 18:begin -->") {
		t.Fatalf("a major's run lost the soak's section or put it before the majors:\n%s", doc)
	}
	doc = SpliceMajors(main.String(), MajorSections(doc))
	if strings.Count(doc, soak) != 1 || !strings.HasSuffix(doc, soak) || len(MajorSections(doc)) != 2 {
		t.Fatalf("the default major again lost a section:\n%s", doc)
	}
}
