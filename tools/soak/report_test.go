package soak

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The section is appended once, replaced on the next run, and the rest of the file kept.
func TestReportWriteSectionReplacesItsOwnSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "failover.md")
	const before = "# Failover report\n\nthe fault suite's part\n"
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	s := Summary{Generated: time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC), Seed: 29, Requested: 2 * time.Minute,
		Ran: 2 * time.Minute, Fleet: "16 agents", Applied: map[string]int{FaultKill: 3},
		Results: []Result{{Name: CheckOneInJob, Cases: 12}, {Name: CheckCrashDead, Cases: 2, Violations: []string{"late"}},
			{Name: CheckLeaseTaken, Cases: 9, NotMeasured: 1, Why: map[string]int{"no heir undisturbed through the bound": 1}}}}
	for range 2 {
		if err := WriteSection(path, s); err != nil {
			t.Fatal(err)
		}
		s.Seed = 30
	}
	b, _ := os.ReadFile(path)
	doc := string(b)
	if !strings.HasPrefix(doc, before) || strings.Count(doc, sectionBegin) != 1 || strings.Count(doc, sectionEnd) != 1 {
		t.Fatalf("the section is not once after the kept part:\n%s", doc)
	}
	for _, want := range []string{"Seed: 30", "| kill | 3 |", "| " + CheckCrashDead + " | – | 2 | 0 | **1** |", "- " + CheckCrashDead + ": late",
		"| " + CheckLeaseTaken + " | – | 9 | 1 (no heir undisturbed through the bound: 1) | 0 |", "every 20ms in one statement"} {
		if !strings.Contains(doc, want) {
			t.Errorf("no %q in:\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "Seed: 29") {
		t.Errorf("the first run's section was kept:\n%s", doc)
	}
}
