package soak

import (
	"fmt"
	"math"
	"sort"
)

// The database's own record of the leases: a trigger on the leases table (the soak's,
// not the schema's) writes each insert, update and delete of a row with the server's
// clock, and the run adds them to the history (EvLeaseRow). It is exact where samples are
// not: every renewal's expiry, when each epoch was taken, and when it ended.

// epochRecord is one epoch of a lease as the rows show it.
type epochRecord struct {
	lease    string
	epoch    int64
	taken    int64    // taken_at, 0 when no row showed it
	exps     []expiry // each expiry the row had under this epoch, in time order
	released int64    // when its row was deleted, 0 when it was not
	replaced int64    // when its row was taken under another epoch, 0 when it was not
	by       int64    // that epoch
	upTo     []int64  // upTo[i]: the latest expiry of exps[:i+1]
}

type expiry struct{ at, exp int64 }

func epochKey(lease string, epoch int64) string { return fmt.Sprintf("%s/%d", lease, epoch) }

// final is the latest expiry the epoch's row had.
func (e *epochRecord) final() int64 {
	out := int64(math.MinInt64)
	for _, x := range e.exps {
		out = max(out, x.exp)
	}
	return out
}

// inForce is the expiry of the epoch's row as written before t (the latest one: a
// renewal written before t may commit after it, which only makes the expiry later and
// the check more lenient, never wrong); false when nothing was written before t.
func (e *epochRecord) inForce(t int64) (int64, bool) {
	if e.upTo == nil { // the latest expiry up to each row, once
		e.upTo = make([]int64, len(e.exps))
		for i, x := range e.exps {
			e.upTo[i] = x.exp
			if i > 0 {
				e.upTo[i] = max(e.upTo[i], e.upTo[i-1])
			}
		}
	}
	i := sort.Search(len(e.exps), func(i int) bool { return e.exps[i].at >= t })
	if i == 0 {
		return 0, false
	}
	return e.upTo[i-1], true
}

// epochRecords reads the lease rows of a history, by lease and epoch.
func epochRecords(events []Event) map[string]*epochRecord {
	out := map[string]*epochRecord{}
	current := map[string]*epochRecord{} // lease → the epoch its row has now
	for _, e := range events {
		if e.Kind != EvLeaseRow {
			continue
		}
		k := epochKey(e.Lease, e.Epoch)
		rec := out[k]
		if rec == nil {
			rec = &epochRecord{lease: e.Lease, epoch: e.Epoch}
			out[k] = rec
		}
		if cur := current[e.Lease]; cur != nil && cur != rec && cur.released == 0 && cur.replaced == 0 {
			cur.replaced, cur.by = e.T, e.Epoch
		}
		switch e.Note {
		case "delete":
			rec.released = e.T
			delete(current, e.Lease)
			continue
		default:
			if rec.taken == 0 {
				rec.taken = e.Taken
			}
			rec.exps = append(rec.exps, expiry{at: e.T, exp: e.Exp})
		}
		current[e.Lease] = rec
	}
	return out
}

// checkNoWriteAfterLease: every accepted fenced row (a lease's job's or a shard's) was
// committed while its lease was held under its epoch, by the database's own record: before
// the expiry the row had then (a fence's deadline is earlier still), before the row was
// released, and before it was taken under another epoch (the fence's row lock holds both
// back until the writing transaction ends).
func (m *model) checkNoWriteAfterLease() Result {
	r := Result{Name: CheckNoWriteAfterLease, Bound: "the expiry in force when the row committed, the release, the takeover"}
	epochs := map[string]bool{}
	for _, row := range m.ledger() {
		r.Cases++
		k := epochKey(row.Lease, row.Epoch)
		epochs[k] = true
		rec := m.epochs[k]
		if rec == nil {
			r.Violations = append(r.Violations, fmt.Sprintf("row %d of %s under epoch %d (by %s at %s): no such epoch in the lease rows",
				row.ID, row.Lease, row.Epoch, row.Inst, ts(row.T)))
			continue
		}
		exp, ok := rec.inForce(row.T)
		switch {
		case !ok:
			r.Violations = append(r.Violations, fmt.Sprintf("row %d of %s under epoch %d (by %s) committed at %s, before the lease's row had that epoch",
				row.ID, row.Lease, row.Epoch, row.Inst, ts(row.T)))
		case row.T > exp:
			r.Violations = append(r.Violations, fmt.Sprintf("row %d of %s under epoch %d (by %s) committed at %s, after its lease expired at %s",
				row.ID, row.Lease, row.Epoch, row.Inst, ts(row.T), ts(exp)))
		case rec.released != 0 && row.T > rec.released:
			r.Violations = append(r.Violations, fmt.Sprintf("row %d of %s under epoch %d (by %s) committed at %s, after its lease was released at %s",
				row.ID, row.Lease, row.Epoch, row.Inst, ts(row.T), ts(rec.released)))
		case rec.replaced != 0 && row.T > rec.replaced:
			r.Violations = append(r.Violations, fmt.Sprintf("row %d of %s under epoch %d (by %s) committed at %s, after its lease was taken under epoch %d at %s",
				row.ID, row.Lease, row.Epoch, row.Inst, ts(row.T), rec.by, ts(rec.replaced)))
		}
	}
	r.Detail = fmt.Sprintf("%d rows accepted under %d epochs; %d epochs of the leases and shards in the lease rows", r.Cases, len(epochs), len(m.epochs))
	return r
}
