package exposition

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// WriteProto writes the samples of the builders and the families fams (a registry's) to
// w in the delimited protobuf format, the one Prometheus asks for first when it ingests
// native histograms: every family one MetricFamily, sorted by name, the builders'
// families merged by name as Write merges them. Gauges and counters are read back from
// the builders' text; histograms are the ones AddHistogram kept, native buckets
// included, which no text format carries. fams is not changed.
func WriteProto(w io.Writer, fams []*dto.MetricFamily, builders ...*Builder) error {
	mfs, err := families(builders)
	if err != nil {
		return err
	}
	mfs = append(mfs, fams...)
	slices.SortStableFunc(mfs, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	// Names as they are, as the text formats write them: the encoder's escaping would
	// copy every family to find nothing to escape.
	enc := expfmt.NewEncoder(w, expfmt.FmtProtoDelim+"; escaping="+model.AllowUTF8)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return err
		}
	}
	return nil
}

// families converts the builders' samples to MetricFamilies, sorted by name. They point
// into the builders and their families: they are read, never changed, and dropped before
// the builders are reset.
func families(builders []*Builder) ([]*dto.MetricFamily, error) {
	parts := sortedParts(builders)
	var (
		mfs []*dto.MetricFamily
		mf  *dto.MetricFamily
	)
	for i, p := range parts {
		if i == 0 || parts[i-1].f.name != p.f.name {
			mf = &dto.MetricFamily{Name: &p.f.name, Help: &p.f.help, Type: metricType(p.f.typ).Enum()}
			mfs = append(mfs, mf)
		} else if p.f.typ != parts[i-1].f.typ {
			return nil, fmt.Errorf("exposition: family %s is both a %s and a %s", p.f.name, parts[i-1].f.typ, p.f.typ)
		}
		if p.f.typ == Histogram {
			for _, hs := range builders[p.n].hists {
				if hs.Family == p.f {
					mf.Metric = append(mf.Metric, &dto.Metric{Label: labelPairs(hs.Labels), Histogram: hs.H})
				}
			}
			continue
		}
		var err error
		if mf.Metric, err = readSamples(mf.Metric, p.f, p.buf); err != nil {
			return nil, err
		}
	}
	return mfs, nil
}

func metricType(t Type) dto.MetricType {
	switch t {
	case Counter:
		return dto.MetricType_COUNTER
	case Histogram:
		return dto.MetricType_HISTOGRAM
	default:
		return dto.MetricType_GAUGE
	}
}

// labelPairs are a histogram's labels, sorted by name as client_golang sorts them.
func labelPairs(labels [][2]string) []*dto.LabelPair {
	pairs := make([]dto.LabelPair, len(labels))
	ptrs := make([]*dto.LabelPair, len(labels))
	for i := range labels {
		pairs[i].Name, pairs[i].Value = &labels[i][0], &labels[i][1]
		ptrs[i] = &pairs[i]
	}
	slices.SortFunc(ptrs, byName)
	return ptrs
}

func byName(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) }

// readSamples appends to ms the samples of f in buf, the lines Add wrote: name, the label
// pairs in braces (values escaped), a space, the value. Each line's structs are cut from
// a few slices allocated once for buf, not one by one: a scrape reads thousands.
func readSamples(ms []*dto.Metric, f *Family, buf []byte) ([]*dto.Metric, error) {
	n := bytes.Count(buf, []byte{'\n'})
	k := n * (len(f.labels) + 1) // at most: the family's labels and SetLabel's
	var (
		metrics  = make([]dto.Metric, n)
		values   = make([]float64, n)
		pairs    = make([]dto.LabelPair, k)
		ptrs     = make([]*dto.LabelPair, k)
		strs     = make([]string, k)
		gauges   []dto.Gauge
		counters []dto.Counter
		other    *string // a label name that is none of f's: SetLabel's
	)
	if f.typ == Counter {
		counters = make([]dto.Counter, n)
	} else {
		gauges = make([]dto.Gauge, n)
	}
	np := 0 // pairs used
	for i, line := 0, []byte(nil); len(buf) > 0; i++ {
		line, buf, _ = bytes.Cut(buf, []byte{'\n'})
		if len(line) <= len(f.name) || string(line[:len(f.name)]) != f.name || i == n {
			return nil, unreadable(line)
		}
		rest := line[len(f.name):]
		first := np
		if rest[0] == '{' {
			rest = rest[1:]
			for len(rest) > 0 && rest[0] != '}' {
				eq := bytes.Index(rest, []byte(`="`))
				if eq <= 0 || np == k {
					return nil, unreadable(line)
				}
				name := labelName(f, rest[:eq], &other)
				v, after, ok := unquote(rest[eq+2:])
				if !ok || len(after) == 0 || after[0] != ',' && after[0] != '}' {
					return nil, unreadable(line)
				}
				strs[np] = v
				pairs[np].Name, pairs[np].Value = name, &strs[np]
				ptrs[np] = &pairs[np]
				np++
				rest, _ = bytes.CutPrefix(after, []byte{','})
			}
			if len(rest) == 0 {
				return nil, unreadable(line)
			}
			rest = rest[1:]
		}
		if len(rest) < 2 || rest[0] != ' ' {
			return nil, unreadable(line)
		}
		v, err := strconv.ParseFloat(string(rest[1:]), 64)
		if err != nil {
			return nil, unreadable(line)
		}
		m := &metrics[i]
		if np > first {
			m.Label = ptrs[first:np:np]
			slices.SortFunc(m.Label, byName) // SetLabel's comes first in the text
		}
		values[i] = v
		if counters != nil {
			counters[i].Value = &values[i]
			m.Counter = &counters[i]
		} else {
			gauges[i].Value = &values[i]
			m.Gauge = &gauges[i]
		}
		ms = append(ms, m)
	}
	return ms, nil
}

func unreadable(line []byte) error {
	return fmt.Errorf("exposition: cannot read back the sample %q", line)
}

// labelName returns the label name b, f's own string when it is one of f's labels, or
// *other, the builder's SetLabel name, allocated once per family's samples.
func labelName(f *Family, b []byte, other **string) *string {
	for i := range f.labels {
		if f.labels[i] == string(b) {
			return &f.labels[i]
		}
	}
	if *other == nil || **other != string(b) {
		s := string(b)
		*other = &s
	}
	return *other
}

// unquote reads a label value up to its closing quote, undoing appendEscaped, and returns
// what follows the quote.
func unquote(b []byte) (string, []byte, bool) {
	end := bytes.IndexByte(b, '"')
	if end < 0 {
		return "", nil, false
	}
	if bytes.IndexByte(b[:end], '\\') < 0 { // nothing escaped: the usual value
		return string(b[:end]), b[end+1:], true
	}
	var v []byte
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			return string(v), b[i+1:], true
		case '\\':
			if i++; i == len(b) {
				return "", nil, false
			}
			switch b[i] {
			case 'n':
				v = append(v, '\n')
			case '\\', '"':
				v = append(v, b[i])
			default:
				return "", nil, false
			}
		default:
			v = append(v, c)
		}
	}
	return "", nil, false
}
