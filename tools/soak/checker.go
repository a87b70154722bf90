package soak

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Check names, in the report's order.
const (
	CheckOneInJob        = "never two processes inside a lease's job at once"
	CheckEpochsMonotone  = "ledger: no accepted row under an epoch older than one already written"
	CheckNoWriteAfterEnd = "no accepted fenced write after its writer was told it lost the lease"
	CheckNoFalseDead     = "no live, connected process called dead"
	CheckCrashDead       = "every crash called dead within the bound"
	CheckLeaseTaken      = "every lease freed by a crash taken within the bound"
	CheckConvergence     = "after the last heal, everything converges within the bound"
	CheckTwoLeaders      = "no two-leaders alert while fencing works"
	CheckFlat            = "the observer exporter's resources flat over the run"
	CheckNoExit          = "no fleet process exited on its own"

	CheckShardOneOwner    = "shards: never two owners inside a shard's callback at once"
	CheckShardEpochs      = "shards: no accepted write under an epoch older than one already written, nor by two writers under one epoch"
	CheckShardAfterNext   = "shards: no accepted write of an owner after the shard's next owner was given it"
	CheckShardAfterLost   = "shards: no accepted write after its owner was told it lost the shard's lease"
	CheckShardsWrittenAll = "shards: after the fleet heals, every shard written again within the bound"
)

// TwoLeadersAlert is the alert of the shipped rules that fires for two processes that
// both believe they lead.
const TwoLeadersAlert = "PgLivenessLeaseTwoLeaders"

// Result is one check over a history.
type Result struct {
	Name        string
	Bound       string   // the bound it checks against, or ""
	Cases       int      // what it looked at (jobs, rows, crashes, samples...)
	NotMeasured int      // cases it could not judge (a fault overlapped), not counted as passed
	Violations  []string // each with the times and ids needed to find it in the history
	Detail      string   // a short summary for the report
}

// Failed reports whether the check found a violation.
func (r Result) Failed() bool { return len(r.Violations) > 0 }

// bounded judges one case of what must follow a fault at at within bound: it came at
// came (negative: never), and adds a violation (never, or happened followed by how much
// later) or raises worst.
func (r *Result) bounded(at, came int64, bound time.Duration, worst *time.Duration, never, happened string) {
	switch took := time.Duration(came - at); {
	case came < 0:
		r.Violations = append(r.Violations, never)
	case took > bound:
		r.Violations = append(r.Violations, fmt.Sprintf("%s %s later", happened, took.Round(time.Millisecond)))
	default:
		*worst = max(*worst, took)
	}
}

// span is a closed interval of Unix nanoseconds.
type span struct{ a, b int64 }

// life is one instance of a fleet process: from its start to its kill (or the run's end).
type life struct {
	proc, inst, lease string
	start, end        int64
}

// model is the history indexed for the checks.
type model struct {
	events      []Event
	runEnd      int64
	lives       []life
	byInst      map[string]*life
	faults      map[int]*faultSpan
	competitors map[string][]string // lease → processes
	sets        map[string]*shardSet
}

// shardSet is a shard set of the fleet: its shards' count and its members' processes.
type shardSet struct {
	count int
	procs []string
}

type faultSpan struct {
	kind    string
	targets []string
	a, h    int64 // h = math.MaxInt64 while not healed
}

func (f *faultSpan) affects(proc string) bool {
	return slices.Contains(f.targets, proc) || slices.Contains(f.targets, AllProcs)
}

func newModel(events []Event) *model {
	m := &model{events: events, byInst: map[string]*life{}, faults: map[int]*faultSpan{}, competitors: map[string][]string{},
		sets: map[string]*shardSet{}}
	for _, e := range events {
		m.runEnd = max(m.runEnd, e.T)
	}
	open := map[string]int{} // proc → index in lives of its running instance
	for _, e := range events {
		switch e.Kind {
		case EvStart:
			if i, ok := open[e.Proc]; ok {
				m.lives[i].end = e.T
			}
			m.lives = append(m.lives, life{proc: e.Proc, inst: e.Inst, lease: e.Lease, start: e.T, end: math.MaxInt64})
			open[e.Proc] = len(m.lives) - 1
			if e.Lease != "" && !slices.Contains(m.competitors[e.Lease], e.Proc) {
				m.competitors[e.Lease] = append(m.competitors[e.Lease], e.Proc)
			}
			if e.Set != "" {
				set := m.sets[e.Set]
				if set == nil {
					set = &shardSet{}
					m.sets[e.Set] = set
				}
				set.count = max(set.count, e.Shards)
				if !slices.Contains(set.procs, e.Proc) {
					set.procs = append(set.procs, e.Proc)
				}
			}
		case EvFault:
			m.faults[e.FaultID] = &faultSpan{kind: e.Fault, targets: e.Targets, a: e.T, h: math.MaxInt64}
			if e.Fault == FaultKill {
				for _, p := range e.Targets {
					if i, ok := open[p]; ok {
						m.lives[i].end = e.T
						delete(open, p)
					}
				}
			}
		case EvHeal:
			if f := m.faults[e.FaultID]; f != nil {
				f.h = e.T
			}
		case EvExit:
			if i, ok := open[e.Proc]; ok {
				m.lives[i].end = e.T
				delete(open, e.Proc)
			}
		}
	}
	for i := range m.lives {
		if m.lives[i].end == math.MaxInt64 {
			m.lives[i].end = m.runEnd
		}
		m.byInst[m.lives[i].inst] = &m.lives[i]
	}
	return m
}

// liveSpans are the times at which inst is live and connected: its process runs it, it
// started at least SettleAfterHeal ago, and no fault that affects its process (stopped,
// link down, pool exhausted, its lock's session terminated, the database restarting,
// failing over or read-only) is applied or was healed less than SettleAfterHeal ago.
func (m *model) liveSpans(inst string) []span {
	l := m.byInst[inst]
	if l == nil {
		return nil
	}
	spans := []span{{l.start + int64(SettleAfterHeal), l.end - 1}}
	for _, f := range m.faults {
		if f.kind == FaultKill || !f.affects(l.proc) {
			continue
		}
		h := f.h
		if h != math.MaxInt64 {
			h += int64(SettleAfterHeal)
		}
		spans = subtract(spans, span{f.a, h})
	}
	return spans
}

// procLiveSpans is the union of the live spans of a process's instances.
func (m *model) procLiveSpans(proc string) []span {
	var out []span
	for _, l := range m.lives {
		if l.proc == proc {
			out = append(out, m.liveSpans(l.inst)...)
		}
	}
	return out
}

func subtract(spans []span, cut span) []span {
	var out []span
	for _, s := range spans {
		if cut.b < s.a || cut.a > s.b {
			out = append(out, s)
			continue
		}
		if s.a < cut.a {
			out = append(out, span{s.a, cut.a - 1})
		}
		if cut.b < s.b {
			out = append(out, span{cut.b + 1, s.b})
		}
	}
	return out
}

func intersects(spans []span, x span) (int64, bool) {
	for _, s := range spans {
		if s.a <= x.b && x.a <= s.b {
			return max(s.a, x.a), true
		}
	}
	return 0, false
}

// databaseFaulted reports whether a database fault is applied, or was healed less than
// SettleAfterHeal ago, at some time in x.
func (m *model) databaseFaulted(x span) bool {
	for _, f := range m.faults {
		if databaseFault[f.kind] {
			h := f.h
			if h != math.MaxInt64 {
				h += int64(SettleAfterHeal)
			}
			if f.a <= x.b && x.a <= h {
				return true
			}
		}
	}
	return false
}

// databaseFaultApplied reports whether a database fault is applied at some time in x
// (its settling time not counted).
func (m *model) databaseFaultApplied(x span) bool {
	for _, f := range m.faults {
		if databaseFault[f.kind] && f.a <= x.b && x.a <= f.h {
			return true
		}
	}
	return false
}

// lockAt reports whether inst's alive lock was seen held at t: its last lock verdict at
// or before t says held, and no database fault came in between (a restart takes every
// lock away; until a sample after it says held again, nobody knows whether it was).
func (m *model) lockAt(inst string, t int64) bool {
	var last *Event
	for i, e := range m.events {
		if e.T > t {
			break
		}
		if e.Kind == EvVerdict && e.Source == SrcLock && e.Inst == inst {
			last = &m.events[i]
		}
	}
	return last != nil && last.Alive && !m.databaseFaultApplied(span{last.T, t})
}

// undisturbed reports whether inst runs through x holding its lock at x's start, with no
// fault of its process (stopped, link down, pool exhausted, killed) during x.
func (m *model) undisturbed(inst string, x span) bool {
	l := m.byInst[inst]
	if l == nil || l.start > x.a || l.end < x.b || !m.lockAt(inst, x.a) {
		return false
	}
	for _, f := range m.faults {
		if !databaseFault[f.kind] && slices.Contains(f.targets, l.proc) && f.a <= x.b && x.a <= f.h {
			return false
		}
	}
	return true
}

func (m *model) faultAt(proc string, t int64, kinds ...string) *faultSpan {
	for _, f := range m.faults {
		if slices.Contains(kinds, f.kind) && f.affects(proc) && f.a <= t && t <= f.h {
			return f
		}
	}
	return nil
}

func ts(t int64) string { return time.Unix(0, t).UTC().Format("15:04:05.000") }

// Check runs every check over a history.
func Check(events []Event) []Result {
	m := newModel(events)
	return []Result{m.checkOneInJob(), m.checkEpochs(), m.checkNoWriteAfterEnd(), m.checkNoFalseDead(),
		m.checkCrashDead(), m.checkLeaseTaken(), m.checkConvergence(), m.checkTwoLeaders(), m.checkFlat(), m.checkNoExit(),
		m.checkShardOneOwner(), m.checkShardEpochs(), m.checkShardAfterNext(), m.checkShardAfterLost(), m.checkShardsWritten()}
}

func (m *model) checkNoExit() Result {
	r := Result{Name: CheckNoExit, Cases: len(m.lives)}
	for _, e := range m.events {
		if e.Kind == EvExit {
			r.Violations = append(r.Violations, fmt.Sprintf("%s (%s) exited at %s: %s", e.Proc, e.Inst, ts(e.T), e.Note))
		}
	}
	r.Detail = fmt.Sprintf("%d instances started", r.Cases)
	return r
}

type job struct {
	inst, lease string
	epoch       int64
	begin, end  int64
}

func (m *model) jobs() map[string][]job { return m.spans(EvJobBegin, EvJobEnd) }

// spans are the stretches between begin and end events of one inst, lease and epoch, by
// lease; one not ended runs to its instance's end.
func (m *model) spans(begin, end string) map[string][]job {
	out := map[string][]job{}
	open := map[string]int{} // inst/lease/epoch → index
	key := func(e Event) string { return fmt.Sprintf("%s/%s/%d", e.Inst, e.Lease, e.Epoch) }
	for _, e := range m.events {
		switch e.Kind {
		case begin:
			until := m.runEnd
			if l := m.byInst[e.Inst]; l != nil {
				until = l.end
			}
			out[e.Lease] = append(out[e.Lease], job{inst: e.Inst, lease: e.Lease, epoch: e.Epoch, begin: e.T, end: until})
			open[key(e)] = len(out[e.Lease]) - 1
		case end:
			if i, ok := open[key(e)]; ok {
				out[e.Lease][i].end = e.T
				delete(open, key(e))
			}
		}
	}
	return out
}

func (m *model) checkOneInJob() Result {
	r := Result{Name: CheckOneInJob, Bound: fmt.Sprintf("a stopped holder leaves within %s of SIGCONT", ResumeEndBound)}
	m.oneAtATime(&r, m.jobs(), "lease", "in the job")
	r.Detail = fmt.Sprintf("%d jobs", r.Cases)
	return r
}

// oneAtATime adds to r a violation for every two spans of one lease that overlap, unless
// the earlier one's process was stopped when the later began, past its lease's expiry,
// and the earlier ended within ResumeEndBound of SIGCONT.
func (m *model) oneAtATime(r *Result, jobs map[string][]job, what, inside string) {
	names := make([]string, 0, len(jobs))
	for lease := range jobs {
		names = append(names, lease)
	}
	sort.Strings(names)
	for _, lease := range names {
		js := jobs[lease]
		sort.Slice(js, func(i, j int) bool { return js[i].begin < js[j].begin })
		r.Cases += len(js)
		for j := range js {
			for i := range js[:j] {
				a, b := js[i], js[j]
				if b.begin > a.end || a.inst == b.inst {
					continue
				}
				// The earlier holder was frozen when the later began, past its lease's
				// expiry: allowed if it leaves at once after it resumes.
				if l := m.byInst[a.inst]; l != nil {
					if f := m.faultAt(l.proc, b.begin, FaultStop); f != nil && f.h != math.MaxInt64 && a.end <= f.h+int64(ResumeEndBound) {
						continue
					}
				}
				r.Violations = append(r.Violations, fmt.Sprintf("%s %s: %s (epoch %d, %s–%s) and %s (epoch %d, from %s) %s at once",
					what, lease, a.inst, a.epoch, ts(a.begin), ts(a.end), b.inst, b.epoch, ts(b.begin), inside))
			}
		}
	}
}

func (m *model) ledger() []Event {
	var rows []Event
	for _, e := range m.events {
		if e.Kind == EvLedger {
			rows = append(rows, e)
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].ID < rows[j].ID })
	return rows
}

// leaseRows are the ledger's rows of the leases' jobs, by id; shardRows those of the
// shard sets' owners.
func (m *model) leaseRows() []Event {
	return slices.DeleteFunc(m.ledger(), func(e Event) bool { return m.isShard(e.Lease) })
}

func (m *model) shardRows() []Event {
	return slices.DeleteFunc(m.ledger(), func(e Event) bool { return !m.isShard(e.Lease) })
}

// isShard reports whether lease is a shard's ("<set>/<shard>") of a set of the fleet.
func (m *model) isShard(lease string) bool {
	for set := range m.sets {
		if strings.HasPrefix(lease, set+"/") {
			return true
		}
	}
	return false
}

func (m *model) checkEpochs() Result {
	r := Result{Name: CheckEpochsMonotone}
	top := map[string]Event{}
	for _, row := range m.leaseRows() {
		r.Cases++
		if t, ok := top[row.Lease]; ok && row.Epoch < t.Epoch {
			r.Violations = append(r.Violations, fmt.Sprintf("lease %s: row %d (epoch %d, by %s at %s) after row %d (epoch %d, by %s)",
				row.Lease, row.ID, row.Epoch, row.Inst, ts(row.T), t.ID, t.Epoch, t.Inst))
			continue
		}
		top[row.Lease] = row
	}
	r.Detail = fmt.Sprintf("%d rows", r.Cases)
	return r
}

func (m *model) checkNoWriteAfterEnd() Result {
	r := Result{Name: CheckNoWriteAfterEnd}
	told := map[string]int64{} // inst/lease/epoch → first time told (lost, or its job returned)
	rejected := 0
	for _, e := range m.events {
		switch e.Kind {
		case EvLost, EvJobEnd:
			k := fmt.Sprintf("%s/%s/%d", e.Inst, e.Lease, e.Epoch)
			if _, ok := told[k]; !ok {
				told[k] = e.T
			}
		case EvRejected:
			rejected++
		}
	}
	for _, row := range m.leaseRows() {
		r.Cases++
		if t, ok := told[fmt.Sprintf("%s/%s/%d", row.Inst, row.Lease, row.Epoch)]; ok && row.T > t {
			r.Violations = append(r.Violations, fmt.Sprintf("lease %s: row %d by %s under epoch %d at %s, told at %s",
				row.Lease, row.ID, row.Inst, row.Epoch, ts(row.T), ts(t)))
		}
	}
	r.Detail = fmt.Sprintf("%d rows accepted, %d writes refused by the fence", r.Cases, rejected)
	return r
}

// deadSpans are the verdicts' dead stretches, from the first dead sample to the last one.
func (m *model) deadSpans(src string) map[string][]span {
	out := map[string][]span{} // inst (SQL) or proc (exporter) → spans
	openAt := map[string]int64{}
	for _, e := range m.events {
		if e.Kind != EvVerdict || e.Source != src {
			continue
		}
		k := e.Inst
		if src == SrcExporter {
			k = e.Proc
		}
		if !e.Alive {
			if _, ok := openAt[k]; !ok {
				openAt[k] = e.T
			}
			continue
		}
		if a, ok := openAt[k]; ok {
			out[k] = append(out[k], span{a, max(a, e.Prev)})
			delete(openAt, k)
		}
	}
	for k, a := range openAt {
		out[k] = append(out[k], span{a, m.runEnd})
	}
	return out
}

func (m *model) checkNoFalseDead() Result {
	r := Result{Name: CheckNoFalseDead, Bound: fmt.Sprintf("live: running, not stopped, link up, pool free, database up and writable, %s past the last heal that affected it", SettleAfterHeal)}
	for src, says := range map[string]string{SrcSQL: "is_instance_alive(%s) false", SrcReader: "the Reader called %s not alive"} {
		for inst, spans := range m.deadSpans(src) {
			live := m.liveSpans(inst)
			for _, s := range spans {
				if t, ok := intersects(live, s); ok {
					r.Violations = append(r.Violations, fmt.Sprintf(says+" at %s while it was live and connected (%s)", inst, ts(t), m.procOf(inst)))
				}
			}
		}
	}
	for proc, spans := range m.deadSpans(SrcExporter) {
		live := m.procLiveSpans(proc)
		for _, s := range spans {
			if t, ok := intersects(live, s); ok {
				r.Violations = append(r.Violations, fmt.Sprintf("the exporter showed no live instance of %s at %s while it was live and connected", proc, ts(t)))
			}
		}
	}
	for _, e := range m.events {
		if e.Kind == EvVerdict && e.Source != SrcLock {
			r.Cases++
		}
	}
	r.Detail = fmt.Sprintf("%d verdict changes over %d instances", r.Cases, len(m.lives))
	return r
}

func (m *model) procOf(inst string) string {
	if l := m.byInst[inst]; l != nil {
		return l.proc
	}
	return "unknown process"
}

// verdictAt is the last SQL verdict on inst at or before t; ok false when there is none.
func (m *model) verdictAt(inst string, t int64) (alive, ok bool) {
	for _, e := range m.events {
		if e.T > t {
			break
		}
		if e.Kind == EvVerdict && e.Source == SrcSQL && e.Inst == inst {
			alive, ok = e.Alive, true
		}
	}
	return alive, ok
}

func (m *model) kills() []*faultSpan {
	var out []*faultSpan
	for _, f := range m.faults {
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

func (m *model) checkCrashDead() Result {
	r := Result{Name: CheckCrashDead, Bound: fmt.Sprintf("%s (the fault suite's worst < 3 s, plus one sample)", CrashDeadBound)}
	var worst time.Duration
	for _, f := range m.kills() {
		l := m.victim(f)
		within := span{f.a, f.a + int64(CrashDeadBound)}
		// Unmeasurable: the database was away (no verdict to read), the link was down (the
		// server cannot see the sockets close), or the instance did not hold its alive
		// lock when it was killed (nothing vanishes: its row goes stale at the threshold).
		if l == nil || m.databaseFaultApplied(within) || m.faultAt(l.proc, f.a, FaultLinkDown, FaultBlip) != nil || !m.lockAt(l.inst, f.a) {
			r.NotMeasured++
			continue
		}
		if alive, ok := m.verdictAt(l.inst, f.a); !ok {
			r.NotMeasured++
			continue
		} else if !alive {
			r.Cases++
			continue
		}
		r.Cases++
		called := int64(-1)
		for _, e := range m.events {
			if e.T >= f.a && e.Kind == EvVerdict && e.Source == SrcSQL && e.Inst == l.inst && !e.Alive {
				called = e.T
				break
			}
		}
		killed := fmt.Sprintf("%s (%s) killed at %s", l.inst, l.proc, ts(f.a))
		r.bounded(f.a, called, CrashDeadBound, &worst, killed+", never called dead", killed+", called dead")
	}
	r.Detail = fmt.Sprintf("%d crashes measured, worst %d ms", r.Cases, worst.Milliseconds())
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
			continue
		}
		within := span{f.a, f.a + int64(LeaseTakeBound)}
		// Measurable when a competitor could take it: running through the window with its
		// lock held and no fault of its own, the database there throughout, and the victim
		// holding its lock when killed (so that its death shows at once).
		heir := false
		for _, c := range m.lives {
			if c.proc != l.proc && c.lease == l.lease && m.undisturbed(c.inst, within) {
				heir = true
			}
		}
		if !heir || m.databaseFaultApplied(within) || m.faultAt(l.proc, f.a, FaultLinkDown, FaultBlip, FaultStop) != nil || !m.lockAt(l.inst, f.a) {
			r.NotMeasured++
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
	r.Detail = fmt.Sprintf("%d leases freed by a crash, worst %d ms", r.Cases, worst.Milliseconds())
	return r
}

func (m *model) checkConvergence() Result {
	r := Result{Name: CheckConvergence, Bound: fmt.Sprintf("%s from the last heal", ConvergenceBound)}
	var last int64
	for _, e := range m.events {
		if e.Kind == EvHeal || e.Kind == EvStart {
			last = max(last, e.T)
		}
	}
	if last == 0 {
		r.NotMeasured = 1
		return r
	}
	r.Cases = 1
	alive, locked := map[string]bool{}, map[string]bool{}
	holder := map[string]string{}
	openJobs := map[string]map[string]bool{}
	current := map[string]string{} // proc → inst
	missing := func() []string {
		var out []string
		for proc, inst := range current {
			if !alive[inst] || !locked[inst] {
				out = append(out, fmt.Sprintf("%s (%s): alive %v, lock %v", proc, inst, alive[inst], locked[inst]))
			}
		}
		for lease := range m.competitors {
			if holder[lease] == "" || len(openJobs[lease]) != 1 {
				out = append(out, fmt.Sprintf("lease %s: holder %q, %d in the job", lease, holder[lease], len(openJobs[lease])))
			}
		}
		sort.Strings(out)
		return out
	}
	var gap []string
	for _, e := range m.events {
		if e.T > last && len(gap) == 0 && len(missing()) == 0 {
			break
		}
		if e.T > last+int64(ConvergenceBound) {
			break
		}
		switch e.Kind {
		case EvStart:
			current[e.Proc] = e.Inst
		case EvFault:
			if e.Fault == FaultKill { // a killed holder's job ends with it
				for _, p := range e.Targets {
					for _, jobs := range openJobs {
						delete(jobs, current[p])
					}
				}
			}
		case EvVerdict:
			switch e.Source {
			case SrcSQL:
				alive[e.Inst] = e.Alive
			case SrcLock:
				locked[e.Inst] = e.Alive
			}
		case EvHolder:
			holder[e.Lease] = e.Inst
		case EvJobBegin:
			if openJobs[e.Lease] == nil {
				openJobs[e.Lease] = map[string]bool{}
			}
			openJobs[e.Lease][e.Inst] = true
		case EvJobEnd:
			delete(openJobs[e.Lease], e.Inst)
		}
		if e.T >= last {
			gap = missing()
			if len(gap) == 0 {
				r.Detail = fmt.Sprintf("converged %d ms after the last heal", time.Duration(e.T-last).Milliseconds())
				return r
			}
		}
	}
	if gap = missing(); len(gap) == 0 {
		r.Detail = "converged at the last heal"
		return r
	}
	r.Violations = append(r.Violations, fmt.Sprintf("not converged %s after the last heal (%s): %s", ConvergenceBound, ts(last), strings.Join(gap, "; ")))
	return r
}

func (m *model) checkTwoLeaders() Result {
	r := Result{Name: CheckTwoLeaders}
	for _, e := range m.events {
		if e.Kind != EvAlert {
			continue
		}
		r.Cases++
		if e.Name == TwoLeadersAlert && e.State == "firing" {
			v := fmt.Sprintf("%s firing at %s", TwoLeadersAlert, ts(e.T))
			if e.Note != "" {
				v += " (" + e.Note + ")"
			}
			r.Violations = append(r.Violations, v)
		}
	}
	var alerts []string
	seen := map[string]bool{}
	for _, e := range m.events {
		if e.Kind == EvAlert && e.State != "" && !seen[e.Name+e.State] {
			seen[e.Name+e.State] = true
			alerts = append(alerts, e.Name+" "+e.State)
		}
	}
	r.Detail = fmt.Sprintf("%d alert state changes", r.Cases)
	if len(alerts) > 0 {
		sort.Strings(alerts)
		r.Detail += "; seen: " + strings.Join(alerts, ", ")
	}
	return r
}

// Flatness tolerances: the growth a resource may show over the run by its regression
// slope, the larger of an absolute floor and a share of its median.
var flatTolerance = map[string]struct {
	floor, share float64
}{
	"goroutines": {10, 0.10},
	"fds":        {10, 0.10},
	"conns":      {2, 0.25},
	"rss":        {16 << 20, 0.25},
}

// minFlatSamples is how many samples a resource needs for its slope to mean something.
const minFlatSamples = 10

func (m *model) checkFlat() Result {
	r := Result{Name: CheckFlat, Bound: "growth by the Theil–Sen slope over the run below max(floor, share of the median): goroutines 10 or 10 %, fds 10 or 10 %, connections 2 or 25 %, RSS 16 MiB or 25 %"}
	series := map[string][][2]float64{}
	for _, e := range m.events {
		// Samples while the database is away or reconnecting measure the fault, not a leak.
		if e.Kind == EvResource && !m.databaseFaulted(span{e.T, e.T}) {
			series[e.Source] = append(series[e.Source], [2]float64{float64(e.T) / 1e9, e.Value})
		}
	}
	var parts []string
	for _, name := range []string{"goroutines", "fds", "conns", "rss"} {
		s := series[name]
		if len(s) < minFlatSamples {
			r.NotMeasured++
			continue
		}
		r.Cases++
		slope := TheilSen(s)
		growth := slope * (s[len(s)-1][0] - s[0][0])
		med := median(s)
		tol := flatTolerance[name]
		limit := math.Max(tol.floor, tol.share*med)
		parts = append(parts, fmt.Sprintf("%s median %s, growth %s", name, human(name, med), human(name, growth)))
		if growth > limit {
			r.Violations = append(r.Violations, fmt.Sprintf("%s grew by %s over the run (slope %.4g/s over %d samples; limit %s)",
				name, human(name, growth), slope, len(s), human(name, limit)))
		}
	}
	r.Detail = strings.Join(parts, "; ")
	return r
}

func human(name string, v float64) string {
	if name == "rss" {
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	}
	return fmt.Sprintf("%.1f", v)
}

// TheilSen is the median of the slopes between every pair of points: a regression slope
// that one restart's dip or spike does not move. Past theilSenPairs points, the pairs are
// each point of the first half with its partner half a run later, which keeps a two-hour
// run's thousands of samples cheap and the estimate as robust.
func TheilSen(pts [][2]float64) float64 {
	var slopes []float64
	slope := func(i, j int) {
		if dx := pts[j][0] - pts[i][0]; dx > 0 {
			slopes = append(slopes, (pts[j][1]-pts[i][1])/dx)
		}
	}
	if len(pts) > theilSenPairs {
		half := len(pts) / 2
		for i := range half {
			slope(i, i+half)
		}
	} else {
		for i := range pts {
			for j := i + 1; j < len(pts); j++ {
				slope(i, j)
			}
		}
	}
	if len(slopes) == 0 {
		return 0
	}
	sort.Float64s(slopes)
	return slopes[len(slopes)/2]
}

const theilSenPairs = 400

func median(pts [][2]float64) float64 {
	v := make([]float64, len(pts))
	for i, p := range pts {
		v[i] = p[1]
	}
	sort.Float64s(v)
	return v[len(v)/2]
}
