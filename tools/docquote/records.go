package docquote

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A run record is what one run of Go benchmarks printed, kept as it printed it under
// docs/runs/<name>.txt with a header saying which command ran, on which revision, when
// and where (tools/cmd/runrecord writes it; nothing else does). The docs quote a record's
// figures by name,
//
//	<!-- bench:status-page BenchmarkStatusPage/status ms-median -->95.9 ms<!-- /bench -->
//	<!-- bench:leases BenchmarkLeaseAcquireRelease ns/op ÷ BenchmarkSelect1/goroutines=1 ns/op -->13.7 ×<!-- /bench -->
//
// (the record, a benchmark as the run named it without its -N suffix, a unit it
// reported; or the ratio of two such; or "took", the whole command's wall time), and
// make test compares each quote with the record (TestDocsFiguresAreRunsOrCode). A
// benchmark run more than once (-count) is quoted by its median.
const KindBench = "bench"

// RunsDir is where the run records are, under the repository's root.
const RunsDir = "docs/runs"

// Record is a run record's measurements: every value each benchmark reported in each unit.
type Record map[string]map[string][]float64 // benchmark → unit → one value a run

// benchLine is a benchmark's result line: its name (with the -N of GOMAXPROCS), its
// iterations, then value and unit pairs.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.+)$`)

// tookLine is the header line runrecord writes with the command's wall time.
var tookLine = regexp.MustCompile(`^# Took (\S+?);`)

// took is the benchmark name a record keeps the command's wall time under, in ns.
const took = "took"

// ReadRecord reads a run record.
func ReadRecord(path string) (Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rec := Record{}
	for l := range strings.Lines(string(b)) {
		if m := tookLine.FindStringSubmatch(l); m != nil {
			d, err := time.ParseDuration(m[1])
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", path, l, err)
			}
			rec[took] = map[string][]float64{"ns/op": {float64(d)}}
			continue
		}
		m := benchLine.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		f := strings.Fields(m[2])
		if len(f)%2 != 0 {
			return nil, fmt.Errorf("%s: a result line of unpaired values: %s", path, l)
		}
		if rec[m[1]] == nil {
			rec[m[1]] = map[string][]float64{}
		}
		for i := 0; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", path, l, err)
			}
			rec[m[1]][f[i+1]] = append(rec[m[1]][f[i+1]], v)
		}
	}
	if len(rec) == 0 {
		return nil, fmt.Errorf("%s: no benchmark results", path)
	}
	return rec, nil
}

// Records reads every run record under root's docs/runs, by name.
func Records(root string) (map[string]Record, error) {
	files, err := filepath.Glob(filepath.Join(root, RunsDir, "*.txt"))
	if err != nil {
		return nil, err
	}
	out := map[string]Record{}
	for _, f := range files {
		rec, err := ReadRecord(f)
		if err != nil {
			return nil, err
		}
		out[strings.TrimSuffix(filepath.Base(f), ".txt")] = rec
	}
	return out, nil
}

// unitQuantity is what one of a unit reported by a benchmark is: a time, a size, or a
// plain number (a count, a ratio, a rate), which a quote may write with any unit or none.
func unitQuantity(unit string) Quantity {
	switch {
	case unit == "ns/op":
		return Quantity{1, "duration"}
	case strings.HasPrefix(unit, "ms-") || strings.HasSuffix(unit, "-ms"):
		return Quantity{1e6, "duration"}
	case unit == "us/op" || strings.HasSuffix(unit, "-us/op"):
		return Quantity{1e3, "duration"}
	case unit == "B/op":
		return Quantity{1, "size"}
	case strings.HasPrefix(unit, "KiB"):
		return Quantity{1 << 10, "size"}
	case strings.HasPrefix(unit, "MiB"):
		return Quantity{1 << 20, "size"}
	}
	return Quantity{1, ""}
}

// Measure is what a quote's key names in the records: one unit of one benchmark (its
// median over the runs), or the ratio of two.
func Measure(key string, recs map[string]Record) (Quantity, error) {
	name, rest, ok := strings.Cut(key, " ")
	if !ok {
		return Quantity{}, fmt.Errorf("%q: a record's name, then a benchmark and a unit", key)
	}
	rec, ok := recs[name]
	if !ok {
		return Quantity{}, fmt.Errorf("no run record %s in %s", name, RunsDir)
	}
	one := func(s string) (Quantity, error) {
		f := strings.Fields(s)
		if len(f) != 2 {
			return Quantity{}, fmt.Errorf("%q: a benchmark and a unit", s)
		}
		vs := rec[f[0]][f[1]]
		if len(vs) == 0 {
			return Quantity{}, fmt.Errorf("record %s has no %s of %s", name, f[1], f[0])
		}
		u := unitQuantity(f[1])
		return Quantity{Value: median(vs) * u.Value, Dim: u.Dim}, nil
	}
	if rest == took {
		rest = took + " ns/op"
	}
	num, den, ratio := strings.Cut(rest, " ÷ ")
	q, err := one(num)
	if err != nil || !ratio {
		return q, err
	}
	d, err := one(den)
	if err != nil {
		return Quantity{}, err
	}
	if d.Dim != q.Dim || d.Value == 0 {
		return Quantity{}, fmt.Errorf("%q: a ratio of %s to %s", key, q.Dim, d.Dim)
	}
	return Quantity{Value: q.Value / d.Value, Dim: ""}, nil
}

func median(vs []float64) float64 {
	s := slices.Sorted(slices.Values(vs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// written is a quote's figure as written: its value, its unit's quantity and the number of
// decimals, which say how closely it was rounded.
type written struct {
	value    float64 // in the written unit
	unit     string
	q        Quantity // the unit's size
	decimals int
}

var writtenFigure = regexp.MustCompile(`^(\d[\d,]*)(?:\.(\d+))?(\s?)(\S*)$`)

func parseWritten(text string) (written, string, error) {
	m := writtenFigure.FindStringSubmatch(strings.TrimSpace(text))
	if m == nil {
		return written{}, "", fmt.Errorf("%q is not one number and a unit", text)
	}
	u, ok := units[m[4]]
	if !ok {
		return written{}, "", fmt.Errorf("%q: unknown unit %q", text, m[4])
	}
	v, err := strconv.ParseFloat(strings.ReplaceAll(m[1], ",", "")+"."+m[2]+"0", 64)
	if err != nil {
		return written{}, "", err
	}
	return written{value: v, unit: m[4], q: u, decimals: len(m[2])}, m[3], nil
}

// Agrees says whether text is the measure as a writer rounds it: the same dimension (any
// unit of it; a plain number may be written with any unit or none), and within half of
// the last digit written.
func Agrees(text string, measure Quantity) (bool, error) {
	w, _, err := parseWritten(text)
	if err != nil {
		return false, err
	}
	if measure.Dim != "" && w.q.Dim != measure.Dim {
		return false, nil
	}
	scale := w.q.Value
	if measure.Dim == "" {
		scale = 1
	}
	half := 0.5 * math.Pow10(-w.decimals)
	return math.Abs(w.value-measure.Value/scale) <= half*(1+1e-9), nil
}

// Rewritten is text with the measure written in its place: the same unit and decimals.
func Rewritten(text string, measure Quantity) (string, error) {
	w, space, err := parseWritten(text)
	if err != nil {
		return "", err
	}
	if measure.Dim != "" && w.q.Dim != measure.Dim {
		return "", fmt.Errorf("%q is no %s, which the record measures", text, measure.Dim)
	}
	scale := w.q.Value
	if measure.Dim == "" {
		scale = 1
	}
	num := strconv.FormatFloat(measure.Value/scale, 'f', w.decimals, 64)
	if strings.Contains(text, ",") {
		num = thousands(num)
	}
	return num + space + w.unit, nil
}

// thousands puts commas in a number's integer part, as the docs write 1,325.
func thousands(num string) string {
	intPart, frac, _ := strings.Cut(num, ".")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if frac != "" {
		return b.String() + "." + frac
	}
	return b.String()
}

// UpdateBench writes every quote of the named record in the docs under root as the record
// says it (the same unit and decimals), and returns the quotes it could not (a benchmark
// or unit the record does not have).
func UpdateBench(root, name string, recs map[string]Record) ([]Mark, error) {
	var failed []Mark
	left, err := rewriteMarks(root, KindBench, func(key, text string) (string, bool) {
		if !strings.HasPrefix(key, name+" ") {
			return "", false
		}
		q, err := Measure(key, recs)
		if err != nil {
			return "", false
		}
		w, err := Rewritten(text, q)
		return w, err == nil
	})
	for _, m := range left {
		if strings.HasPrefix(m.Key, name+" ") {
			failed = append(failed, m)
		}
	}
	return failed, err
}
