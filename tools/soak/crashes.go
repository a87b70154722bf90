package soak

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// The crash checks: every kill is a case, judged unless something other than the kill
// could explain what followed it; the schedule keeps kills apart so that at least
// MinJudged of them are judged, and a run that judged fewer fails.

func (m *model) kills() []*faultSpan {
	var out []*faultSpan
	for _, f := range m.sorted {
		if f.kind == FaultKill {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].a < out[j].a })
	return out
}

// victim is the instance a kill ended.
func (m *model) victim(f *faultSpan) *life {
	for i := range m.lives {
		l := &m.lives[i]
		if slices.Contains(f.targets, l.proc) && l.end == f.a {
			return l
		}
	}
	return nil
}

// whyNotCrash says why a kill cannot be judged for what follows it within bound, or "".
func (m *model) whyNotCrash(f *faultSpan, l *life, bound time.Duration, stopToo bool) string {
	window := span{f.a, f.a + int64(bound)}
	kinds := []string{FaultLinkDown, FaultBlip}
	if stopToo {
		kinds = append(kinds, FaultStop)
	}
	switch {
	case l == nil:
		return "no instance was killed"
	case m.databaseFaultApplied(window):
		return "a database fault within the bound"
	case m.faultAt(l.proc, f.a, kinds...) != nil:
		return "the victim's link down or the victim stopped at the kill"
	case l.node != "" && m.faultDuring(&life{proc: l.node}, span{f.a, f.a}) != nil:
		return "the victim's node agent under a fault at the kill"
	case !m.lockAt(l.inst, f.a):
		return "the victim's alive lock not seen held at the kill"
	}
	return ""
}

func (m *model) checkCrashDead() Result {
	r := Result{Name: CheckCrashDead, Bound: fmt.Sprintf("%s (the fault suite's worst), by the SQL samples around it", CrashDeadBound)}
	var worst time.Duration
	for _, f := range m.kills() {
		l := m.victim(f)
		why := m.whyNotCrash(f, l, CrashDeadBound, false)
		if why == "" {
			if v, ok := m.lastVerdict(SrcSQL, l.inst, f.a); !ok {
				why = "no verdict on the victim before the kill"
			} else if !v.Alive {
				why = "the victim already called dead at the kill"
			}
		}
		if why != "" {
			r.notJudged(why)
			continue
		}
		// Dead at the latest when the first sample that said so was answered, and not
		// before the last one that still said alive was sent.
		var called *Event
		for _, e := range m.verdictsOf(SrcSQL, l.inst) {
			if e.T > f.a && !e.Alive {
				called = &e
				break
			}
		}
		killed := fmt.Sprintf("%s (%s) killed at %s", l.inst, l.proc, ts(f.a))
		switch {
		case called == nil:
			r.Cases++
			r.Violations = append(r.Violations, killed+", never called dead")
		case time.Duration(called.T-f.a) <= CrashDeadBound:
			r.Cases++
			worst = max(worst, time.Duration(called.T-f.a))
		case time.Duration(called.PrevFrom-f.a) > CrashDeadBound:
			r.Cases++
			r.Violations = append(r.Violations, fmt.Sprintf("%s, called dead %s later (still alive in the sample sent %s later)", killed,
				time.Duration(called.T-f.a).Round(time.Millisecond), time.Duration(called.PrevFrom-f.a).Round(time.Millisecond)))
		default:
			r.notJudged("the samples straddle the bound (a sampling gap)")
		}
	}
	r.requireJudged("kills")
	r.Detail = fmt.Sprintf("judged %s kills, worst %d ms", judgedShare(r.Cases, r.Cases+r.NotMeasured), worst.Milliseconds())
	return r
}

func (m *model) checkLeaseTaken() Result {
	r := Result{Name: CheckLeaseTaken, Bound: fmt.Sprintf("%s (the fault suite's worst)", LeaseTakeBound)}
	jobs := m.jobs()
	var worst time.Duration
	for _, f := range m.kills() {
		l := m.victim(f)
		if l == nil || l.lease == "" {
			continue
		}
		held := false
		for _, j := range jobs[l.lease] {
			if j.inst == l.inst && j.begin <= f.a && j.end >= f.a {
				held = true
			}
		}
		if !held {
			continue // not a holder: no takeover to judge
		}
		window := span{f.a, f.a + int64(LeaseTakeBound)}
		why := m.whyNotCrash(f, l, LeaseTakeBound, true)
		if why == "" {
			// Judged when a competitor could take it: running through the window with its
			// lock held and no fault of its own (or of its node agent).
			heir := false
			for _, c := range m.lives {
				if c.proc != l.proc && c.lease == l.lease && m.undisturbed(c.inst, window) {
					heir = true
				}
			}
			if !heir {
				why = "no heir undisturbed through the bound"
			}
		}
		if why != "" {
			r.notJudged(why)
			continue
		}
		r.Cases++
		taken := int64(-1)
		for _, j := range jobs[l.lease] {
			if j.inst != l.inst && j.begin > f.a && (taken < 0 || j.begin < taken) {
				taken = j.begin
			}
		}
		killed := fmt.Sprintf("lease %s of %s (%s) killed at %s", l.lease, l.inst, l.proc, ts(f.a))
		r.bounded(f.a, taken, LeaseTakeBound, &worst, killed+": never taken", killed+": taken")
	}
	r.requireJudged("kills of a lease's holder")
	r.Detail = fmt.Sprintf("judged %s kills of a lease's holder, worst %d ms", judgedShare(r.Cases, r.Cases+r.NotMeasured), worst.Milliseconds())
	return r
}
