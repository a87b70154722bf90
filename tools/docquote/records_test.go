package docquote

import (
	"os"
	"path/filepath"
	"testing"
)

// A record is read as the run printed it, a quote is its median (or the ratio of two),
// rounded as written; a stale quote fails and UpdateBench writes the record's figure in
// the quote's own unit and decimals.
func TestARecordIsQuotedAsWrittenAndRewritten(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"docs", RunsDir} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	record := "# Run record leases\n# Took 1m30s; load average at its end: 1 1 1\ngoos: linux\n" +
		"BenchmarkSelect1/goroutines=1-2   \t 20000\t     51600 ns/op\t     120 B/op\n" +
		"BenchmarkLeaseAcquireRelease-2    \t  1000\t    708300 ns/op\t  95.9 ms-median\n" +
		"BenchmarkLeaseAcquireRelease-2    \t  1000\t    700000 ns/op\t  97.0 ms-median\n" +
		"BenchmarkLeaseAcquireRelease-2    \t  1000\t    720000 ns/op\t  96.0 ms-median\n" +
		"PASS\nok  \tgithub.com/x/liveness\t12.3s\n"
	if err := os.WriteFile(filepath.Join(root, RunsDir, "leases.txt"), []byte(record), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := Records(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, text string
		ok        bool
	}{
		{"leases BenchmarkLeaseAcquireRelease ns/op", "708.3 µs", true}, // the median of three
		{"leases BenchmarkLeaseAcquireRelease ns/op", "0.71 ms", true},
		{"leases BenchmarkLeaseAcquireRelease ns/op", "700 µs", false},
		{"leases BenchmarkLeaseAcquireRelease ns/op", "708 KiB", false},
		{"leases BenchmarkLeaseAcquireRelease ms-median", "96 ms", true},
		{"leases BenchmarkLeaseAcquireRelease ns/op ÷ BenchmarkSelect1/goroutines=1 ns/op", "13.7 ×", true},
		{"leases BenchmarkLeaseAcquireRelease ns/op ÷ BenchmarkSelect1/goroutines=1 ns/op", "13.9 ×", false},
		{"leases BenchmarkSelect1/goroutines=1 B/op", "120 bytes", true},
		{"leases took", "1.5 min", true},
		{"leases took", "90 s", true},
		{"leases took", "3 min", false},
		{"leases BenchmarkSelect1 ns/op", "51.6 µs", false}, // no such benchmark
		{"other BenchmarkSelect1/goroutines=1 ns/op", "51.6 µs", false},
	} {
		msg := checkMark(root, Mark{Kind: KindBench, Key: c.key, Text: c.text}, nil, nil, nil, recs)
		if (msg == "") != c.ok {
			t.Errorf("quote %q of %q: %q; want it to pass: %v", c.text, c.key, msg, c.ok)
		}
	}
	doc := "Acquired and released in <!-- bench:leases BenchmarkLeaseAcquireRelease ns/op -->695.4 µs<!-- /bench -->, " +
		"<!-- bench:leases BenchmarkLeaseAcquireRelease ns/op ÷ BenchmarkSelect1/goroutines=1 ns/op -->3.9 ×<!-- /bench --> " +
		"a `SELECT 1`; <!-- bench:leases BenchmarkNothing ns/op -->1,200 ms<!-- /bench -->.\n"
	if err := os.WriteFile(filepath.Join(root, "docs", "library.md"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "README.md"), []byte("# README\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	failed, err := UpdateBench(root, "leases", recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 1 || failed[0].Key != "leases BenchmarkNothing ns/op" {
		t.Errorf("UpdateBench could not write %+v; want only the quote of BenchmarkNothing", failed)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "library.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "Acquired and released in <!-- bench:leases BenchmarkLeaseAcquireRelease ns/op -->708.3 µs<!-- /bench -->, " +
		"<!-- bench:leases BenchmarkLeaseAcquireRelease ns/op ÷ BenchmarkSelect1/goroutines=1 ns/op -->13.7 ×<!-- /bench --> " +
		"a `SELECT 1`; <!-- bench:leases BenchmarkNothing ns/op -->1,200 ms<!-- /bench -->.\n"; string(b) != want {
		t.Errorf("after UpdateBench:\n%s\nwant\n%s", b, want)
	}
}

func TestRewrittenKeepsTheWritersForm(t *testing.T) {
	for _, c := range []struct {
		text string
		q    Quantity
		want string
	}{
		{"1,325 ms", Quantity{1_402_400_000, "duration"}, "1,402 ms"},
		{"95.9 ms", Quantity{101_040_000, "duration"}, "101.0 ms"},
		{"131 KiB", Quantity{140 << 10, "size"}, "140 KiB"},
		{"1.4×", Quantity{1.449, ""}, "1.4×"},
		{"0.161 cores", Quantity{0.17449, ""}, "0.174 cores"},
	} {
		if got, err := Rewritten(c.text, c.q); err != nil || got != c.want {
			t.Errorf("Rewritten(%q, %v) = %q, %v; want %q", c.text, c.q, got, err, c.want)
		}
	}
	// A figure written in no unit of the record's dimension is not rewritten into one.
	if got, err := Rewritten("0.000", Quantity{18_000, "duration"}); err == nil {
		t.Errorf("Rewritten wrote a duration as %q, a plain number", got)
	}
}
