// Package docquote keeps the figures the docs quote from docs/failover.md the report's
// own: a quote is a figure between two markers that name the report's row and column,
//
//	<!-- failover:TestCrash/lease held by another process/median -->1.1 s<!-- /failover -->
//
// and reads what that row says, rendered one way: a time of a second or more in seconds
// with one decimal ("1.1 s"), a shorter one in milliseconds ("250 ms"). make faults
// writes every quote after the report (Update); make test fails on a quote the report
// does not say (TestDocsQuoteTheFailoverReport), so a doc cannot keep an old run's figure.
package docquote

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Row is one row of the report's table of times: its median and worst, as a quote writes
// them.
type Row struct {
	Median, Worst string
}

// scenarioHeading is a scenario's heading in the report: its number, title and test.
var scenarioHeading = regexp.MustCompile("^### [0-9]+\\. (.+) \\(`(Test\\w+)`\\)$")

// Report reads docs/failover.md's table of detection and takeover times (the main run's,
// not the other majors'), keyed by "<test>/<measured>": each scenario by the test that
// ran it, from the scenarios' headings.
func Report(path string) (map[string]Row, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	tests := map[string]string{} // scenario title → test
	for _, l := range lines {
		if m := scenarioHeading.FindStringSubmatch(l); m != nil {
			tests[m[1]] = m[2]
		}
	}
	rows := map[string]Row{}
	inTable := false
	for i, l := range lines {
		switch {
		case l == "## Detection and takeover times":
			inTable = true
			continue
		case strings.HasPrefix(l, "## "):
			inTable = false
		}
		if !inTable || !strings.HasPrefix(l, "| ") || strings.HasPrefix(l, "| # ") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		if len(cells) != 9 {
			return nil, fmt.Errorf("%s:%d: a row of %d cells, want 9: %s", path, i+1, len(cells), l)
		}
		test, ok := tests[cells[1]]
		if !ok {
			return nil, fmt.Errorf("%s:%d: scenario %q has no heading with its test", path, i+1, cells[1])
		}
		median, err1 := cell(cells[4])
		worst, err2 := cell(cells[5])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s:%d: median %q and worst %q must be milliseconds", path, i+1, cells[4], cells[5])
		}
		rows[test+"/"+cells[2]] = Row{Median: median, Worst: worst}
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no table of detection and takeover times", path)
	}
	return rows, nil
}

// cell is a time cell of the table as a quote writes it: milliseconds, or "> N" when a
// trial missed the event within its window of N ms.
func cell(c string) (string, error) {
	more := strings.HasPrefix(c, "> ")
	ms, err := strconv.Atoi(strings.TrimPrefix(c, "> "))
	if err != nil {
		return "", err
	}
	if more {
		return "more than " + Render(ms), nil
	}
	return Render(ms), nil
}

// Render is how a quote writes a time in milliseconds.
func Render(ms int) string {
	if ms >= 1000 {
		return strconv.FormatFloat(float64(ms)/1000, 'f', 1, 64) + " s"
	}
	return strconv.Itoa(ms) + " ms"
}

// quote is one quote's markers and figure; its key is "<test>/<measured>/<median|worst>".
var quote = regexp.MustCompile(`<!-- failover:([^>]+?) -->([^<]*)<!-- /failover -->`)

// Quote is a quote found in a doc, with what the report says it should read.
type Quote struct {
	File    string
	Line    int
	Key     string
	Written string
	Want    string // "" when the report has no such row or column
}

// Quotes are the quotes of the report in the Markdown files of docs (README.md and
// docs/*.md under root, but the report itself), each with what it should read.
func Quotes(root string, rows map[string]Row) ([]Quote, error) {
	files, err := docs(root)
	if err != nil {
		return nil, err
	}
	var out []Quote
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		sc.Buffer(nil, 1<<20)
		for n := 1; sc.Scan(); n++ {
			for _, m := range quote.FindAllStringSubmatch(sc.Text(), -1) {
				rel, _ := filepath.Rel(root, f)
				out = append(out, Quote{File: rel, Line: n, Key: m[1], Written: m[2], Want: want(m[1], rows)})
			}
		}
	}
	return out, nil
}

// want is what the quote of key should read, or "" when the report has no such figure.
func want(key string, rows map[string]Row) string {
	i := strings.LastIndex(key, "/")
	if i < 0 {
		return ""
	}
	row, ok := rows[key[:i]]
	if !ok {
		return ""
	}
	switch key[i+1:] {
	case "median":
		return row.Median
	case "worst":
		return row.Worst
	}
	return ""
}

// Update writes every quote of the report in the docs under root as the report says it,
// and returns the quotes whose row or column the report does not have (left as they are).
func Update(root string, rows map[string]Row) ([]Quote, error) {
	left, err := rewriteMarks(root, KindFailover, func(key, _ string) (string, bool) {
		w := want(key, rows)
		return w, w != ""
	})
	var unknown []Quote
	for _, m := range left {
		unknown = append(unknown, Quote{File: m.File, Key: m.Key, Written: m.Text})
	}
	return unknown, err
}

// rewriteMarks writes, in every doc under root, the figure of each mark of kind as fix
// says it, and returns the marks fix has no figure for (left as they are).
func rewriteMarks(root, kind string, fix func(key, text string) (string, bool)) ([]Mark, error) {
	files, err := docs(root)
	if err != nil {
		return nil, err
	}
	var left []Mark
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		text := marker.ReplaceAllStringFunc(string(b), func(s string) string {
			m := marker.FindStringSubmatch(s)
			if m[1] != kind {
				return s
			}
			w, ok := fix(m[2], m[3])
			if !ok {
				rel, _ := filepath.Rel(root, f)
				left = append(left, Mark{File: rel, Kind: kind, Key: m[2], Text: m[3]})
				return s
			}
			return "<!-- " + kind + ":" + m[2] + " -->" + w + "<!-- /" + kind + " -->"
		})
		if text != string(b) {
			if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
				return nil, err
			}
		}
	}
	return left, nil
}

// docs are README.md and docs/*.md under root, but the report.
func docs(root string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	files = slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == "failover.md" })
	return append([]string{filepath.Join(root, "README.md")}, files...), nil
}
