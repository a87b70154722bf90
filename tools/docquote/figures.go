package docquote

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// A figure is a number with a unit of time, size, share, ratio, rate or CPU ("1.1 s",
// "16 KiB", "90 %", "2.2 ×", "0.1 core", "8 statements a second"), or a range of two
// ("34-95 ms"). A bare count ("1,000 agents") is not one: counts in the docs are the
// scale of a scenario, not what it measured.
var figure = regexp.MustCompile(`(?:^|[^\w.])(\d[\d,]*(?:\.\d+)?(?:\s?[-–]\s?\d[\d,]*(?:\.\d+)?)?)\s?` +
	`(ms|µs|us|ns|s|seconds?|minutes?|mins?|hours?|h|days?|MiB|MB|KB|KiB|GiB|GB|bytes|%|×|x|millicores?|cores?|statements/s|rows/s|rounds/s|(?:[a-z_]+ ){0,2}a (?:second|minute))(?:$|[^\w])`)

// marker is a figure's markers and the figure between them: a kind, a key for every kind
// but given, and the closing tag of the same kind (checked by Scan).
var marker = regexp.MustCompile(`<!-- (\w+)(?::([^>]*?))? -->([^<]*)<!-- /(\w+) -->`)

// inlineCode is a code span: a figure in one is a command's argument or a flag's value.
var inlineCode = regexp.MustCompile("`[^`]*`")

// A generated block's first and last lines: what is between them is written by a run or
// from the code (`<!-- bench-compare:begin ... -->`, `<!-- flags:end -->`).
var (
	blockBegin = regexp.MustCompile(`<!-- [\w -]+:begin\b`)
	blockEnd   = regexp.MustCompile(`<!-- [\w -]+:end\b`)
)

// Kinds of marker, each a promise a test keeps:
//   - failover: a figure of docs/failover.md's table (TestDocsQuoteTheFailoverReport);
//   - default: a value the code holds, by its name in Settings;
//   - flag: a flag's default, by the flag's name;
//   - alert: an alert rule's `for`, by the alert's name, or a figure its expression holds
//     (the name, then "expr");
//   - yaml: a value of a YAML file of the repository (the chart's values), by the file and
//     a dotted path;
//   - bench: a figure of a run record under docs/runs (records.go);
//   - given: a scenario's input, an example's value, or another program's (the kernel's,
//     PostgreSQL's, client-go's), which nothing here measures and no code of this
//     repository holds ("a 1-3 s restart", "SIGSTOP 20 s"); the text beside it says which.
const (
	KindFailover = "failover"
	KindDefault  = "default"
	KindFlag     = "flag"
	KindAlert    = "alert"
	KindGiven    = "given"
	KindYAML     = "yaml"
	// KindBench is in records.go.
)

// Mark is a marked figure in a doc.
type Mark struct {
	File string
	Line int
	Kind string
	Key  string
	Text string
}

// Figure is a figure in a doc outside code, generated blocks and markers: one that no
// run wrote and no test compares.
type Figure struct {
	File string
	Line int
	Text string
}

// Scan reads a Markdown file: its marks, and its figures that no mark holds. Fenced code,
// code spans and generated blocks are not read for figures. A marker whose closing tag is
// of another kind, or a given with a key, is an error.
func Scan(root, path string) (marks []Mark, unmarked []Figure, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	rel, err := filepath.Rel(root, path)
	if err != nil {
		rel = path
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(nil, 1<<20)
	fenced, generated := false, false
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case strings.HasPrefix(strings.TrimSpace(l), "```"):
			fenced = !fenced
			continue
		case fenced:
			continue
		case blockBegin.MatchString(l):
			generated = true
		}
		if generated {
			generated = !blockEnd.MatchString(l)
			continue
		}
		for _, m := range marker.FindAllStringSubmatch(l, -1) {
			if m[1] != m[4] {
				return nil, nil, fmt.Errorf("%s:%d: a %s marker closed by /%s", rel, n, m[1], m[4])
			}
			if (m[1] == KindGiven) != (m[2] == "") {
				return nil, nil, fmt.Errorf("%s:%d: %q: a given figure has no key, every other kind has one", rel, n, m[0])
			}
			marks = append(marks, Mark{File: rel, Line: n, Kind: m[1], Key: m[2], Text: m[3]})
		}
		rest := marker.ReplaceAllString(inlineCode.ReplaceAllString(l, ""), "")
		for _, m := range figure.FindAllStringSubmatch(rest, -1) {
			unmarked = append(unmarked, Figure{File: rel, Line: n, Text: m[1] + " " + m[2]})
		}
	}
	return marks, unmarked, sc.Err()
}

// Quantity is a figure's value in its dimension's base unit: a duration in nanoseconds,
// a size in bytes, a count, ratio or share as written ("90 %" is 90).
type Quantity struct {
	Value float64
	Dim   string // "duration", "size", "count", "ratio", "share"
}

func (q Quantity) String() string { return fmt.Sprintf("%g (%s)", q.Value, q.Dim) }

// Equal says whether two quantities are the same value, up to a rendering's rounding of
// the last digit written (1e-9 relative: "0.75 s" is 750 ms exactly).
func (q Quantity) Equal(o Quantity) bool {
	return q.Dim == o.Dim && math.Abs(q.Value-o.Value) <= 1e-9*math.Max(math.Abs(q.Value), 1)
}

var units = map[string]Quantity{
	"ns": {1, "duration"}, "µs": {1e3, "duration"}, "us": {1e3, "duration"}, "ms": {1e6, "duration"},
	"s": {1e9, "duration"}, "second": {1e9, "duration"}, "seconds": {1e9, "duration"},
	"min": {60e9, "duration"}, "mins": {60e9, "duration"}, "minute": {60e9, "duration"}, "minutes": {60e9, "duration"},
	"h": {3600e9, "duration"}, "hour": {3600e9, "duration"}, "hours": {3600e9, "duration"},
	"day": {86400e9, "duration"}, "days": {86400e9, "duration"},
	"bytes": {1, "size"}, "B": {1, "size"}, "KB": {1e3, "size"}, "MB": {1e6, "size"}, "GB": {1e9, "size"},
	"KiB": {1 << 10, "size"}, "MiB": {1 << 20, "size"}, "GiB": {1 << 30, "size"},
	"": {1, "count"}, "×": {1, "ratio"}, "x": {1, "ratio"}, "%": {1, "share"},
	"core": {1, "cpu"}, "cores": {1, "cpu"}, "millicore": {1e-3, "cpu"}, "millicores": {1e-3, "cpu"},
	"rounds/s": {1, "rate"}, "statements/s": {1, "rate"}, "rows/s": {1, "rate"},
}

// ParseQuantity reads a single figure as the docs write it: "30 s", "0.75 s", "2 min",
// "7 days", "16 KiB", "4,096", "2.2 ×".
func ParseQuantity(text string) (Quantity, error) {
	w, _, err := parseWritten(text)
	if err != nil {
		return Quantity{}, err
	}
	return Quantity{Value: w.value * w.q.Value, Dim: w.q.Dim}, nil
}
