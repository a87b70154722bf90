package status_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// fleetActions does what writes the history, through the schema's own functions: leases
// taken (liveness.lease_take), let go (liveness.lease_let_go), left to expire and taken
// over; instances inserted, heartbeating by hand, and removed.
type fleetActions struct {
	t    *testing.T
	ctx  context.Context
	pool *pgxpool.Pool
}

// span is when an action happened by the database's clock: read before and after it,
// in statements of their own. What the history records of the action lies within.
type span struct{ lo, hi time.Time }

func (s span) has(t time.Time) bool { return !t.Before(s.lo) && !t.After(s.hi) }

func (s span) String() string { return ts(&s.lo) + "…" + ts(&s.hi) }

// taken is what lease_take answered, and when it ran.
type taken struct {
	epoch     int64
	expiresAt time.Time
	at        span
}

func (f fleetActions) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatalf("%.80s: %v", sql, err)
	}
}

func (f fleetActions) clock() time.Time {
	f.t.Helper()
	var now time.Time
	if err := f.pool.QueryRow(f.ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		f.t.Fatal(err)
	}
	return now
}

// instance inserts an instance that heartbeats by hand (no alive lock), dead by the
// verdict once its heartbeat is older than stale.
func (f fleetActions) instance(host string, stale time.Duration) uuid.UUID {
	f.t.Helper()
	id := uuid.New()
	f.exec(`INSERT INTO liveness.instances (instance_id, service_name, host_name, process_id, stale_threshold)
	        VALUES ($1, 'checkout', $2, 4242, make_interval(secs => $3))`, id, host, stale.Seconds())
	return id
}

// heartbeat stamps the instance's heartbeat now, and returns when, by the database's clock.
func (f fleetActions) heartbeat(id uuid.UUID) time.Time {
	f.t.Helper()
	var at time.Time
	if err := f.pool.QueryRow(f.ctx, `UPDATE liveness.instances SET last_heartbeat_at = now() WHERE instance_id = $1
	                                  RETURNING last_heartbeat_at`, id).Scan(&at); err != nil {
		f.t.Fatal(err)
	}
	return at
}

func (f fleetActions) take(lease, holder string, ttl time.Duration, id uuid.UUID, host string) taken {
	f.t.Helper()
	var epoch *int64
	var expires *time.Time
	lo := f.clock()
	if err := f.pool.QueryRow(f.ctx, `SELECT epoch, expires_at FROM liveness.lease_take($1, $2, $3, $4, $5)`,
		lease, holder, ttl.Seconds(), id, host).Scan(&epoch, &expires); err != nil {
		f.t.Fatal(err)
	}
	if epoch == nil {
		f.t.Fatalf("%s could not take lease %s", host, lease)
	}
	return taken{*epoch, *expires, span{lo, f.clock()}}
}

// letGo lets the lease go, saying why when reason is not "" (the history's stepped_down),
// as the library's lease_release statement does, and returns when.
func (f fleetActions) letGo(lease, holder string, epoch int64, reason string) span {
	f.t.Helper()
	lo := f.clock()
	var n int64
	if err := f.pool.QueryRow(f.ctx, `SELECT liveness.lease_let_go($1, $2, $3) FROM set_config('pg_liveness.end_reason', $4, true)`,
		lease, holder, epoch, string(reason)).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	if n != 1 {
		f.t.Fatalf("lease_let_go(%s, epoch %d) let go %d leases", lease, epoch, n)
	}
	return span{lo, f.clock()}
}

// history is what happened in historyFixture, as its actions answered.
type history struct {
	a, b, c, d          uuid.UUID
	job                 [5]taken // e1 … e5
	released2, stepped3 span
	released5           span
	lastBeatB           time.Time
	steady, lapsed      taken
}

// historyFixture writes a history by doing things:
//
//   - lease "job": a takes it for a second and lets it expire; b takes it over (expired),
//     lets it go; a takes it (released), steps down saying why (stepped_down); b takes it
//     (released) and dies: its heartbeat goes stale; a takes it over (holder_dead) and
//     steps down: nobody leads it now.
//   - lease "steady": c takes it and holds it. Lease "lapsed": c takes it for a second and
//     nobody takes it after: its row says it expired, the history does not yet.
//   - instance b is reaped (removed dead), a leaves (removed alive); d's alive lock
//     vanishes and comes back, as the watcher stamps it.
func historyFixture(t *testing.T, ctx context.Context, db *pgtest.DB, pool *pgxpool.Pool) history {
	t.Helper()
	f := fleetActions{t, ctx, pool}
	var h history
	h.a, h.b, h.c = f.instance("node-a", time.Minute), f.instance("node-b", 2*time.Second), f.instance("node-c", time.Minute)

	h.job[0] = f.take("job", "a", time.Second, h.a, "node-a")
	time.Sleep(time.Until(h.job[0].expiresAt.Add(200 * time.Millisecond)))
	f.heartbeat(h.b)
	h.job[1] = f.take("job", "b", time.Minute, h.b, "node-b")
	h.released2 = f.letGo("job", "b", h.job[1].epoch, "")
	h.job[2] = f.take("job", "a", time.Minute, h.a, "node-a")
	h.stepped3 = f.letGo("job", "a", h.job[2].epoch, "not_alive")
	f.heartbeat(h.b)
	h.job[3] = f.take("job", "b", time.Minute, h.b, "node-b")
	h.lastBeatB = f.heartbeat(h.b) // its last sign of life: then it stops

	h.steady = f.take("steady", "c", time.Hour, h.c, "node-c")
	h.lapsed = f.take("lapsed", "c", time.Second, h.c, "node-c")

	// d holds its alive lock in a session of its own; the session ends, the watcher's
	// stamp records the lock vanished (once the server has let the lock go); a new
	// session claims it again, the next stamp records it back.
	h.d = uuid.New()
	f.exec(`INSERT INTO liveness.instances (instance_id, service_name, host_name, holds_alive_lock, lock_grace)
	        VALUES ($1, 'billing', 'node-d', true, '1 hour')`, h.d)
	lock := db.ConnAs(t, "billing:alive-lock")
	if _, err := lock.Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, h.d); err != nil {
		t.Fatal(err)
	}
	if err := lock.Close(ctx); err != nil {
		t.Fatal(err)
	}
	stamp := func() int {
		var missing int
		if err := pool.QueryRow(ctx, `SELECT liveness.stamp_alive_lock_absences()`).Scan(&missing); err != nil {
			t.Fatal(err)
		}
		return missing
	}
	for deadline := time.Now().Add(10 * time.Second); stamp() != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("d's alive lock is still held 10 s after its session closed")
		}
	}
	if _, err := db.ConnAs(t, "billing:alive-lock").Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, h.d); err != nil {
		t.Fatal(err)
	}
	if n := stamp(); n != 0 {
		t.Fatalf("%d alive locks missing after d claimed its own again", n)
	}

	time.Sleep(time.Until(h.lastBeatB.Add(2*time.Second + 300*time.Millisecond))) // b is stale: dead
	f.heartbeat(h.a)
	h.job[4] = f.take("job", "a", time.Minute, h.a, "node-a")
	h.released5 = f.letGo("job", "a", h.job[4].epoch, "expired")
	f.exec(`DELETE FROM liveness.instances WHERE instance_id = $1`, h.b)
	f.exec(`DELETE FROM liveness.instances WHERE instance_id = $1`, h.a)
	return h
}

func readPage(t *testing.T, h http.Handler, target string) status.Page {
	t.Helper()
	res, body := get(t, h, target)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s\n%.2000s", target, res.Status, body)
	}
	var p status.Page
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func leaseHistory(t *testing.T, h *status.HistoryView, name string) status.LeaseHistoryView {
	t.Helper()
	for _, l := range h.Leases {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("no history of lease %q in %+v", name, h.Leases)
	return status.LeaseHistoryView{}
}

func lifeOf(t *testing.T, h *status.HistoryView, id uuid.UUID) status.InstanceLifeView {
	t.Helper()
	for _, l := range h.Instances {
		if l.InstanceID == id.String() {
			return l
		}
	}
	t.Fatalf("no life of instance %s in %+v", id, h.Instances)
	return status.InstanceLifeView{}
}

func same(a *time.Time, b time.Time) bool { return a != nil && a.Equal(b) }

func ts(t *time.Time) string {
	if t == nil {
		return "null"
	}
	return t.UTC().Format("15:04:05.000000")
}

// The JSON form's leaderships and gaps are what the fixture did, to the microsecond of
// the database's clock: each epoch's holder, how it began and ended, and each time
// nobody led the lease, with how long and after what; the lease whose row says it
// expired is shown expired although the history does not record it yet; the instances'
// lives are their deaths (with the detection time), removals and lock absences.
func TestHistoryLeadershipsAndGapsAreWhatHappened(t *testing.T) {
	db, pool, ctx := setup(t)
	h := historyFixture(t, ctx, db, pool)
	p := readPage(t, newHandler(t, pool), "/status.json")
	v := p.History
	if v == nil || !v.Available || v.Truncated || len(v.Skipped) != 0 || len(p.Errors) != 0 {
		t.Fatalf("history %+v, errors %v", v, p.Errors)
	}
	if v.WindowSeconds != 86400 || v.To.Sub(v.From) != 24*time.Hour || v.MaxEvents != status.MaxHistoryEvents {
		t.Errorf("window %s to %s (%v s), max %d", v.From, v.To, v.WindowSeconds, v.MaxEvents)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM liveness.history`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if len(v.Events) != rows || v.EventsTotal != rows || v.Events[0].ID < v.Events[len(v.Events)-1].ID {
		t.Errorf("%d events, newest first %v; the history has %d rows", len(v.Events), v.Events[0].ID > v.Events[len(v.Events)-1].ID, rows)
	}

	// Each leadership: its epoch and holder, begun while its take ran, ended while its
	// release ran, or at its expiry, or at its dead holder's last heartbeat.
	job := leaseHistory(t, v, "job")
	deadAt := h.lastBeatB.Add(2 * time.Second) // b's heartbeat threshold after its last
	type want struct {
		taken      taken
		holder     uuid.UUID
		ended      span
		began, how string
		reason     string
	}
	exactly := func(at time.Time) span { return span{at, at} }
	wants := []want{
		{h.job[0], h.a, exactly(h.job[0].expiresAt), "free", "expired", ""},
		{h.job[1], h.b, h.released2, "expired", "released", ""},
		{h.job[2], h.a, h.stepped3, "released", "stepped_down", string("not_alive")},
		{h.job[3], h.b, exactly(h.lastBeatB), "released", "holder_dead", ""},
		{h.job[4], h.a, h.released5, "holder_dead", "stepped_down", string("expired")},
	}
	if len(job.Leaderships) != len(wants) {
		t.Fatalf("job: %d leaderships, want %d: %+v", len(job.Leaderships), len(wants), job.Leaderships)
	}
	for i, w := range wants {
		l := job.Leaderships[i]
		if l.Epoch != w.taken.epoch || l.HolderInstanceID != w.holder.String() || !w.taken.at.has(l.From) || l.To == nil ||
			!w.ended.has(*l.To) || l.Began != w.began || l.Ended != w.how || l.Reason != w.reason || !l.EndRecorded {
			t.Errorf("job leadership %d: epoch %d holder %s %s–%s began %q ended %q (%q) recorded %v;\n"+
				"want epoch %d holder %s from within %s to within %s, began %q ended %q (%q)", i+1, l.Epoch, l.HolderInstanceID,
				ts(&l.From), ts(l.To), l.Began, l.Ended, l.Reason, l.EndRecorded, w.taken.epoch, w.holder, w.taken.at, w.ended,
				w.began, w.how, w.reason)
		}
	}
	// Each gap: from a leadership's end to the next one's start, after how it ended; the
	// last one has not ended. After b's death: b's death by the verdict in it.
	afters := []string{"expired", "released", "released", "holder_dead", "released"}
	if len(job.Gaps) != len(afters) {
		t.Fatalf("job: %d gaps, want %d: %+v", len(job.Gaps), len(afters), job.Gaps)
	}
	for i, after := range afters {
		g, before := job.Gaps[i], job.Leaderships[i]
		to, end := v.To, (*time.Time)(nil)
		if i+1 < len(job.Leaderships) {
			end = &job.Leaderships[i+1].From
			to = *end
		}
		seconds := to.Sub(g.From).Seconds()
		wantDead := i == 3
		if before.To == nil || !g.From.Equal(*before.To) || (end == nil) != (g.To == nil) || (end != nil && !g.To.Equal(*end)) ||
			g.After != after || g.Seconds < seconds-1e-6 || g.Seconds > seconds+1e-6 ||
			wantDead != (g.HolderDeadAt != nil) || (wantDead && !g.HolderDeadAt.Equal(deadAt)) {
			t.Errorf("job gap %d: %s–%s %.6f s after %q, holder dead at %s; want %s–%s %.6f s after %q, dead at %v", i+1,
				ts(&g.From), ts(g.To), g.Seconds, g.After, ts(g.HolderDeadAt), ts(before.To), ts(end), seconds, after, wantDead)
		}
	}

	steady := leaseHistory(t, v, "steady")
	if len(steady.Leaderships) != 1 || steady.Leaderships[0].To != nil || steady.Leaderships[0].Ended != "" ||
		steady.Leaderships[0].Epoch != h.steady.epoch || !h.steady.at.has(steady.Leaderships[0].From) || len(steady.Gaps) != 0 {
		t.Errorf("steady: %+v; want one leadership, led now", steady)
	}
	lapsed := leaseHistory(t, v, "lapsed")
	if len(lapsed.Leaderships) != 1 || !same(lapsed.Leaderships[0].To, h.lapsed.expiresAt) || lapsed.Leaderships[0].Ended != "expired" ||
		lapsed.Leaderships[0].EndRecorded || len(lapsed.Gaps) != 1 || !lapsed.Gaps[0].From.Equal(h.lapsed.expiresAt) ||
		lapsed.Gaps[0].To != nil || lapsed.Gaps[0].After != "expired" {
		t.Errorf("lapsed: %+v; want its leadership ended at its expiry (by its row), then no leader", lapsed)
	}
	// Leaderless now first (job, lapsed: the longer gaps first), then the led one.
	if len(v.Leases) != 3 || v.Leases[0].Name != "job" || v.Leases[1].Name != "lapsed" || v.Leases[2].Name != "steady" {
		t.Errorf("leases in the order %v", names(v.Leases))
	}

	b := lifeOf(t, v, h.b)
	if len(b.Deaths) != 1 || !b.Deaths[0].At.Equal(deadAt) || !same(b.Deaths[0].LastAlive, h.lastBeatB) || b.Deaths[0].How != "heartbeat_stale" ||
		b.Deaths[0].DetectionSeconds == nil || *b.Deaths[0].DetectionSeconds != 2 || b.Reaped == nil || b.Left != nil || b.Joined == nil ||
		b.Host != "node-b" || b.Service != "checkout" {
		t.Errorf("b's life: %+v; want dead by its stale heartbeat 2 s after its last, then reaped", b)
	}
	a := lifeOf(t, v, h.a)
	if len(a.Deaths) != 0 || a.Left == nil || a.Reaped != nil || a.Joined == nil {
		t.Errorf("a's life: %+v; want joined and left", a)
	}
	d := lifeOf(t, v, h.d)
	if len(d.LockAbsences) != 1 || d.LockAbsences[0].Back == nil || d.LockAbsences[0].Seconds == nil ||
		*d.LockAbsences[0].Seconds != d.LockAbsences[0].Back.Sub(d.LockAbsences[0].Vanished).Seconds() || d.Host != "node-d" {
		t.Errorf("d's life: %+v; want its lock vanished and back", d)
	}
	if v.Instances[0].InstanceID != h.a.String() || v.Instances[1].InstanceID != h.b.String() {
		t.Errorf("instances not newest first: %s, %s", v.Instances[0].InstanceID, v.Instances[1].InstanceID)
	}
}

func names(ls []status.LeaseHistoryView) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Name)
	}
	return out
}

// The HTML form draws the timelines server-side: a gap per time without a leader, its
// length in its title; a death mark; each instance that died or left, newest first; and
// nothing the Content-Security-Policy would refuse (no style attribute).
func TestHistoryTimelinesInHTML(t *testing.T) {
	db, pool, ctx := setup(t)
	h := historyFixture(t, ctx, db, pool)
	handler := newHandler(t, pool)
	p := readPage(t, handler, "/status.json")
	res, body := get(t, handler, "/status")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s\n%.1000s", res.Status, body)
	}
	row := regexp.MustCompile(`(?s)<tr data-lease="job"[^>]*>.*?</tr>`).FindString(body[strings.Index(body, `id="history-leases"`):])
	gaps := regexp.MustCompile(`<svg class="gap[^"]*" x="[0-9.]+%" width="[0-9.]+%" data-seconds="([0-9.]+)">.*?<title>([^<]*)</title>`).FindAllStringSubmatch(row, -1)
	if len(gaps) != 5 {
		t.Fatalf("%d gaps drawn on job's bar, want 5:\n%s\n%s", len(gaps), row, body[strings.Index(body, `id="history"`):])
	}
	stale := leaseHistory(t, p.History, "job").Gaps[3].Seconds
	if want := fmt.Sprintf("no leader for %s, after holder_dead", formatSeconds(stale)); !strings.Contains(gaps[3][2], want) ||
		gaps[3][1] != fmt.Sprintf("%.3f", stale) {
		t.Errorf("the holder_dead gap's title %q, want %q", gaps[3][2], want)
	}
	if !strings.Contains(row, `<svg class="death"`) || !strings.Contains(row, "its holder node-b dead by the verdict") {
		t.Errorf("no death mark on job's bar:\n%s", row)
	}
	if !strings.Contains(row, "<b>no leader</b> for") {
		t.Errorf("job's row does not say it has no leader now:\n%s", row)
	}
	lives := body[strings.Index(body, `id="history-instances"`):]
	ib, ia := strings.Index(lives, `data-life="`+h.b.String()), strings.Index(lives, `data-life="`+h.a.String())
	if ia < 0 || ib < 0 || ia > ib || strings.Contains(lives[:strings.Index(lives, "</table>")], h.d.String()) {
		t.Errorf("the instances that died or left: a at %d, b at %d (want a, the newest, first), d (neither) listed: %v", ia, ib,
			strings.Contains(lives, h.d.String()))
	}
	if !strings.Contains(lives, "2.0s after its last sign of life") || !strings.Contains(lives, "reaped ") {
		t.Errorf("b's death and reaping not shown:\n%.2000s", lives)
	}
	if strings.Contains(body, "style=") {
		t.Error("the page has a style attribute, which its Content-Security-Policy refuses")
	}
}

// formatSeconds is the page's.
func formatSeconds(s float64) string {
	switch {
	case s < 10:
		return fmt.Sprintf("%.1fs", s)
	case s < 60:
		return fmt.Sprintf("%ds", int(s))
	}
	return fmt.Sprintf("%dm%02ds", int(s)/60, int(s)%60)
}

// A schema from before migration 0020 has no history table: the page is served whole,
// with the section absent and a note that says why, and no error.
func TestHistoryAbsentBeforeMigration0020(t *testing.T) {
	db := pgtest.NewDB(t)
	pool := db.Pool(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := migrations.Set(migrations.All()[:19]).Apply(ctx, pool, defaults.Schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO liveness.instances (instance_id, service_name) VALUES (gen_random_uuid(), 'svc')`); err != nil {
		t.Fatal(err)
	}
	h := newHandler(t, pool)
	p := readPage(t, h, "/status.json")
	if p.History == nil || p.History.Available || !strings.Contains(p.History.Note, "predates migration 0020") ||
		len(p.History.Events) != 0 || len(p.Errors) != 0 || p.Instances.Total != 1 {
		t.Errorf("history %+v, errors %v, %d instances; want the page with a note for the history", p.History, p.Errors, p.Instances.Total)
	}
	res, body := get(t, h, "/status")
	if res.StatusCode != http.StatusOK || !strings.Contains(body, `id="history-note">no history: the schema predates migration 0020`) {
		t.Errorf("%s; the HTML does not say why there is no history", res.Status)
	}
}

// Rows no trigger writes (NULLs where a kind needs a value, times out of order, rows
// dated ahead of the clock) are left out of the timelines and counted by reason, and the
// rest is still derived; a million rows in the window are read 2,000 at most, the page
// keeps its weight and says what it left out.
func TestHistoryGarbageIsCountedAndBounded(t *testing.T) {
	_, pool, ctx := setup(t)
	f := fleetActions{t, ctx, pool}
	a := f.instance("node-a", time.Minute)
	first := f.take("job", "a", time.Minute, a, "node-a")
	f.letGo("job", "a", first.epoch, "")
	for _, garbage := range []string{
		`INSERT INTO liveness.history (at, kind, epoch) VALUES (now(), 'acquired', 7)`,                                                               // no lease name
		`INSERT INTO liveness.history (at, kind, lease_name) VALUES (now(), 'ended', 'job')`,                                                         // no epoch
		`INSERT INTO liveness.history (at, kind, how) VALUES (now(), 'dead', 'lock_lost')`,                                                           // no instance
		`INSERT INTO liveness.history (at, kind, instance_id) VALUES (now(), 'left', NULL)`,                                                          // no instance
		`INSERT INTO liveness.history (at, kind, lease_name, epoch, since) VALUES (now() - interval '1 minute', 'acquired', 'job', 99, now())`,       // since after it
		`INSERT INTO liveness.history (at, kind, lease_name, epoch) VALUES (now() + interval '1 hour', 'acquired', 'job', 98)`,                       // ahead
		`INSERT INTO liveness.history (at, kind, lease_name, epoch) VALUES ('infinity', 'acquired', 'job', 97)`,                                      // not a moment: not read
		`INSERT INTO liveness.history (at, kind, lease_name, epoch, how) VALUES (now(), 'acquired', 'job', ` + fmt.Sprint(first.epoch) + `, 'free')`, // again
	} {
		f.exec(garbage)
	}
	h := newHandler(t, pool)
	p := readPage(t, h, "/status.json")
	skipped := map[string]int{}
	for _, s := range p.History.Skipped {
		skipped[s.Reason] = s.Count
	}
	want := map[string]int{"a lease event without a lease name": 1, "a lease event without an epoch": 1,
		"an instance event without an instance id": 2, "since later than the event": 1,
		"dated after the read (ahead of the database's clock)": 1, "a second acquisition or end of one epoch": 1}
	if fmt.Sprint(skipped) != fmt.Sprint(want) {
		t.Errorf("skipped %v, want %v", skipped, want)
	}
	job := leaseHistory(t, p.History, "job")
	if len(job.Leaderships) != 1 || job.Leaderships[0].Epoch != first.epoch || job.Leaderships[0].Ended != "released" || len(job.Gaps) != 1 {
		t.Errorf("job beside the garbage: %+v", job)
	}

	// A million rows in the window, the newest dated ahead of the clock; the rest 10 µs
	// apart, so that the newest of them were written after everything above. Read newest
	// first by time, the 2,000 rows are the 1,000 dated ahead, the one above dated ahead,
	// and 999 of the flood's. The flood's newest 999 span 10 ms up to its statement's
	// start, so the rows above, dated at theirs, must be older than that: 50 ms passes
	// first (a quick machine sent the flood within 10 ms of them, and 6 of them took the
	// place of 6 flood leases).
	f.exec(`SELECT pg_sleep(0.05)`)
	f.exec(`INSERT INTO liveness.history (at, kind, lease_name, epoch, instance_id)
	        SELECT now() - make_interval(secs => (999000 - g) * 0.00001), 'acquired', 'flood-' || (g % 5000), g, NULL
	          FROM generate_series(1, 999000) g`)
	f.exec(`INSERT INTO liveness.history (at, kind, instance_id) SELECT now() + interval '1 hour', 'joined', gen_random_uuid()
	          FROM generate_series(1, 1000)`)
	for _, target := range []string{"/status.json", "/status"} {
		h := newHandler(t, pool)
		t0 := time.Now()
		res, body := get(t, h, target)
		took := time.Since(t0)
		t.Logf("%s: %d bytes in %s", target, len(body), took.Round(time.Millisecond))
		if res.StatusCode != http.StatusOK || took > 10*time.Second {
			t.Fatalf("%s: %s in %s", target, res.Status, took)
		}
		if len(body) > maxPageBytes {
			t.Errorf("%s weighs %d bytes", target, len(body))
		}
		if target == "/status" {
			if !strings.Contains(body, "dated after the read (ahead of the database&#39;s clock): 1001") ||
				!strings.Contains(body, "only the newest 2000 were read") || !strings.Contains(body, "Leases 1–50 of 999 taken or let go") ||
				!strings.Contains(body, `<a href="?history_page=2">next →</a>`) || strings.Count(body, `<svg class="tl"`) != status.HistoryLeasesPerPage {
				t.Errorf("the HTML does not say what it left out:\n%.3000s", body[strings.Index(body, `id="history"`):])
			}
			continue
		}
		var p status.Page
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatal(err)
		}
		v := p.History
		if v.EventsTotal != status.MaxHistoryEvents || len(v.Events) != status.HistoryEventsPerPage || !v.Truncated ||
			len(v.Skipped) != 1 || v.Skipped[0].Count != 1001 || v.LeasesTotal != 999 || len(v.Leases) != status.HistoryLeasesPerPage ||
			len(p.Errors) != 0 {
			t.Errorf("%d events of %d, truncated %v, skipped %v, %d leases of %d, errors %v; "+
				"want 2000 read, a page of 500, 1001 ahead skipped (the flood's 1000 and the row above), a page of 50 of the 999 flood leases read",
				len(v.Events), v.EventsTotal, v.Truncated, v.Skipped, len(v.Leases), v.LeasesTotal, p.Errors)
		}
	}
	// The last page of events, and of leases; beyond, none.
	for page, want := range map[int][2]int{4: {500, 50}, 20: {0, 49}, 21: {0, 0}} {
		p := readPage(t, newHandler(t, pool), fmt.Sprintf("/status.json?history_page=%d", page))
		if len(p.History.Events) != want[0] || len(p.History.Leases) != want[1] || p.History.Page != page {
			t.Errorf("history page %d: %d events, %d leases; want %v", page, len(p.History.Events), len(p.History.Leases), want)
		}
	}
}

// argsDB is the real pool, keeping the arguments of the history's read.
type argsDB struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	args [][]any
}

func (a *argsDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, ".history h") {
		a.mu.Lock()
		a.args = append(a.args, args)
		a.mu.Unlock()
	}
	return a.pool.Query(ctx, sql, args...)
}

// The window is a parameter: ?history=1h reads an hour (the statement is asked for
// 3,600 seconds, and at most MaxHistoryEvents rows), and the page's links keep it.
func TestHistoryWindow(t *testing.T) {
	db, pool, ctx := setup(t)
	historyFixture(t, ctx, db, pool)
	recorded := &argsDB{pool: pool}
	h, err := status.New(status.Config{DB: recorded})
	if err != nil {
		t.Fatal(err)
	}
	day := readPage(t, h, "/status.json")
	for _, c := range []struct {
		target string
		window time.Duration
	}{{"/status.json?history=1h", time.Hour}, {"/status.json?history=90s", 90 * time.Second}} {
		target, window := c.target, c.window
		p := readPage(t, h, target)
		if p.History.WindowSeconds != window.Seconds() || p.History.To.Sub(p.History.From) != window || len(p.History.Events) != len(day.History.Events) {
			t.Errorf("%s: window %v s, %d events; want %v s and the day's %d (all of them are recent)", target, p.History.WindowSeconds,
				len(p.History.Events), window.Seconds(), len(day.History.Events))
		}
	}
	if want := fmt.Sprint([][]any{{86400.0, 2000}, {3600.0, 2000}, {90.0, 2000}}); fmt.Sprint(recorded.args) != want {
		t.Errorf("the history was read with %v, want %s", recorded.args, want)
	}
	_, body := get(t, h, "/status?history=6h&page=1")
	for _, want := range []string{`<b>6h</b>`, `href="?history=1h"`, `href="?"`, `href="status.json?history=6h"`} {
		if !strings.Contains(body, want) {
			t.Errorf("?history=6h: the page lacks %s", want)
		}
	}
}

// maxJSONBytesWithHistory bounds the JSON form whatever the history's shape: a page of
// events, and the leaderships and gaps of a page of leases, which the rows read bound
// (MaxHistoryEvents: at most about a thousand leaderships, all on one page when one lease
// changed hands a thousand times). At the budget's scale it weighs less than
// maxPageBytes (TestPageWeightAtBudgetScale).
const maxJSONBytesWithHistory = 1 << 20

// Hundreds of leases, some of which changed hands many times: the page shows a page of
// bars (those with no leader now and the longest gaps first), draws at most a few
// leaderships of each when they are many (the earlier ones in a grey mark that says how
// many), links to the next page, and keeps its weight: the HTML form under maxPageBytes,
// the JSON form, which has every leadership, under maxJSONBytesWithHistory.
func TestHistoryOfHundredsOfLeases(t *testing.T) {
	_, pool, ctx := setup(t)
	f := fleetActions{t, ctx, pool}
	a := f.instance("node-a", time.Minute)
	// 40 leases taken and let go 17 times each, then 300 taken and let go once. (A DO
	// block takes no parameters: the instance's id is a uuid this test made.)
	f.exec(fmt.Sprintf(`DO $$
	        DECLARE
	            v_epoch bigint;
	        BEGIN
	            FOR i IN 1..340 LOOP
	                FOR j IN 1..CASE WHEN i <= 40 THEN 17 ELSE 1 END LOOP
	                    SELECT t.epoch INTO STRICT v_epoch FROM liveness.lease_take('lease-' || i, 'a', 60, '%s', 'node-a') t;
	                    PERFORM liveness.lease_let_go('lease-' || i, 'a', v_epoch);
	                END LOOP;
	            END LOOP;
	        END
	        $$`, a))
	h := newHandler(t, pool)
	p := readPage(t, h, "/status.json")
	if v := p.History; v.LeasesTotal != 340 || len(v.Leases) != status.HistoryLeasesPerPage || v.Truncated ||
		len(v.Leases[0].Leaderships) != 17 || len(v.Leases[0].Gaps) != 17 {
		t.Fatalf("%d leases of %d, truncated %v, the first with %d leaderships and %d gaps; want 50 of 340, the first with 17 and 17",
			len(v.Leases), v.LeasesTotal, v.Truncated, len(v.Leases[0].Leaderships), len(v.Leases[0].Gaps))
	}
	for _, target := range []string{"/status", "/status.json", "/status?history_page=7"} {
		res, body := get(t, h, target)
		t.Logf("%s: %d bytes", target, len(body))
		limit := maxPageBytes
		if strings.HasSuffix(target, ".json") {
			limit = maxJSONBytesWithHistory
		}
		if res.StatusCode != http.StatusOK || len(body) > limit {
			t.Errorf("%s: %s, %d bytes, more than %d", target, res.Status, len(body), limit)
		}
		if target != "/status" {
			continue
		}
		if n := strings.Count(body, `<svg class="tl"`); n != status.HistoryLeasesPerPage {
			t.Errorf("%d bars, want a page of %d", n, status.HistoryLeasesPerPage)
		}
		if n := strings.Count(body, `<svg class="elided"`); n != 40 {
			t.Errorf("%d bars say they left leaderships out, want the 40 leases taken 17 times", n)
		}
		if !strings.Contains(body, "<title>13 leaderships and 13 gaps before, not drawn: see the JSON form</title>") ||
			!strings.Contains(body, `<a href="?history_page=2">next →</a>`) {
			t.Errorf("no mark of what was left out, or no next page:\n%.3000s", body[strings.Index(body, `id="history"`):])
		}
	}
}
