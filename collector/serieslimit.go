package collector

import (
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
)

// SeriesLimit bounds the series that the labelled exporters of one answer (the databases
// discovery found) hold together. The exporters are taken in the order of their label's
// value and kept whole while their series fit under Max; from the first that does not,
// each keeps only its own gauges (pg_liveness_up, pg_liveness_database_down_reason,
// pg_liveness_database_info and the scrape_collector gauges), so that an answer never holds part of a database and
// the databases kept do not change with the size of those after them. Exporters without
// a label (the exporter's own database) are neither counted nor dropped.
type SeriesLimit struct {
	max    int
	logger *slog.Logger

	mu      sync.Mutex
	last    LimitOutcome
	dropped logging.Repeats // logged when the databases dropped change, not per scrape
}

// LimitOutcome is what the last answer under a SeriesLimit held.
type LimitOutcome struct {
	Max           int      // the limit
	Series        int      // the series of the databases kept whole, counted against Max
	Databases     int      // the labelled exporters of the answer
	Dropped       []string // the label values of those that kept only their own gauges, in order
	DroppedSeries int      // the series they would have added
}

// NewSeriesLimit returns a limit of max series (at least 1); logger logs a change of the
// databases it drops.
func NewSeriesLimit(max int, logger *slog.Logger) *SeriesLimit {
	return &SeriesLimit{max: max, logger: logging.Wrap(logger), last: LimitOutcome{Max: max}}
}

// Last returns the outcome of the last answer.
func (l *SeriesLimit) Last() LimitOutcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.last
	o.Dropped = slices.Clone(o.Dropped)
	return o
}

// series counts the samples of one exporter's scrape, and those of its own gauges.
func series(s *scraped) (all, own int) {
	for _, b := range s.builders {
		n := b.Samples()
		all += n
		if b == s.own {
			own = n
		}
	}
	return all, own
}

// apply drops, from scrapes (one per exporter), the collectors' samples of the labelled
// exporters beyond the limit, and records the outcome.
func (l *SeriesLimit) apply(exporters []*Exporter, scrapes []*scraped) {
	var order []int
	for i, e := range exporters {
		if e.label[0] != "" {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(exporters[a].label[1], exporters[b].label[1]) })
	o := LimitOutcome{Max: l.max, Databases: len(order)}
	for _, i := range order {
		all, own := series(scrapes[i])
		if o.Dropped == nil && o.Series+all <= l.max {
			o.Series += all
			continue
		}
		o.Dropped = append(o.Dropped, exporters[i].label[1])
		o.DroppedSeries += all - own
		scrapes[i].builders = []*exposition.Builder{scrapes[i].own}
	}
	l.mu.Lock()
	l.last = o
	l.mu.Unlock()
	if len(o.Dropped) > 0 {
		l.dropped.Log(l.logger, slog.LevelWarn, strings.Join(o.Dropped, "\n"), // compared, never logged: any change of the set logs
			"the discovered databases' series exceed --discover.max-series; from the first database that does not fit on, each exports only pg_liveness_up and its scrape gauges",
			"max_series", l.max, "series_kept", o.Series, "databases_dropped", len(o.Dropped), "first_dropped", o.Dropped[0],
			"series_dropped", o.DroppedSeries)
	} else {
		l.dropped.Clear(l.logger, "every discovered database's series fit under --discover.max-series again", "max_series", l.max, "series", o.Series)
	}
}
