package soak

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// The shard sets' checks. Each shard's lease is fenced like a lease's job, so its ledger
// rows are checked as the leases' are, and more: the library promises that a shard is
// owned by one live instance at a time, outside the database too (a shard's lease is
// let go only after its callback has returned), and that a set's live members own every
// shard.

func (m *model) checkShardOneOwner() Result {
	r := Result{Name: CheckShardOneOwner, Bound: fmt.Sprintf("an overlap is excused only when the earlier owner was stopped, its shard's lease had expired by the database's clock before the later took it, nothing of its committed after that, and it left within %s of SIGCONT", ResumeEndBound)}
	owners := m.spans(EvShardOwned, EvShardReleased)
	excused := m.oneAtATime(&r, owners, "shard", "in its callback")
	r.Detail = fmt.Sprintf("%d callbacks over %d shards; %d overlaps excused (a stopped owner past its shard's lease's expiry)", r.Cases, len(owners), excused)
	return r
}

func (m *model) checkShardEpochs() Result {
	r := Result{Name: CheckShardEpochs}
	top := map[string]Event{}
	first := map[string]Event{} // lease/epoch → its first row
	for _, row := range m.shardRows() {
		r.Cases++
		k := fmt.Sprintf("%s/%d", row.Lease, row.Epoch)
		if w, ok := first[k]; !ok {
			first[k] = row
		} else if w.Inst != row.Inst {
			r.Violations = append(r.Violations, fmt.Sprintf("shard %s: row %d by %s under epoch %d at %s, which row %d by %s was written under",
				row.Lease, row.ID, row.Inst, row.Epoch, ts(row.T), w.ID, w.Inst))
		}
		if t, ok := top[row.Lease]; ok && row.Epoch < t.Epoch {
			r.Violations = append(r.Violations, fmt.Sprintf("shard %s: row %d (epoch %d, by %s at %s) after row %d (epoch %d, by %s)",
				row.Lease, row.ID, row.Epoch, row.Inst, ts(row.T), t.ID, t.Epoch, t.Inst))
			continue
		}
		top[row.Lease] = row
	}
	r.Detail = fmt.Sprintf("%d rows of %d shards under %d epochs", r.Cases, len(top), len(first))
	return r
}

// checkShardAfterNext: a shard's next owner takes its lease only once the previous
// owner's fenced transactions have ended (their fence holds the lease row), and says so
// only after, so every row of an epoch commits before any newer epoch's owner began.
func (m *model) checkShardAfterNext() Result {
	r := Result{Name: CheckShardAfterNext}
	given := map[string][]Event{} // lease → its owners' shard_owned, by epoch
	n := 0
	for _, e := range m.events {
		if e.Kind == EvShardOwned && m.isShard(e.Lease) {
			given[e.Lease] = append(given[e.Lease], e)
			n++
		}
	}
	// firstAfter[lease][i]: of the owners from the i-th on (by epoch), the first given it.
	firstAfter := map[string][]Event{}
	for lease, g := range given {
		sort.SliceStable(g, func(i, j int) bool { return g[i].Epoch < g[j].Epoch })
		f := make([]Event, len(g))
		for i := len(g) - 1; i >= 0; i-- {
			f[i] = g[i]
			if i+1 < len(g) && f[i+1].T < f[i].T {
				f[i] = f[i+1]
			}
		}
		firstAfter[lease] = f
	}
	for _, row := range m.shardRows() {
		r.Cases++
		g := given[row.Lease]
		i := sort.Search(len(g), func(i int) bool { return g[i].Epoch > row.Epoch })
		if i == len(g) {
			continue
		}
		if next := firstAfter[row.Lease][i]; row.T > next.T {
			r.Violations = append(r.Violations, fmt.Sprintf("shard %s: row %d by %s under epoch %d committed at %s, after %s was given the shard under epoch %d at %s",
				row.Lease, row.ID, row.Inst, row.Epoch, ts(row.T), next.Inst, next.Epoch, ts(next.T)))
		}
	}
	r.Detail = fmt.Sprintf("%d rows, %d owners given a shard", r.Cases, n)
	return r
}

// checkShardAfterLost: an owner told that its shard's lease is lost (its callback's
// context ended with that loss, or a write's fence said so) stopped trusting it past its
// fence's deadline, so nothing of its may commit after. A callback cancelled for a move
// (or its member lease lost) still holds the shard's lease until it returns: a write in
// flight then may commit, before the next owner (checkShardAfterNext); those are counted.
func (m *model) checkShardAfterLost() Result {
	r := Result{Name: CheckShardAfterLost}
	told, returned := map[string]int64{}, map[string]int64{}
	first := func(to map[string]int64, e Event) {
		k := fmt.Sprintf("%s/%s/%d", e.Inst, e.Lease, e.Epoch)
		if _, ok := to[k]; !ok {
			to[k] = e.T
		}
	}
	var lost, stopped, refusedLost, refusedLate int
	for _, e := range m.events {
		switch e.Kind {
		case EvShardLost:
			lost++
			first(told, e)
		case EvShardRefused:
			if e.Note == "lost" {
				refusedLost++
				first(told, e)
			} else {
				refusedLate++
			}
		case EvShardStop:
			stopped++
		case EvShardReleased:
			first(returned, e)
		}
	}
	afterReturn := 0
	for _, row := range m.shardRows() {
		r.Cases++
		k := fmt.Sprintf("%s/%s/%d", row.Inst, row.Lease, row.Epoch)
		if t, ok := told[k]; ok && row.T > t {
			r.Violations = append(r.Violations, fmt.Sprintf("shard %s: row %d by %s under epoch %d at %s, told it lost the shard's lease at %s",
				row.Lease, row.ID, row.Inst, row.Epoch, ts(row.T), ts(t)))
		} else if t, ok := returned[k]; ok && row.T > t {
			afterReturn++
		}
	}
	r.Detail = fmt.Sprintf("%d rows accepted; %d callbacks told their shard's lease was lost, %d stopped with it held (moved, member lease lost); "+
		"%d writes refused by the fence as lost, %d as late; %d rows committed just after their callback returned (in flight when it was stopped, with the lease held)",
		r.Cases, lost, stopped, refusedLost, refusedLate, afterReturn)
	return r
}

// checkShardsWritten: after every heal that leaves no fault on a set's members or the
// database, every shard of the set is written again within ShardsWrittenBound. A heal
// followed by another such fault before every shard was written, or by the run's end, is
// not measured.
func (m *model) checkShardsWritten() Result {
	r := Result{Name: CheckShardsWrittenAll, Bound: fmt.Sprintf("%s from a heal that leaves no fault on the set's members or the database", ShardsWrittenBound)}
	end := m.runEnd
	for _, e := range m.events {
		if e.Kind == EvRunEnd {
			end = e.T
			break
		}
	}
	rows := m.shardRows()
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].T < rows[j].T })
	faults := make([]*faultSpan, 0, len(m.faults))
	for _, f := range m.faults {
		faults = append(faults, f)
	}
	sort.Slice(faults, func(i, j int) bool { return faults[i].a < faults[j].a })
	var worst time.Duration
	var worstAfter string
	names := make([]string, 0, len(m.sets))
	for name := range m.sets {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		set := m.sets[name]
		if set.count == 0 {
			continue // a fleet that did not say how many shards the set has
		}
		relevant := func(f *faultSpan) bool {
			return databaseFault[f.kind] || slices.ContainsFunc(f.targets, func(p string) bool { return slices.Contains(set.procs, p) })
		}
		seenHeal := map[int64]bool{}
		for _, f := range faults {
			h := f.h
			if !relevant(f) || h == math.MaxInt64 || seenHeal[h] {
				continue
			}
			seenHeal[h] = true
			next := int64(math.MaxInt64)
			healed := true
			for _, g := range faults {
				if g == f || !relevant(g) {
					continue
				}
				if g.a <= h && g.h > h {
					healed = false // another fault is still applied
				}
				if g.a > h {
					next = min(next, g.a)
				}
			}
			if !healed {
				continue
			}
			deadline := h + int64(ShardsWrittenBound)
			written := map[string]bool{}
			took := int64(-1)
			for i := sort.Search(len(rows), func(i int) bool { return rows[i].T > h }); i < len(rows) && rows[i].T <= min(deadline, next); i++ {
				row := rows[i]
				if !strings.HasPrefix(row.Lease, name+"/") {
					continue
				}
				written[row.Lease] = true
				if len(written) == set.count {
					took = row.T - h
					break
				}
			}
			switch {
			case took >= 0:
				r.Cases++
				if d := time.Duration(took); d > worst {
					worst, worstAfter = d, fmt.Sprintf("after the %s healed at %s", f.kind, ts(h))
				}
			case next <= deadline:
				r.notJudged("another fault on the set's members or the database within the bound")
			case deadline > end:
				r.notJudged("the run ended within the bound")
			default:
				r.Cases++
				var missing []string
				for i := range set.count {
					if s := fmt.Sprintf("%s/%d", name, i); !written[s] {
						missing = append(missing, s)
					}
				}
				shown := missing[:min(len(missing), 8)]
				r.Violations = append(r.Violations, fmt.Sprintf("set %s: after the %s healed at %s, %d of %d shards not written within %s: %s",
					name, f.kind, ts(h), len(missing), set.count, ShardsWrittenBound, strings.Join(shown, ", ")))
			}
		}
	}
	r.Detail = fmt.Sprintf("%d heals measured, worst %d ms", r.Cases, worst.Milliseconds())
	if worstAfter != "" {
		r.Detail += " (" + worstAfter + ")"
	}
	return r
}
