package exposition

import (
	"bytes"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Type is a metric family's type as the text format writes it.
type Type string

// The types the exporter writes.
const (
	Gauge   Type = "gauge"
	Counter Type = "counter"
	// Histogram families are added with AddHistogram: the text formats get their classic
	// buckets, _sum and _count; the protobuf format (when a scraper asks for native
	// histograms) the whole histogram, native buckets included.
	Histogram Type = "histogram"
)

// Family is a metric family: its name, type, help and label names, with its "# HELP" and
// "# TYPE" lines rendered once. Labels are written in the order of their names, as
// client_golang writes them, whatever the order in which Add takes their values.
type Family struct {
	name   string
	help   string // for the protobuf format
	typ    Type
	labels []string // in the order Add takes values
	order  []int    // indexes into labels, by label name
	header []byte   // the # HELP and # TYPE lines
	// omHeader is the header in OpenMetrics: a counter's family name has no _total.
	omHeader []byte
	// created is a counter's creation time, for OpenMetrics' _created samples; zero
	// when unknown (none is written).
	created time.Time
}

// NewFamily describes a family. name and labels must be valid Prometheus names (they are
// constants of the program); help may hold any text.
func NewFamily(name, help string, typ Type, labels ...string) *Family {
	f := &Family{name: name, help: help, typ: typ, labels: labels, order: make([]int, len(labels))}
	for i := range f.order {
		f.order[i] = i
	}
	slices.SortStableFunc(f.order, func(a, b int) int { return strings.Compare(labels[a], labels[b]) })
	h := append([]byte("# HELP "), name...)
	h = append(h, ' ')
	h = appendEscaped(h, help, false)
	h = append(h, "\n# TYPE "...)
	h = append(h, name...)
	h = append(h, ' ')
	h = append(h, typ...)
	f.header = append(h, '\n')
	omName := name
	if typ == Counter {
		omName = strings.TrimSuffix(name, "_total")
	}
	h = append([]byte("# HELP "), omName...)
	h = append(h, ' ')
	h = appendEscaped(h, help, true) // OpenMetrics escapes " in help too
	h = append(h, "\n# TYPE "...)
	h = append(h, omName...)
	h = append(h, ' ')
	h = append(h, typ...)
	f.omHeader = append(h, '\n')
	return f
}

// CreatedAt sets when the counter f counts from (every sample of it), for the
// OpenMetrics _created samples: for a counter the process counts itself, its start. A
// counter read from elsewhere (pg_stat_statements) has none: a wrong one would have
// Prometheus invent an increase. It returns f.
func (f *Family) CreatedAt(t time.Time) *Family {
	f.created = t
	return f
}

// Name is the family's name.
func (f *Family) Name() string { return f.name }

// Builder collects samples in the text format, family by family, in the order they are
// added. A Builder is reused from scrape to scrape with Reset, keeping its buffers; it
// is not safe for concurrent use.
type Builder struct {
	fams       []samples
	hists      []HistogramSample // the histograms added, for the protobuf format
	last       int               // index of the family added to last: samples come in runs of one family
	prefix     []byte            // a label pair written first in every sample, with its comma; see SetLabel
	prefixPair [2]string         // the same pair, for histograms
}

// SetLabel makes every sample added from now on carry name="value" as its first label
// (an exporter of several databases' database label); an empty name removes it. It
// outlives Reset. name must be a valid label name that no family of the builder has.
func (b *Builder) SetLabel(name, value string) {
	b.prefix = b.prefix[:0]
	b.prefixPair = [2]string{name, value}
	if name == "" {
		return
	}
	b.prefix = append(b.prefix, name...)
	b.prefix = append(b.prefix, '=', '"')
	b.prefix = appendEscaped(b.prefix, value, true)
	b.prefix = append(b.prefix, '"')
}

type samples struct {
	f   *Family
	buf []byte
}

// Reset forgets the samples and keeps the buffers.
func (b *Builder) Reset() {
	for i := range b.fams {
		b.fams[i].buf = b.fams[i].buf[:0]
	}
	clear(b.hists)
	b.hists = b.hists[:0]
}

// HistogramSample is one histogram as AddHistogram took it: its family, its label pairs
// (the builder's SetLabel pair first, then the family's sorted by name) and the
// histogram, classic buckets and native ones.
type HistogramSample struct {
	Family *Family
	Labels [][2]string
	H      *dto.Histogram
}

// Histograms are the histograms added since the last Reset, in the order they were added.
func (b *Builder) Histograms() []HistogramSample { return b.hists }

// AddHistogram appends one histogram of f (a Histogram family) with the label values in
// the order of f's labels: in the text formats its classic buckets (cumulative, with the
// +Inf bucket written when h lacks it), _sum and _count. h is kept as given, for the
// protobuf format: the caller must not change it until Reset.
func (b *Builder) AddHistogram(f *Family, h *dto.Histogram, values ...string) {
	if f.typ != Histogram {
		panic("exposition: " + f.name + " is not a histogram family")
	}
	if len(values) != len(f.labels) {
		panic("exposition: " + f.name + ": " + strconv.Itoa(len(values)) + " label values for " +
			strconv.Itoa(len(f.labels)) + " labels")
	}
	hs := HistogramSample{Family: f, H: h}
	if len(b.prefix) > 0 {
		hs.Labels = append(hs.Labels, b.prefixPair)
	}
	for _, i := range f.order {
		hs.Labels = append(hs.Labels, [2]string{f.labels[i], values[i]})
	}
	b.hists = append(b.hists, hs)

	s := b.buffer(f)
	line := func(buf []byte, suffix string, le string, v float64) []byte {
		buf = append(buf, f.name...)
		buf = append(buf, suffix...)
		if len(hs.Labels) > 0 || le != "" {
			buf = append(buf, '{')
			for n, p := range hs.Labels {
				if n > 0 {
					buf = append(buf, ',')
				}
				buf = append(buf, p[0]...)
				buf = append(buf, '=', '"')
				buf = appendEscaped(buf, p[1], true)
				buf = append(buf, '"')
			}
			if le != "" {
				if len(hs.Labels) > 0 {
					buf = append(buf, ',')
				}
				buf = append(buf, `le="`...)
				buf = append(buf, le...)
				buf = append(buf, '"')
			}
			buf = append(buf, '}')
		}
		buf = append(buf, ' ')
		buf = AppendFloat(buf, v)
		return append(buf, '\n')
	}
	buf := s.buf
	inf := false
	for _, bk := range h.GetBucket() {
		ub := bk.GetUpperBound()
		inf = inf || math.IsInf(ub, +1)
		buf = line(buf, "_bucket", string(AppendFloat(nil, ub)), count(bk.GetCumulativeCountFloat(), bk.GetCumulativeCount()))
	}
	n := count(h.GetSampleCountFloat(), h.GetSampleCount())
	if !inf {
		buf = line(buf, "_bucket", "+Inf", n)
	}
	buf = line(buf, "_sum", "", h.GetSampleSum())
	s.buf = line(buf, "_count", "", n)
}

// count is a histogram's count: a float histogram's float one when set (its integer one
// is then 0), as client_golang's text writer reads it.
func count(f float64, n uint64) float64 {
	if f != 0 {
		return f
	}
	return float64(n)
}

// Add appends one sample of f with the label values in the order of f's labels. The
// values may hold any valid UTF-8; backslashes, double quotes and newlines are escaped.
// Add does not check that a series is added once: that is the caller's promise.
func (b *Builder) Add(f *Family, v float64, values ...string) {
	if len(values) != len(f.labels) {
		panic("exposition: " + f.name + ": " + strconv.Itoa(len(values)) + " label values for " +
			strconv.Itoa(len(f.labels)) + " labels")
	}
	s := b.buffer(f)
	buf := append(s.buf, f.name...)
	if len(values) > 0 || len(b.prefix) > 0 {
		buf = append(buf, '{')
		buf = append(buf, b.prefix...)
		for n, i := range f.order {
			if n > 0 || len(b.prefix) > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, f.labels[i]...)
			buf = append(buf, '=', '"')
			buf = appendEscaped(buf, values[i], true)
			buf = append(buf, '"')
		}
		buf = append(buf, '}')
	}
	buf = append(buf, ' ')
	buf = AppendFloat(buf, v)
	s.buf = append(buf, '\n')
}

func (b *Builder) buffer(f *Family) *samples {
	if b.last < len(b.fams) && b.fams[b.last].f == f {
		return &b.fams[b.last]
	}
	for i := range b.fams {
		if b.fams[i].f == f {
			b.last = i
			return &b.fams[i]
		}
	}
	b.fams = append(b.fams, samples{f: f})
	b.last = len(b.fams) - 1
	return &b.fams[b.last]
}

// Len is the number of bytes of samples in the builder, without headers.
func (b *Builder) Len() int {
	n := 0
	for _, s := range b.fams {
		n += len(s.buf)
	}
	return n
}

// Samples is the number of samples in the builder: one line each (a newline inside a
// label value is escaped).
func (b *Builder) Samples() int {
	n := 0
	for _, s := range b.fams {
		n += bytes.Count(s.buf, []byte{'\n'})
	}
	return n
}

// Write writes the samples of the builders to w in the text format, families sorted by
// name, each family's header once and its samples in the order they were added (a family
// added to by several builders has their samples in the order of the builders). Families
// without samples are left out.
func Write(w io.Writer, builders ...*Builder) error {
	parts := sortedParts(builders)
	for i, p := range parts {
		if i == 0 || parts[i-1].f.name != p.f.name {
			if _, err := w.Write(p.f.header); err != nil {
				return err
			}
		}
		if _, err := w.Write(p.buf); err != nil {
			return err
		}
	}
	return nil
}

// part is one builder's samples of one family.
type part struct {
	f   *Family
	buf []byte
	n   int // builder index, to keep the builders' order within a family
}

// sortedParts returns the builders' samples by family name, then builder.
func sortedParts(builders []*Builder) []part {
	var parts []part
	for n, b := range builders {
		for _, s := range b.fams {
			if len(s.buf) > 0 {
				parts = append(parts, part{s.f, s.buf, n})
			}
		}
	}
	slices.SortStableFunc(parts, func(a, b part) int {
		if c := strings.Compare(a.f.name, b.f.name); c != 0 {
			return c
		}
		return a.n - b.n
	})
	return parts
}

// WriteOpenMetrics writes the samples of the builders as Write does, in the OpenMetrics
// text format instead (1.0.0): a counter family is named without its _total (its
// samples keep it), followed, when created is true and its creation time is known
// (CreatedAt), by a _created sample per label set. The caller ends the exposition with
// "# EOF" once everything is written.
func WriteOpenMetrics(w io.Writer, created bool, builders ...*Builder) error {
	parts := sortedParts(builders)
	var line2 []byte // scratch for _created lines
	for i, p := range parts {
		if i == 0 || parts[i-1].f.name != p.f.name {
			if _, err := w.Write(p.f.omHeader); err != nil {
				return err
			}
		}
		if !created || p.f.typ != Counter || p.f.created.IsZero() {
			if _, err := w.Write(p.buf); err != nil {
				return err
			}
			continue
		}
		base := strings.TrimSuffix(p.f.name, "_total")
		ts := AppendFloat(nil, float64(p.f.created.Unix())+float64(p.f.created.Nanosecond())/1e9)
		for line := range bytes.Lines(p.buf) {
			// name_total{labels} value: the labels are what follows the name, up to the
			// last space.
			rest := line[len(p.f.name):bytes.LastIndexByte(line, ' ')]
			line2 = append(line2[:0], line...)
			line2 = append(line2, base...)
			line2 = append(line2, "_created"...)
			line2 = append(line2, rest...)
			line2 = append(line2, ' ')
			line2 = append(line2, ts...)
			line2 = append(line2, '\n')
			if _, err := w.Write(line2); err != nil {
				return err
			}
		}
	}
	return nil
}

// AppendFloat appends v as the text format writes a sample value.
func AppendFloat(b []byte, v float64) []byte {
	switch {
	case v == 0:
		return append(b, '0')
	case v == 1:
		return append(b, '1')
	case math.IsNaN(v):
		return append(b, "NaN"...)
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// appendEscaped appends s with backslashes and newlines escaped, and double quotes too
// in a label value.
func appendEscaped(b []byte, s string, quote bool) []byte {
	start := 0
	for i := 0; i < len(s); i++ {
		var esc string
		switch s[i] {
		case '\\':
			esc = `\\`
		case '\n':
			esc = `\n`
		case '"':
			if !quote {
				continue
			}
			esc = `\"`
		default:
			continue
		}
		b = append(b, s[start:i]...)
		b = append(b, esc...)
		start = i + 1
	}
	return append(b, s[start:]...)
}
