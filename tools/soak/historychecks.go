package soak

import (
	"fmt"
	"slices"
)

// The schema's history (migration 0020) checked against the run's own record: every
// leadership the run saw (a job begun, a shard owned, an epoch in the database's record
// of the lease rows) is in it, nothing else is, and each lease's leaderships follow one
// another. The run reads the history's lease rows at its end (EvDBHistory).

// checkHistory judges every epoch of the lease rows' record and every history row.
func (m *model) checkHistory() Result {
	r := Result{Name: CheckHistory}
	type entry struct {
		acquired, ended *Event
	}
	hist := map[string]*entry{} // lease/epoch → its history rows
	byLease := map[string][]Event{}
	for i := range m.events {
		e := &m.events[i]
		if e.Kind != EvDBHistory {
			continue
		}
		byLease[e.Lease] = append(byLease[e.Lease], *e)
		k := epochKey(e.Lease, e.Epoch)
		if hist[k] == nil {
			hist[k] = &entry{}
		}
		switch e.Note {
		case "acquired":
			if hist[k].acquired != nil {
				r.Violations = append(r.Violations, fmt.Sprintf("lease %s epoch %d acquired twice in the history (%s, %s)",
					e.Lease, e.Epoch, ts(hist[k].acquired.T), ts(e.T)))
			}
			hist[k].acquired = e
		case "ended":
			if hist[k].ended != nil {
				r.Violations = append(r.Violations, fmt.Sprintf("lease %s epoch %d ended twice in the history", e.Lease, e.Epoch))
			}
			hist[k].ended = e
		}
	}
	violate := func(format string, args ...any) { r.Violations = append(r.Violations, fmt.Sprintf(format, args...)) }

	// Each lease's rows: acquired, ended, acquired..., each acquisition of another epoch,
	// no earlier than the end before it and counting its gap from it.
	for lease, rows := range byLease {
		var prev *Event
		for i := range rows {
			e := &rows[i]
			switch {
			case e.Note == "acquired" && prev != nil && prev.Note == "ended":
				if e.Epoch == prev.Epoch || e.T < prev.T || e.Prev != prev.T {
					violate("lease %s: epoch %d acquired at %s, gap from %s, after epoch %d ended at %s: want another epoch, at or after that end, counted from it",
						lease, e.Epoch, ts(e.T), ts(e.Prev), prev.Epoch, ts(prev.T))
				}
			case e.Note == "acquired" && prev == nil:
			case e.Note == "ended" && prev != nil && prev.Note == "acquired" && prev.Epoch == e.Epoch:
			default:
				what := "nothing"
				if prev != nil {
					what = fmt.Sprintf("%s of epoch %d", prev.Note, prev.Epoch)
				}
				violate("lease %s: %s of epoch %d at %s after %s: two leaderships at once, or the end of none",
					lease, e.Note, e.Epoch, ts(e.T), what)
			}
			prev = e
		}
	}

	// Every epoch of the database's record is in the history, as it happened; a row
	// written by the history's trigger comes before the record's (the triggers of one
	// statement run in name order: the schema's before the soak's), by less than a second.
	const sameStatement = int64(1e9)
	for k, rec := range m.epochs {
		r.Cases++
		h := hist[k]
		if h == nil || h.acquired == nil {
			violate("lease %s epoch %d (taken %s by the lease rows) is not in the history", rec.lease, rec.epoch, ts(rec.taken))
			continue
		}
		if len(rec.exps) > 0 {
			first := rec.exps[0].at
			if h.acquired.T > first || first-h.acquired.T > sameStatement {
				violate("lease %s epoch %d: acquired at %s by the history, its row written at %s", rec.lease, rec.epoch, ts(h.acquired.T), ts(first))
			}
		}
		switch end := rec.released; {
		case end > 0 && (h.ended == nil || !slices.Contains([]string{"released", "stepped_down"}, h.ended.Name)):
			violate("lease %s epoch %d: its row was deleted at %s; the history has no release of it", rec.lease, rec.epoch, ts(end))
		case end > 0 && (h.ended.T > end || end-h.ended.T > sameStatement):
			violate("lease %s epoch %d: released at %s by the history, its row deleted at %s", rec.lease, rec.epoch, ts(h.ended.T), ts(end))
		case rec.replaced > 0 && (h.ended == nil || !slices.Contains([]string{"expired", "holder_dead"}, h.ended.Name)):
			violate("lease %s epoch %d: taken over by epoch %d at %s; the history has no expiry or death ending it", rec.lease, rec.epoch, rec.by, ts(rec.replaced))
		case rec.released == 0 && rec.replaced == 0 && h.ended != nil:
			violate("lease %s epoch %d: the history ends it (%s at %s); its row stands", rec.lease, rec.epoch, h.ended.Name, ts(h.ended.T))
		}
	}
	// Nothing else: every acquisition in the history is an epoch of the record.
	for k, h := range hist {
		if h.acquired == nil {
			violate("%s: an end without its acquisition in the history", k)
			continue
		}
		if m.epochs[k] == nil {
			violate("lease %s epoch %d acquired at %s by the history; no row of the lease ever had it", h.acquired.Lease, h.acquired.Epoch, ts(h.acquired.T))
		}
	}
	// Every leadership the run saw is in the history, with its holder.
	for _, e := range m.events {
		if e.Kind != EvJobBegin && e.Kind != EvShardOwned {
			continue
		}
		r.Cases++
		h := hist[epochKey(e.Lease, e.Epoch)]
		if h == nil || h.acquired == nil || h.acquired.Inst != e.Inst {
			holder := "none"
			if h != nil && h.acquired != nil {
				holder = h.acquired.Inst
			}
			violate("%s began leading %s (epoch %d) at %s; the history's acquisition of that epoch names %s", e.Inst, e.Lease, e.Epoch, ts(e.T), holder)
		}
	}
	slices.Sort(r.Violations)
	rows := 0
	for _, l := range byLease {
		rows += len(l)
	}
	r.Detail = fmt.Sprintf("%d epochs and leaderships judged against %d history rows", r.Cases, rows)
	return r
}
