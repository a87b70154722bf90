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
	CheckOneInJob          = "never two processes inside a lease's job at once"
	CheckEpochsMonotone    = "ledger: no accepted row under an epoch older than one already written"
	CheckNoWriteAfterEnd   = "no accepted fenced write after its writer was told it lost the lease"
	CheckNoWriteAfterLease = "no accepted fenced write after its lease expired, was released or was taken, by the database's record"
	CheckNoFalseDead       = "no live, connected process called dead"
	CheckCrashDead         = "every crash called dead within the bound"
	CheckLeaseTaken        = "every lease freed by a crash taken within the bound"
	CheckSampling          = "the verdicts sampled: their gaps, in which nothing of that source was judged"
	CheckConvergence       = "after the last heal, everything converges within the bound"
	CheckTwoLeaders        = "no two-leaders alert while fencing works"
	CheckFlat              = "the observer exporter's resources flat over the run"
	CheckNoExit            = "no fleet process exited on its own"
	CheckHistory           = "the schema's history holds every leadership of the run, nothing else, one after another"

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
	Bound       string         // the bound it checks against, or ""
	Cases       int            // what it judged (jobs, rows, crashes, dips...)
	NotMeasured int            // cases it could not judge, not counted as passed
	Why         map[string]int // why, for each reason, as many cases were not judged
	Violations  []string       // each with the times and ids needed to find it in the history
	Detail      string         // a short summary for the report
}

// Failed reports whether the check found a violation.
func (r Result) Failed() bool { return len(r.Violations) > 0 }

// notJudged counts a case not judged, and why.
func (r *Result) notJudged(why string) {
	r.NotMeasured++
	if r.Why == nil {
		r.Why = map[string]int{}
	}
	r.Why[why]++
}

// WhyNot says why cases were not judged, the most frequent reason first.
func (r Result) WhyNot() string {
	reasons := make([]string, 0, len(r.Why))
	for w := range r.Why {
		reasons = append(reasons, w)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if r.Why[reasons[i]] != r.Why[reasons[j]] {
			return r.Why[reasons[i]] > r.Why[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	parts := make([]string, len(reasons))
	for i, w := range reasons {
		parts[i] = fmt.Sprintf("%s: %d", w, r.Why[w])
	}
	return strings.Join(parts, "; ")
}

// requireJudged adds a violation when fewer than MinJudged of the cases were judged.
func (r *Result) requireJudged(what string) {
	total := r.Cases + r.NotMeasured
	if total > 0 && float64(r.Cases) < MinJudged*float64(total) {
		r.Violations = append(r.Violations, fmt.Sprintf("judged %d of %d %s (%.0f %%), fewer than %.0f %%: %s",
			r.Cases, total, what, 100*float64(r.Cases)/float64(total), 100*MinJudged, r.WhyNot()))
	}
}

// judgedShare is "n of m (x %)".
func judgedShare(judged, total int) string {
	if total == 0 {
		return "0 of 0"
	}
	return fmt.Sprintf("%d of %d (%.0f %%)", judged, total, 100*float64(judged)/float64(total))
}

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
	node              string // the node agent's process it is attached to, or ""
	start, end        int64
}

// model is the history indexed for the checks.
type model struct {
	events      []Event
	runEnd      int64
	lives       []life
	byInst      map[string]*life
	faults      map[int]*faultSpan
	sorted      []*faultSpan        // faults by start
	competitors map[string][]string // lease → processes
	sets        map[string]*shardSet
	verdicts    map[string][]Event // source/inst (or source/proc for the exporter) → its verdict events
	gaps        map[string][]span  // source → its samplers' gaps
	epochs      map[string]*epochRecord
}

// shardSet is a shard set of the fleet: its shards' count and its members' processes.
type shardSet struct {
	count int
	procs []string
}

type faultSpan struct {
	id      int
	kind    string
	targets []string
	a, h    int64 // h = math.MaxInt64 while not healed
}

func (f *faultSpan) affects(proc string) bool {
	return slices.Contains(f.targets, proc) || slices.Contains(f.targets, AllProcs)
}

// endsLife says whether the fault ends its targets' instances: a kill, and a node agent's
// restart (a graceful stop).
func (f *faultSpan) endsLife() bool { return f.kind == FaultKill || f.kind == FaultNodeRestart }

func newModel(events []Event) *model {
	m := &model{events: events, byInst: map[string]*life{}, faults: map[int]*faultSpan{}, competitors: map[string][]string{},
		sets: map[string]*shardSet{}, verdicts: map[string][]Event{}, gaps: map[string][]span{}}
	for _, e := range events {
		m.runEnd = max(m.runEnd, e.T)
	}
	for _, e := range events {
		if e.Kind == EvRunEnd {
			m.runEnd = e.T
			break
		}
	}
	open := map[string]int{} // proc → index in lives of its running instance
	for _, e := range events {
		switch e.Kind {
		case EvStart:
			if i, ok := open[e.Proc]; ok {
				m.lives[i].end = e.T
			}
			m.lives = append(m.lives, life{proc: e.Proc, inst: e.Inst, lease: e.Lease, node: e.Node, start: e.T, end: math.MaxInt64})
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
			f := &faultSpan{id: e.FaultID, kind: e.Fault, targets: e.Targets, a: e.T, h: math.MaxInt64}
			m.faults[e.FaultID] = f
			m.sorted = append(m.sorted, f)
			if f.endsLife() {
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
		case EvVerdict:
			k := e.Source + "/" + e.Inst
			if e.Source == SrcExporter {
				k = e.Source + "/" + e.Proc
			}
			m.verdicts[k] = append(m.verdicts[k], e)
		case EvGap:
			m.gaps[e.Source] = append(m.gaps[e.Source], span{e.Prev, e.T})
		}
	}
	for i := range m.lives {
		if m.lives[i].end == math.MaxInt64 {
			m.lives[i].end = m.runEnd
		}
		m.byInst[m.lives[i].inst] = &m.lives[i]
	}
	m.epochs = epochRecords(events)
	return m
}

// verdictsOf are the verdict events of source on key (an instance; a process for the
// exporter), in time order.
func (m *model) verdictsOf(source, key string) []Event { return m.verdicts[source+"/"+key] }

// lastVerdict is the last event of source on key answered at or before t.
func (m *model) lastVerdict(source, key string, t int64) (Event, bool) {
	evs := m.verdictsOf(source, key)
	i := sort.Search(len(evs), func(i int) bool { return evs[i].T > t })
	if i == 0 {
		return Event{}, false
	}
	return evs[i-1], true
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

// databaseFaulted reports whether a database fault is applied at some time in x, or
// was healed less than settle before x's start.
func (m *model) databaseFaulted(x span, settle time.Duration) bool {
	for _, f := range m.sorted {
		if databaseFault[f.kind] {
			h := f.h
			if h != math.MaxInt64 {
				h += int64(settle)
			}
			if f.a <= x.b && x.a <= h {
				return true
			}
		}
	}
	return false
}

// databaseFaultApplied reports whether a database fault is applied at some time in x.
func (m *model) databaseFaultApplied(x span) bool { return m.databaseFaulted(x, 0) }

// lockAt reports whether inst's alive lock was seen held at t: its last lock verdict at
// or before t says held, and no database fault came in between (a restart takes every
// lock away; until a sample after it says held again, nobody knows whether it was).
func (m *model) lockAt(inst string, t int64) bool {
	last, ok := m.lastVerdict(SrcLock, inst, t)
	return ok && last.Alive && !m.databaseFaultApplied(span{last.T, t})
}

// faultAt is a fault of one of kinds that affects proc at t, or nil.
func (m *model) faultAt(proc string, t int64, kinds ...string) *faultSpan {
	for _, f := range m.sorted {
		if slices.Contains(kinds, f.kind) && f.affects(proc) && f.a <= t && t <= f.h {
			return f
		}
	}
	return nil
}

// faultDuring is a fault that is not the database's and targets proc (or, for an
// attached process, its node agent) at some time in x, or nil.
func (m *model) faultDuring(l *life, x span) *faultSpan {
	for _, f := range m.sorted {
		if databaseFault[f.kind] || f.a > x.b || f.h < x.a {
			continue
		}
		if slices.Contains(f.targets, l.proc) || (l.node != "" && slices.Contains(f.targets, l.node)) {
			return f
		}
	}
	return nil
}

// undisturbed reports whether inst runs through x holding its lock at x's start, with no
// fault of its process or its node agent (stopped, link down, pool exhausted, killed...)
// during x.
func (m *model) undisturbed(inst string, x span) bool {
	l := m.byInst[inst]
	return l != nil && l.start <= x.a && l.end >= x.b && m.lockAt(inst, x.a) && m.faultDuring(l, x) == nil
}

func ts(t int64) string { return time.Unix(0, t).UTC().Format("15:04:05.000") }

// Check runs every check over a history.
func Check(events []Event) []Result {
	m := newModel(events)
	return []Result{m.checkOneInJob(), m.checkEpochs(), m.checkNoWriteAfterEnd(), m.checkNoWriteAfterLease(),
		m.checkNoFalseDead(), m.checkCrashDead(), m.checkLeaseTaken(), m.checkSampling(), m.checkConvergence(),
		m.checkTwoLeaders(), m.checkFlat(), m.checkNoExit(), m.checkHistory(),
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
	r := Result{Name: CheckOneInJob, Bound: fmt.Sprintf("an overlap is excused only when the earlier holder was stopped, its lease had expired by the database's clock before the later took it, nothing of its committed after that, and it left within %s of SIGCONT", ResumeEndBound)}
	jobs := m.jobs()
	excused := m.oneAtATime(&r, jobs, "lease", "in the job")
	r.Detail = fmt.Sprintf("%d jobs; %d overlaps excused (a stopped holder past its lease's expiry); %s; %s",
		r.Cases, excused, m.lateCloses(jobs), m.lossCauses())
	return r
}

// lateCloses describes the late closes of a job's holder: how soon after its lock's
// session froze (and its backend was ended) the holder left its job, and how soon the
// next holder began.
func (m *model) lateCloses(jobs map[string][]job) string {
	n, left, next := 0, []time.Duration{}, []time.Duration{}
	for _, f := range m.sorted {
		if f.kind != FaultLateClose || len(f.targets) == 0 {
			continue
		}
		for _, js := range jobs {
			for _, j := range js {
				l := m.byInst[j.inst]
				if l == nil || l.proc != f.targets[0] || j.begin > f.a || j.end < f.a {
					continue
				}
				n++
				left = append(left, time.Duration(j.end-f.a))
				first := int64(math.MaxInt64)
				for _, k := range js {
					if k.inst != j.inst && k.begin > f.a {
						first = min(first, k.begin)
					}
				}
				if first != math.MaxInt64 {
					next = append(next, time.Duration(first-f.a))
				}
			}
		}
	}
	return fmt.Sprintf("%d late closes of a job's holder: it left its job at worst %s after the freeze, the next holder began at the earliest %s after",
		n, quantile(left, 1), quantile(next, 0))
}

// lossCauses counts the leases' losses by cause, as the holders were told: the cost of
// the leader's guarantee in availability is its step-downs for want of a proof of life
// (not_alive).
func (m *model) lossCauses() string {
	causes := map[string]int{}
	n := 0
	for _, e := range m.events {
		if e.Kind != EvLost {
			continue
		}
		n++
		cause := e.Note
		if i := strings.LastIndex(cause, "lost: "); i >= 0 {
			cause, _, _ = strings.Cut(cause[i+len("lost: "):], ":") // the reason, not an error's words
		}
		causes[cause]++
	}
	names := make([]string, 0, len(causes))
	for c := range causes {
		names = append(names, c)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, c := range names {
		parts[i] = fmt.Sprintf("%s %d", c, causes[c])
	}
	return fmt.Sprintf("%d leases lost by their holders (%s)", n, strings.Join(parts, ", "))
}

// oneAtATime adds to r a violation for every two spans of one lease that overlap, unless
// excuse proves the overlap harmless; it returns how many it excused.
func (m *model) oneAtATime(r *Result, jobs map[string][]job, what, inside string) (excused int) {
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
				why := m.excuse(a, b)
				if why == "" {
					excused++
					continue
				}
				r.Violations = append(r.Violations, fmt.Sprintf("%s %s: %s (epoch %d, %s–%s) and %s (epoch %d, from %s) %s at once: %s",
					what, lease, a.inst, a.epoch, ts(a.begin), ts(a.end), b.inst, b.epoch, ts(b.begin), inside, why))
			}
		}
	}
	return excused
}

// excuse says why the overlap of a (the earlier) and b cannot be excused, or "" when it
// is proven harmless: a's process was stopped (SIGSTOP) when b began, so that it could
// neither act nor leave; a's lease had expired by the database's clock when b's holder
// took it (not taken early from a holder called dead: the lease rows say so, not a
// sample); no row of a's committed after that expiry; and a left its job within
// ResumeEndBound of SIGCONT.
func (m *model) excuse(a, b job) string {
	l := m.byInst[a.inst]
	if l == nil {
		return "the earlier holder's instance is unknown"
	}
	f := m.faultAt(l.proc, b.begin, FaultStop)
	if f == nil || f.h == math.MaxInt64 {
		return "the earlier holder's process was not stopped when the later began"
	}
	if a.end > f.h+int64(ResumeEndBound) {
		return fmt.Sprintf("the earlier holder left %s after SIGCONT (at %s), more than %s", time.Duration(a.end-f.h).Round(time.Millisecond), ts(f.h), ResumeEndBound)
	}
	ea, eb := m.epochs[epochKey(a.lease, a.epoch)], m.epochs[epochKey(b.lease, b.epoch)]
	if ea == nil || len(ea.exps) == 0 {
		return "no record of the earlier holder's lease in the lease rows"
	}
	if eb == nil || eb.taken == 0 {
		return "no record of the later holder's acquisition in the lease rows"
	}
	expiry := ea.final()
	if expiry >= eb.taken {
		return fmt.Sprintf("the earlier lease had not expired by the database's clock when the later was taken (expires %s, taken %s)", ts(expiry), ts(eb.taken))
	}
	for _, row := range m.ledger() {
		if row.Lease == a.lease && row.Epoch == a.epoch && row.T > expiry {
			return fmt.Sprintf("row %d of the earlier holder committed at %s, after its lease expired at %s", row.ID, ts(row.T), ts(expiry))
		}
	}
	return ""
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
	inFlight := 0
	for _, row := range m.leaseRows() {
		r.Cases++
		t, ok := told[fmt.Sprintf("%s/%s/%d", row.Inst, row.Lease, row.Epoch)]
		if !ok || row.T <= t {
			continue
		}
		// A row whose transaction began before its writer was told was sent before it:
		// the fence refuses what a writer sends once told, and the database's record
		// (CheckNoWriteAfterLease) judges when it committed. One that began after is a
		// write the fence let through.
		if row.From > 0 && row.From < t {
			inFlight++
			continue
		}
		r.Violations = append(r.Violations, fmt.Sprintf("lease %s: row %d by %s under epoch %d at %s (its transaction began at %s), told at %s",
			row.Lease, row.ID, row.Inst, row.Epoch, ts(row.T), ts(row.From), ts(t)))
	}
	r.Detail = fmt.Sprintf("%d rows accepted, %d writes refused by the fence; %d committed after their writer was told, "+
		"sent before it (their transactions began before)", r.Cases, rejected, inFlight)
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
		r.notJudged("nothing started or healed")
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

// resourceSettle: the observer's resources sampled within it of a database fault's heal
// measure its reconnecting, not a leak.
const resourceSettle = 15 * time.Second

// minFlatSamples is how many samples a resource needs for its slope to mean something.
const minFlatSamples = 10

func (m *model) checkFlat() Result {
	r := Result{Name: CheckFlat, Bound: "growth by the Theil–Sen slope over the run below max(floor, share of the median): goroutines 10 or 10 %, fds 10 or 10 %, connections 2 or 25 %, RSS 16 MiB or 25 %"}
	series := map[string][][2]float64{}
	for _, e := range m.events {
		// Samples while the database is away or reconnecting measure the fault, not a leak.
		if e.Kind == EvResource && !m.databaseFaulted(span{e.T, e.T}, resourceSettle) {
			series[e.Source] = append(series[e.Source], [2]float64{float64(e.T) / 1e9, e.Value})
		}
	}
	var parts []string
	for _, name := range []string{"goroutines", "fds", "conns", "rss"} {
		s := series[name]
		if len(s) < minFlatSamples {
			r.notJudged(fmt.Sprintf("fewer than %d samples of a resource", minFlatSamples))
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
