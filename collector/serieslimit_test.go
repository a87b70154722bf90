package collector

import (
	"regexp"
	"slices"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
)

// scrapedWith is one exporter's scrape of n collector samples and own own samples.
func scrapedWith(n, own int) *scraped {
	fam := gauge("test_series", "A test family.", "i")
	c, o := new(exposition.Builder), new(exposition.Builder)
	for i := range n {
		c.Add(fam, 1, string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	for i := range own {
		o.Add(upDesc, float64(i))
	}
	return &scraped{builders: []*exposition.Builder{c, o}, own: o}
}

// The databases are taken in label order, not the list's, kept whole while they fit,
// and from the first that does not on keep only their own gauges, even one small enough
// to fit after it; an exporter without a label is neither counted nor cut.
func TestSeriesLimitKeepsWholeDatabasesInLabelOrder(t *testing.T) {
	logger, logs := logbuf.Logger()
	l := NewSeriesLimit(20, logger)
	main := &Exporter{}
	exporters := []*Exporter{main, main.Labelled("database", "s/c"), main.Labelled("database", "s/a"), main.Labelled("database", "s/b")}
	build := func() []*scraped {
		// main 100 series; c 1+2, a 10+2, b 10+2: a fits (12), b does not (24), c would (15).
		return []*scraped{scrapedWith(98, 2), scrapedWith(1, 2), scrapedWith(10, 2), scrapedWith(10, 2)}
	}
	for range 3 {
		scrapes := build()
		l.apply(exporters, scrapes)
		for i, want := range []int{2, 1, 2, 1} { // builders left: collector's and own, or own alone
			if got := len(scrapes[i].builders); got != want {
				t.Errorf("exporter %d keeps %d builders, want %d", i, got, want)
			}
			if scrapes[i].builders[len(scrapes[i].builders)-1] != scrapes[i].own {
				t.Errorf("exporter %d lost its own gauges", i)
			}
		}
		o := l.Last()
		if o.Series != 12 || o.Databases != 3 || !slices.Equal(o.Dropped, []string{"s/b", "s/c"}) || o.DroppedSeries != 11 || o.Max != 20 {
			t.Errorf("outcome %+v, want 12 series kept of 3 databases, s/b and s/c dropped with 11 series", o)
		}
	}
	if n := len(regexp.MustCompile(`level=WARN .*exceed --discover.max-series`).FindAllString(logs.String(), -1)); n != 1 {
		t.Errorf("the drop logged %d times at warn over 3 answers, want once:\n%s", n, logs.String())
	}

	// A limit they all fit under drops nothing, and says so once.
	l.max = 1000
	for range 2 {
		scrapes := build()
		l.apply(exporters, scrapes)
		for i, s := range scrapes {
			if len(s.builders) != 2 {
				t.Errorf("under a limit of 1000, exporter %d keeps %d builders", i, len(s.builders))
			}
		}
	}
	if o := l.Last(); o.Series != 27 || len(o.Dropped) != 0 || o.DroppedSeries != 0 {
		t.Errorf("outcome %+v, want 27 series, none dropped", o)
	}
	if n := len(regexp.MustCompile(`fit under --discover.max-series again`).FindAllString(logs.String(), -1)); n != 1 {
		t.Errorf("the recovery logged %d times, want once:\n%s", n, logs.String())
	}
}
