package docquote

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "write every quote of docs/failover.md as the report says it (make faults does, after the report), and every quote of a run record as the record says it")

// The docs quote the failover report as it stands: every quote names a row and column the
// report has, and reads what that row says. A make faults run rewrites them (-update);
// one edited by hand, or left from an older report, fails here.
func TestDocsQuoteTheFailoverReport(t *testing.T) {
	root := filepath.Join("..", "..")
	rows, err := Report(filepath.Join(root, "docs", "failover.md"))
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		unknown, err := Update(root, rows)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range unknown {
			t.Errorf("%s: quotes %q, which the report does not have", q.File, q.Key)
		}
	}
	quotes, err := Quotes(root, rows)
	if err != nil {
		t.Fatal(err)
	}
	if len(quotes) < 8 {
		t.Fatalf("found %d quotes of the failover report in the docs; they hold more", len(quotes))
	}
	for _, q := range quotes {
		switch {
		case q.Want == "":
			t.Errorf("%s:%d: quotes %q, which the report does not have (a test, a measured name as the table writes it, then median or worst)", q.File, q.Line, q.Key)
		case q.Written != q.Want:
			t.Errorf("%s:%d: quotes %q as %q; the report says %q (make faults writes it: go test ./docquote -update)", q.File, q.Line, q.Key, q.Written, q.Want)
		}
	}
}

func TestRender(t *testing.T) {
	for ms, want := range map[int]string{0: "0 ms", 250: "250 ms", 999: "999 ms", 1000: "1.0 s", 1119: "1.1 s", 1565: "1.6 s", 39248: "39.2 s"} {
		if got := Render(ms); got != want {
			t.Errorf("Render(%d) = %q, want %q", ms, got, want)
		}
	}
}

// A quote the report does not say is found, and Update writes what it says: the check
// can fail, and the fix is the run's.
func TestAStaleQuoteIsFoundAndRewritten(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	report := "# Failover report\n\n## Detection and takeover times\n\n" +
		"| # | Scenario | Measured | Trials | Median ms | Worst ms | Missed | Bound | Met |\n" +
		"|---|---|---|---|---|---|---|---|---|\n" +
		"| 1 | Crash of a holder | lease held by another process | 10 | 1119 | 1236 | 0 | – | – |\n\n" +
		"## Safety\n\n| 1 | Crash of a holder | 10 | 0 | 0 | 0 |\n\n" +
		"## Scenarios\n\n### 1. Crash of a holder (`TestCrash`)\n"
	doc := "Taken over in about <!-- failover:TestCrash/lease held by another process/median -->1.3 s<!-- /failover -->, " +
		"at worst <!-- failover:TestCrash/lease held by another process/worst -->1.2 s<!-- /failover -->, " +
		"and <!-- failover:TestCrash/no such row/median -->2 s<!-- /failover -->.\n"
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("docs/failover.md", report)
	write("README.md", doc)
	rows, err := Report(filepath.Join(root, "docs", "failover.md"))
	if err != nil {
		t.Fatal(err)
	}
	quotes, err := Quotes(root, rows)
	if err != nil {
		t.Fatal(err)
	}
	if len(quotes) != 3 || quotes[0].Want != "1.1 s" || quotes[0].Written != "1.3 s" || quotes[1].Want != quotes[1].Written ||
		quotes[2].Want != "" {
		t.Fatalf("quotes = %+v; want a stale median (1.3 s, the report's 1.1 s), a current worst, and an unknown row", quotes)
	}
	unknown, err := Update(root, rows)
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown) != 1 || unknown[0].Key != "TestCrash/no such row/median" {
		t.Errorf("Update's unknown quotes = %+v; want the one of no such row", unknown)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "Taken over in about <!-- failover:TestCrash/lease held by another process/median -->1.1 s<!-- /failover -->, " +
		"at worst <!-- failover:TestCrash/lease held by another process/worst -->1.2 s<!-- /failover -->, " +
		"and <!-- failover:TestCrash/no such row/median -->2 s<!-- /failover -->.\n"; string(b) != want {
		t.Errorf("after Update README.md reads\n%s\nwant\n%s", b, want)
	}
}
