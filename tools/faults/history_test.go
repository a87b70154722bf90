package faults

import (
	"context"
	"math"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// deathRecord is what the schema's history (migration 0020) says of one crash: the
// victim's death and the lease's takeover by the heir.
type deathRecord struct {
	vanished, dead time.Time // the lock's vanishing as stamped; the death by the rule
	taken          time.Time // the heir's acquisition
	takenSince     time.Time // the acquisition's "last led"
	takenDeadAt    time.Time // the acquisition's "holder dead at"
}

// checkHistoryOfCrash checks that the history says what the suite measured of a crash
// of victim, holder of lease, taken over by heir (t0 the kill): one death, with its
// lock's vanishing after the kill and its verdict between the sampler's last alive sample
// of the victim and its first dead one (each sample is evaluated between its From and its
// At, so the bracket is exact, whatever the machine's load); the takeover's acquisition
// after the death and no later than the first sample that shows the heir holding the
// lease, its gap starting at the vanishing and its takeover at the death; and the
// observer's histograms holding those very durations, once each. The history's three
// durations are added to the scenario's report.
func (sc *scenario) checkHistoryOfCrash(dsn string, s *verdictLog, obsURL, lease, service string, victim, heir uuid.UUID, t0 time.Time) {
	sc.t.Helper()
	t := sc.t
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Errorf("history: %v", err)
		return
	}
	defer conn.Close(context.Background())
	var r deathRecord
	var deaths int
	err = conn.QueryRow(ctx, `SELECT count(*), max(since), max(at) FROM `+schema+`.history
		WHERE kind = 'dead' AND instance_id = $1 AND how = 'lock_lost'`, victim).Scan(&deaths, &r.vanished, &r.dead)
	if err != nil || deaths != 1 {
		t.Errorf("history: %d lock_lost deaths of the victim %s (%v); want one", deaths, victim, err)
		return
	}
	err = conn.QueryRow(ctx, `SELECT at, since, dead_at FROM `+schema+`.history
		WHERE kind = 'acquired' AND lease_name = $1 AND instance_id = $2 AND how = 'holder_dead'`, lease, heir).
		Scan(&r.taken, &r.takenSince, &r.takenDeadAt)
	if err != nil {
		t.Errorf("history: the heir's takeover of %s from the dead holder: %v", lease, err)
		return
	}
	// The death counts from a stamp of the lock's vanishing: two stampers at once (the
	// watcher and a consumer's look) may each record one.
	var stamps int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.history WHERE kind = 'lock_vanished' AND instance_id = $1 AND at = $2`,
		victim, r.vanished).Scan(&stamps); err != nil || stamps != 1 {
		t.Errorf("history: the death's last sign of life %v is no stamp of the lock's vanishing (%v)", r.vanished, err)
		rows, _ := conn.Query(ctx, `SELECT id, at, kind, coalesce(how, ''), since, dead_at FROM `+schema+`.history WHERE instance_id = $1 ORDER BY id`, victim)
		for rows.Next() {
			var id int64
			var at time.Time
			var kind, how string
			var since, deadAt *time.Time
			_ = rows.Scan(&id, &at, &kind, &how, &since, &deadAt)
			t.Logf("history of the victim: %d %v %s %s since %v dead_at %v", id, at, kind, how, since, deadAt)
		}
		rows.Close()
	}

	if !r.vanished.After(t0) {
		t.Errorf("history: the victim's lock vanished at %v, before its kill at %v", r.vanished, t0)
	}
	lastAlive, firstDead, ok := bracket(s.sqlSince(t0), instDead(victim))
	switch {
	case !ok:
		t.Errorf("history: the sampler never saw the victim dead")
	case !r.dead.After(lastAlive.From) || r.dead.After(firstDead.At):
		t.Errorf("history: the victim died at %v by the history; the sampler saw it alive in a sample sent at %v and dead in one answered at %v",
			r.dead, lastAlive.From, firstDead.At)
	}
	_, firstHeld, ok := bracket(s.sqlSince(t0), leaseHeldBy(lease, heir))
	switch {
	case !ok:
		t.Errorf("history: the sampler never saw the heir holding %s", lease)
	case r.taken.Before(r.dead) || r.taken.After(firstHeld.At):
		t.Errorf("history: %s taken at %v by the history; want after the death %v and by the sample that first showed it, answered at %v",
			lease, r.taken, r.dead, firstHeld.At)
	}
	if !r.takenSince.Equal(r.vanished) || !r.takenDeadAt.Equal(r.dead) {
		t.Errorf("history: the takeover counts its gap from %v and the takeover from %v; want the vanishing %v and the death %v",
			r.takenSince, r.takenDeadAt, r.vanished, r.dead)
	}
	detection, takeover, leaderless := r.dead.Sub(r.vanished), r.taken.Sub(r.dead), r.taken.Sub(r.vanished)
	sc.observe("history: lock vanished → dead", trialWindow, detection, true)
	sc.observe("history: dead → lease taken", trialWindow, takeover, true)
	sc.observe("history: leaderless (lock vanished → taken)", trialWindow, leaderless, true)

	// The observer's histograms: the same durations, once each.
	for _, h := range []struct {
		name   string
		labels []string
		want   time.Duration
	}{
		{"pg_liveness_lease_takeover_seconds", []string{"lease", lease}, takeover},
		{"pg_liveness_lease_leaderless_seconds", []string{"lease", lease, "after", "holder_dead"}, leaderless},
		{"pg_liveness_instance_death_detection_seconds", []string{"service", service, "how", "lock_lost"}, detection},
	} {
		var got *dto.Histogram
		seen := testutil.Poll(15*time.Second, func() bool {
			got = scrapeHistogram(obsURL, h.name, h.labels...)
			return got.GetSampleCount() > 0
		})
		if !seen || got.GetSampleCount() != 1 || math.Abs(got.GetSampleSum()-h.want.Seconds()) > 1e-6 {
			t.Errorf("observer: %s%v: %d observations summing %v s; want one, the history's %v",
				h.name, h.labels, got.GetSampleCount(), got.GetSampleSum(), h.want)
		}
	}
}

// bracket returns the last sample that does not meet cond before the first that does,
// and that first one; ok false when no sample meets it (or none precedes it).
func bracket(smps []sqlSample, cond func(sqlSample) bool) (before, first sqlSample, ok bool) {
	for i, smp := range smps {
		if cond(smp) {
			if i == 0 {
				return before, smp, false
			}
			return smps[i-1], smp, true
		}
	}
	return before, first, false
}

// scrapeHistogram scrapes url once and returns the histogram series of name with the
// label pairs, nil when there is none (or the scrape failed).
func scrapeHistogram(url, name string, pairs ...string) *dto.Histogram {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil
	}
	for _, m := range fams[name].GetMetric() {
		match := true
		for i := 0; i+1 < len(pairs); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == pairs[i] && l.GetValue() == pairs[i+1])
			}
			match = match && found
		}
		if match {
			return m.GetHistogram()
		}
	}
	return nil
}

// leaseStep is one row of a lease's history as checkLeaseHistories reads it.
type leaseStep struct {
	Lease string
	Kind  string
	Epoch int64
	How   string
	At    time.Time
	Since *time.Time
}

// checkLeaseHistories checks the history of every lease whose name is LIKE pattern
// against the shape every leadership has, whatever happened to it: the lease's rows
// alternate acquired, ended, acquired..., each end of the acquisition before it (same
// epoch), epochs rising, each acquisition no earlier than the end before it and counting
// its gap from that end (but the first, which was free). It returns the acquisitions,
// for the scenario's own comparisons.
func (sc *scenario) checkLeaseHistories(dsn, pattern string) []leaseStep {
	sc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		sc.t.Errorf("history: %v", err)
		return nil
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT lease_name, kind, epoch, how, at, since FROM `+schema+`.history
		WHERE lease_name LIKE $1 ORDER BY lease_name, id`, pattern)
	if err != nil {
		sc.t.Errorf("history: %v", err)
		return nil
	}
	steps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[leaseStep])
	if err != nil {
		sc.t.Errorf("history: %v", err)
		return nil
	}
	var acquired []leaseStep
	var prev *leaseStep
	bad := 0
	complain := func(format string, args ...any) {
		if bad++; bad <= 5 {
			sc.t.Errorf("history: "+format, args...)
		}
	}
	for i := range steps {
		st := &steps[i]
		if prev != nil && prev.Lease != st.Lease {
			prev = nil
		}
		switch {
		case st.Kind == "acquired" && prev == nil:
			if st.How != "free" && st.How != "released" {
				complain("%s's first acquisition is %s; want free or released", st.Lease, st.How)
			}
		case st.Kind == "acquired" && prev.Kind == "ended":
			if st.Epoch <= prev.Epoch || st.At.Before(prev.At) || st.Since == nil || !st.Since.Equal(prev.At) {
				complain("%s epoch %d acquired at %v (since %v) after epoch %d ended at %v; want a later epoch, at or after that end, counted from it",
					st.Lease, st.Epoch, st.At, st.Since, prev.Epoch, prev.At)
			}
		case st.Kind == "ended" && prev != nil && prev.Kind == "acquired":
			if st.Epoch != prev.Epoch {
				complain("%s: epoch %d ended while epoch %d led", st.Lease, st.Epoch, prev.Epoch)
			}
		default:
			was := "nothing"
			if prev != nil {
				was = prev.Kind
			}
			complain("%s: %s (epoch %d) after %s: two leaderships at once, or an end of none", st.Lease, st.Kind, st.Epoch, was)
		}
		if st.Kind == "acquired" {
			acquired = append(acquired, *st)
		}
		prev = st
	}
	if bad > 5 {
		sc.t.Errorf("history: %d faults in all", bad)
	}
	return acquired
}
