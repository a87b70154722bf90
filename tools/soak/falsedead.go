package soak

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// The false-dead check. An instance is live and connected by evidence, not by a fixed
// time after a fault: from the answer of the first SQL sample that found the process's
// own evidence (provesLife) among those sent after it started, or after the heal of the
// last fault that disturbed its process (the samplers record each instance's verdict afresh after every heal), until
// the next such fault or its end. Within such a span, any source that calls it dead is a
// violation: nothing but a bug (of the library, of the verdict's rule, of a reader of it)
// can take a proven instance's life away while nothing disturbs it.
//
// What disturbs a process: a fault that targets it (stopped, link down, pool exhausted,
// its lock's session ended or frozen) and the database's faults. A node agent's fault does
// not disturb the processes attached to it: they must prove life by their heartbeats
// (liveness/doc.go, "One session per node"), and are judged throughout.

// provesLife reports whether a verdict's state stands on the process's own evidence: its
// lock held with a fresh beat (alive), or a fresh beat of a row that claims no lock
// (heartbeat_only). The other states that say alive do not show that the process reaches
// the database: lock_lost is the rule's benefit of the doubt (the lock is gone and the
// grace has not run out, or the absence could not be stamped while the database was
// read-only), lock_only and zombie stand on a lock that a session the process gave up
// may hold until the server learns of it.
func provesLife(e Event) bool {
	return e.Alive && (e.Note == "alive" || e.Note == "heartbeat_only")
}

// window is a stretch between disturbances of an instance: from its start or a heal, to
// the next disturbance or its end; proof is the sample that proved it live, if any.
type window struct {
	from, next int64
	heal       bool // from is a heal (else the start)
	proof      *Event
}

// disturbances are the merged stretches in which faults disturbed l's process.
func (m *model) disturbances(l *life) []span {
	var d []span
	for _, f := range m.sorted {
		if f.endsLife() || !f.affects(l.proc) || f.h < l.start || f.a > l.end {
			continue
		}
		d = append(d, span{f.a, f.h})
	}
	sort.Slice(d, func(i, j int) bool { return d[i].a < d[j].a })
	var out []span
	for _, s := range d {
		if n := len(out); n > 0 && s.a <= out[n-1].b {
			out[n-1].b = max(out[n-1].b, s.b)
			continue
		}
		out = append(out, s)
	}
	return out
}

// windows are l's stretches between disturbances, each with its proof of life.
func (m *model) windows(l *life) []window {
	var out []window
	from, heal := l.start, false
	for _, d := range append(m.disturbances(l), span{l.end, math.MaxInt64}) {
		if d.a > from {
			out = append(out, window{from: from, next: min(d.a, l.end), heal: heal})
		}
		if d.b == math.MaxInt64 {
			break
		}
		from, heal = max(from, d.b), true
	}
	evs := m.verdictsOf(SrcSQL, l.inst)
	for i := range out {
		w := &out[i]
		for j := sort.Search(len(evs), func(j int) bool { return evs[j].T > w.from }); j < len(evs) && evs[j].T <= w.next; j++ {
			if evs[j].From >= w.from && provesLife(evs[j]) {
				w.proof = &evs[j]
				break
			}
		}
	}
	return out
}

// dip is a run of samples of one source that said dead: the first one sent at first.From
// and answered at first.T, the last one sent at lastFrom and answered at lastAt (open: it
// lasted until the sampling ended).
type dip struct {
	first            Event
	lastFrom, lastAt int64
	open             bool
}

func (m *model) dips(source, key string) []dip {
	var out []dip
	var cur *dip
	for _, e := range m.verdictsOf(source, key) {
		switch {
		case !e.Alive && cur == nil:
			cur = &dip{first: e}
		case e.Alive && cur != nil:
			cur.lastFrom, cur.lastAt = e.PrevFrom, e.Prev
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil {
		cur.lastFrom, cur.lastAt, cur.open = m.runEnd, m.runEnd, true
		out = append(out, *cur)
	}
	return out
}

// provenIn reports whether a sample of the dip that said dead was sent and answered
// inside live: the first or the last sample, or one between them (they all said dead):
// where live and the dip's inside overlap for two gap limits without a gap of the
// source, some sample was sent and answered there.
func (m *model) provenIn(d dip, live span, source string) bool {
	inside := func(from, at int64) bool { return from >= live.a && at <= live.b }
	if inside(d.first.From, d.first.T) || (!d.open && inside(d.lastFrom, d.lastAt)) {
		return true
	}
	overlap := []span{{max(d.first.T, live.a), min(d.lastFrom, live.b)}}
	if overlap[0].a >= overlap[0].b {
		return false
	}
	for _, g := range m.gaps[source] {
		overlap = subtract(overlap, g)
	}
	for _, s := range overlap {
		if time.Duration(s.b-s.a) >= 2*GapLimit(source) {
			return true
		}
	}
	return false
}

func (m *model) checkNoFalseDead() Result {
	r := Result{Name: CheckNoFalseDead, Bound: "live and connected: from the first SQL sample sent after its start, or after the heal of the last fault that disturbed its process, that found its own evidence (state alive or heartbeat_only), to the next such fault"}
	var judged time.Duration
	var proofs []time.Duration
	live := map[string][]span{} // inst → live spans
	procLive := map[string][]span{}
	for i := range m.lives {
		l := &m.lives[i]
		for _, w := range m.windows(l) {
			if w.proof == nil {
				if w.heal {
					r.notJudged("a heal not followed by a proof of life before the next fault or the end")
				} else {
					r.notJudged("an instance never proven live")
				}
				continue
			}
			r.Cases++
			if w.heal {
				proofs = append(proofs, time.Duration(w.proof.T-w.from))
			}
			s := span{w.proof.T, w.next}
			judged += time.Duration(s.b - s.a)
			live[l.inst] = append(live[l.inst], s)
			procLive[l.proc] = append(procLive[l.proc], s)
		}
	}
	dips, outside := 0, 0
	judge := func(source, key, says string, spans []span) {
		for _, d := range m.dips(source, key) {
			dips++
			hit := false
			for _, s := range spans {
				if m.provenIn(d, s, source) {
					r.Violations = append(r.Violations, fmt.Sprintf(says+" from %s (sample sent %s) while it was proven live and connected since %s", key, ts(d.first.T), ts(d.first.From), ts(s.a)))
					hit = true
					break
				}
			}
			if !hit {
				outside++
			}
		}
	}
	insts := make([]string, 0, len(m.byInst))
	for inst := range m.byInst {
		insts = append(insts, inst)
	}
	sort.Strings(insts)
	for _, inst := range insts {
		judge(SrcSQL, inst, "is_instance_alive(%s) false", live[inst])
		judge(SrcReader, inst, "the Reader called %s not alive", live[inst])
	}
	procs := make([]string, 0, len(procLive))
	for p := range procLive {
		procs = append(procs, p)
	}
	sort.Strings(procs)
	for _, p := range procs {
		judge(SrcExporter, p, "the exporter showed no live instance of %s", procLive[p])
	}
	var lifetime time.Duration
	for _, l := range m.lives {
		lifetime += time.Duration(l.end - l.start)
	}
	r.Detail = fmt.Sprintf("%d stretches proven live, %s of %s instance time (%.0f %%); proof of life after a heal within %s (median), %s (worst) over %d heals; "+
		"%d dead dips seen, %d outside the proven stretches (during a fault, after a heal before the proof, after a kill)",
		r.Cases, judged.Round(time.Second), lifetime.Round(time.Second), 100*judged.Seconds()/max(lifetime.Seconds(), 1e-9),
		quantile(proofs, 0.5), quantile(proofs, 1), len(proofs), dips, outside)
	return r
}

// quantile is the q-quantile of ds, rounded to the millisecond; "–" when empty.
func quantile(ds []time.Duration, q float64) string {
	if len(ds) == 0 {
		return "–"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s)-1)+0.5))].Round(time.Millisecond).String()
}

// checkSampling states how closely each source of verdicts was sampled: its gaps
// (samples more than GapLimit apart) outside the database's faults, in which the false-dead
// check could not judge that source. It fails nothing: the false-dead check judges only
// what was sampled.
func (m *model) checkSampling() Result {
	r := Result{Name: CheckSampling, Bound: fmt.Sprintf("SQL every %s, the Reader every %s, the exporter every %s; a gap: samples more than %d periods apart",
		SQLSampleEvery, ReaderSampleEvery, ExporterSampleEvery, GapFactor)}
	var parts []string
	var start int64 = math.MaxInt64
	for _, l := range m.lives {
		start = min(start, l.start)
	}
	run := time.Duration(max(m.runEnd-start, 1))
	for _, src := range []string{SrcSQL, SrcReader, SrcExporter} {
		n, worst, total := 0, time.Duration(0), time.Duration(0)
		for _, g := range m.gaps[src] {
			if m.databaseFaulted(g, 0) {
				continue
			}
			n++
			d := time.Duration(g.b - g.a)
			total += d
			worst = max(worst, d)
		}
		r.Cases++
		parts = append(parts, fmt.Sprintf("%s: %d gaps outside the database's faults, %s in all (%.2f %% of the run), worst %s",
			src, n, total.Round(time.Millisecond), 100*total.Seconds()/run.Seconds(), worst.Round(time.Millisecond)))
	}
	r.Detail = joinSemi(parts)
	return r
}

func joinSemi(parts []string) string {
	out := ""
	for i, p := range parts {
		if i > 0 {
			out += "; "
		}
		out += p
	}
	return out
}
