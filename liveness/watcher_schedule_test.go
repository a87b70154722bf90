package liveness

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"pgregory.net/rapid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// TestWatcherStampsAndNotifiesEveryVanishedLock is the watchers' guarantee, checked over
// generated schedules on a real server: after every tick, the standing absence stamps
// are exactly the alive locks that the rows expect and that no session holds, and each
// such absence is either due at this watcher or notified, once, with the instance dead
// by the verdict and its death in the history. The schedules mix everything that moves
// what the watchers compare: instances' beats (recording their lock held or not, naming
// the current lock session, an old one or none), claims from new sessions, crashes (the
// session ended by the server), graceful leaves, readers' on-demand stamps, two watchers
// ticking in any order, and a watcher's leadership starting over. A lock claimed and lost
// between two ticks was stamped at no tick; an instance notified dead had its later
// absences skipped.
func TestWatcherStampsAndNotifiesEveryVanishedLock(t *testing.T) {
	t.Parallel()
	s := newWatchSchedule(t)
	rapid.Check(t, func(rt *rapid.T) {
		grace, steps := drawSchedule(rt)
		s.run(rt, grace, steps)
	})
}

// The schedules the generated ones found against earlier schemas, kept so that they run
// every time.
func TestWatcherSchedulesThatFailedOnce(t *testing.T) {
	t.Parallel()
	s := newWatchSchedule(t)
	for _, c := range []struct {
		name  string
		grace []float64
		steps []scheduleStep
	}{{
		// The digest covered the locks held and the stamps only: a lock claimed and lost
		// between two ticks, by an instance whose row was there before, left it as it was.
		name: "a lock claimed and lost between two ticks", grace: []float64{0, 0, 0},
		steps: []scheduleStep{{kind: "beat", pid: "none"}, {kind: "tick"}, {kind: "relive"}, {kind: "crash"},
			{kind: "tick"}, {kind: "tick"}},
	}, {
		// Which absence had been notified was each watcher's, per instance: a new claim's
		// absence, lost before any tick saw its lock, counted as notified already.
		name: "a death, a new claim, another death", grace: []float64{0, 0, 0},
		steps: []scheduleStep{{kind: "relive"}, {kind: "tick"}, {kind: "crash"}, {kind: "tick"}, {kind: "tick"},
			{kind: "relive"}, {kind: "crash"}, {kind: "tick"}, {kind: "tick"}},
	}, {
		// A full tick returned the digest of the stamps as it found them, before its own
		// stamp: the other watcher cleared that stamp (the instance left), the instance
		// came back with its lock gone, and the first watcher's next digest matched.
		name: "a stamp cleared by the other watcher before this one's next tick", grace: []float64{60, 60, 60},
		steps: []scheduleStep{{kind: "beat", holds: true, pid: "none"}, {kind: "tick", watcher: 1}, {kind: "leave"},
			{kind: "tick"}, {kind: "beat", holds: true, pid: "none"}, {kind: "tick", watcher: 1}},
	}} {
		t.Run(c.name, func(t *testing.T) { s.run(t, c.grace, c.steps) })
	}
}

func newWatchSchedule(t *testing.T) *watchSchedule {
	db, pool := testdb.MigratedPool(t, 4)
	return &watchSchedule{ctx: testutil.Context(t, 5*time.Minute), dsn: db.DSN, pool: pool,
		beatSQL: store.Heartbeat.In(defaults.Schema).SQL, claimSQL: store.AliveLockClaim.In(defaults.Schema).SQL}
}

// watchSchedule runs one schedule at a time against one database.
type watchSchedule struct {
	ctx      context.Context
	dsn      string
	pool     *pgxpool.Pool
	beatSQL  string
	claimSQL string

	ids      []uuid.UUID
	sessions []*pgx.Conn          // each instance's lock session; nil: none
	lastPid  []uint32             // the last lock session's pid, for a beat that lands late
	notified map[string]time.Time // when each absence (instance@missing_since) was notified
	log      []string
}

// failer is what a schedule reports to: a generated one's *rapid.T, a fixed one's *testing.T.
type failer interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

// scheduleStep is one thing that happens. A step that cannot happen (a crash of an
// instance with no session) is skipped.
type scheduleStep struct {
	kind     string // beat, claim, relive, crash, leave, read, tick, lead
	instance int
	holds    bool   // beat: whether it records the lock held
	pid      string // beat: the session it names: current, last or none
	watcher  int    // tick, lead
}

const scheduleInstances = 3

// drawSchedule generates a schedule and the lock grace of each instance.
func drawSchedule(rt *rapid.T) (grace []float64, steps []scheduleStep) {
	for i := range scheduleInstances {
		grace = append(grace, rapid.SampledFrom([]float64{0, 60}).Draw(rt, fmt.Sprintf("grace%d", i)))
	}
	// Fewer instances make longer stories of one: a death, a new claim, another death.
	instances := rapid.IntRange(1, scheduleInstances).Draw(rt, "instances")
	for range rapid.IntRange(1, 40).Draw(rt, "steps") {
		st := scheduleStep{
			kind: rapid.SampledFrom([]string{"beat", "beat", "claim", "relive", "relive", "crash", "crash", "leave",
				"read", "tick", "tick", "tick", "tick", "lead"}).Draw(rt, "action"),
			instance: rapid.IntRange(0, instances-1).Draw(rt, "instance"),
		}
		switch st.kind {
		case "beat":
			st.holds = rapid.Bool().Draw(rt, "holds")
			st.pid = rapid.SampledFrom([]string{"current", "last", "none"}).Draw(rt, "pid")
		case "tick", "lead":
			st.watcher = rapid.IntRange(0, 1).Draw(rt, "watcher")
		}
		steps = append(steps, st)
	}
	return grace, steps
}

// run plays a schedule, checking the guarantee after every tick.
func (s *watchSchedule) run(f failer, grace []float64, steps []scheduleStep) {
	s.reset(f)
	defer s.closeSessions()
	watchers := []*watchState{{due: map[uuid.UUID]time.Time{}}, {due: map[uuid.UUID]time.Time{}}}
	w := newWatcher(watcherConfig{Pool: s.pool, Schema: defaults.Schema})
	for _, st := range steps {
		i := st.instance
		switch st.kind {
		case "relive": // what an agent does after its lock's session ended: claim from a new one, beat holding it
			if s.sessions[i] != nil {
				continue
			}
			s.claim(f, i)
			pid := s.sessions[i].PgConn().PID()
			s.step(f, "beat %d holds=true pid=%d", i, pid)
			s.beat(f, i, true, pid, grace[i])
		case "beat":
			pid := uint32(0)
			switch st.pid {
			case "current":
				if s.sessions[i] != nil {
					pid = s.sessions[i].PgConn().PID()
				}
			case "last":
				pid = s.lastPid[i]
			}
			s.step(f, "beat %d holds=%v pid=%d", i, st.holds, pid)
			s.beat(f, i, st.holds, pid, grace[i])
		case "claim":
			s.claim(f, i)
		case "crash":
			if s.sessions[i] == nil {
				continue
			}
			s.step(f, "crash %d (session %d)", i, s.sessions[i].PgConn().PID())
			s.terminate(f, s.sessions[i])
			s.sessions[i] = nil
		case "leave":
			s.step(f, "leave %d", i)
			if _, err := s.pool.Exec(s.ctx, `DELETE FROM liveness.instances WHERE instance_id = $1`, s.ids[i]); err != nil {
				f.Fatal(err)
			}
		case "read":
			s.step(f, "a reader's verdict")
			if _, err := s.pool.Exec(s.ctx, `SELECT count(*) FROM liveness.instance_states()`); err != nil {
				f.Fatal(err)
			}
		case "tick":
			s.step(f, "watcher %d ticks", st.watcher)
			if err := w.tick(s.ctx, watchers[st.watcher]); err != nil {
				f.Fatal(err)
			}
			s.check(f, watchers[st.watcher], st.watcher)
		case "lead":
			s.step(f, "watcher %d's leadership starts over", st.watcher)
			watchers[st.watcher] = &watchState{due: map[uuid.UUID]time.Time{}}
		default:
			f.Fatalf("unknown step %q", st.kind)
		}
	}
}

// beat sends instance i's heartbeat, recording its lock held or not and naming session pid.
func (s *watchSchedule) beat(f failer, i int, holds bool, pid uint32, grace float64) {
	if _, err := s.pool.Exec(s.ctx, s.beatSQL, s.ids[i], "svc", "host", 1, "advisory-lock-when-available", "{}",
		holds, nil, nil, nil, nil, grace, int64(pid), nil); err != nil {
		f.Fatal(err)
	}
}

// claim claims instance i's lock from its session, opened first when it has none.
func (s *watchSchedule) claim(f failer, i int) {
	if s.sessions[i] == nil {
		conn, err := pgx.Connect(s.ctx, s.dsn)
		if err != nil {
			f.Fatal(err)
		}
		s.sessions[i], s.lastPid[i] = conn, conn.PgConn().PID()
	}
	var pid int64
	var claimed *bool
	var at time.Time
	if err := s.sessions[i].QueryRow(s.ctx, s.claimSQL, s.ids[i], int64(s.sessions[i].PgConn().PID())).
		Scan(&pid, &claimed, &at); err != nil {
		f.Fatal(err)
	}
	s.step(f, "claim %d from session %d: %v", i, pid, claimed != nil && *claimed)
}

func (s *watchSchedule) step(f failer, format string, args ...any) {
	s.log = append(s.log, fmt.Sprintf(format, args...))
	f.Logf(format, args...)
}

// check holds the watcher that just ticked to the guarantee.
func (s *watchSchedule) check(rt failer, st *watchState, x int) {
	// The absences by the schema's own rule (stamp_alive_lock_absences' read), and the
	// standing stamps as every verdict reads them.
	rows, err := s.pool.Query(s.ctx, `
	    SELECT i.instance_id,
	           NOT EXISTS (SELECT 1 FROM liveness.bigint_advisory_locks l
	                        WHERE l.granted AND l.classid = i.lock_classid AND l.objid = i.lock_objid
	                          AND (i.lock_pid IS NULL OR l.pid = i.lock_pid)) AS missing,
	           a.missing_since, a.notified_at,
	           coalesce(liveness.instance_watched_alive(i.instance_id), false),
	           EXISTS (SELECT 1 FROM liveness.history h
	                    WHERE h.kind = 'dead' AND h.instance_id = i.instance_id AND h.since = a.missing_since)
	      FROM liveness.instances i
	      LEFT JOIN liveness.alive_lock_absences a
	             ON a.instance_id = i.instance_id AND a.server_started_at = pg_postmaster_start_time()
	            AND a.lock_pid IS NOT DISTINCT FROM i.lock_pid
	     WHERE i.instance_id = ANY($1) AND i.holds_alive_lock`, s.ids)
	if err != nil {
		rt.Fatal(err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var id uuid.UUID
		var missing, watchedAlive, deadNoted bool
		var since, notifiedAt *time.Time
		if err := rows.Scan(&id, &missing, &since, &notifiedAt, &watchedAlive, &deadNoted); err != nil {
			rt.Fatal(err)
		}
		n := slices.Index(s.ids, id)
		_, due := st.due[id]
		notified := notifiedAt != nil
		if notified {
			key := fmt.Sprintf("%s@%s", id, since.Format(time.RFC3339Nano))
			if first, ok := s.notified[key]; ok && !first.Equal(*notifiedAt) {
				problems = append(problems, fmt.Sprintf("instance %d: its absence notified twice (%s, then %s)", n,
					first.Format(time.RFC3339Nano), notifiedAt.Format(time.RFC3339Nano)))
			}
			s.notified[key] = *notifiedAt
		}
		switch {
		case missing && since == nil:
			problems = append(problems, fmt.Sprintf("instance %d: its lock is gone, and no stamp says so", n))
		case !missing && since != nil:
			problems = append(problems, fmt.Sprintf("instance %d: its lock is held, and a stamp says it vanished", n))
		case missing && !due && !notified:
			problems = append(problems, fmt.Sprintf("instance %d: its absence is neither due at watcher %d nor notified", n, x))
		case notified && (watchedAlive || !deadNoted):
			problems = append(problems, fmt.Sprintf("instance %d: notified dead, but alive by a fresh watch's verdict (%v) or its death not in the history (%v)",
				n, watchedAlive, deadNoted))
		}
	}
	if err := rows.Err(); err != nil {
		rt.Fatal(err)
	}
	if len(problems) > 0 {
		rt.Fatalf("after watcher %d's tick:\n  %s\nthe schedule:\n  %s", x, strings.Join(problems, "\n  "), strings.Join(s.log, "\n  "))
	}
}

// reset starts a schedule with new instances and nothing of the previous one's.
func (s *watchSchedule) reset(rt failer) {
	s.ids = make([]uuid.UUID, scheduleInstances)
	for i := range s.ids {
		s.ids[i] = uuid.New()
	}
	s.sessions = make([]*pgx.Conn, scheduleInstances)
	s.lastPid = make([]uint32, scheduleInstances)
	s.log = nil
	s.notified = map[string]time.Time{}
	for _, sql := range []string{`DELETE FROM liveness.instances`, `DELETE FROM liveness.alive_lock_absences`} {
		if _, err := s.pool.Exec(s.ctx, sql); err != nil {
			rt.Fatal(err)
		}
	}
}

// terminate ends a session from the server's side and waits until its backend is gone,
// its locks with it: a crash, as the server sees one.
func (s *watchSchedule) terminate(rt failer, conn *pgx.Conn) {
	var done bool
	if err := s.pool.QueryRow(s.ctx, `SELECT pg_terminate_backend($1, 10000)`, int64(conn.PgConn().PID())).Scan(&done); err != nil || !done {
		rt.Fatalf("terminating session %d: %v (terminated: %v)", conn.PgConn().PID(), err, done)
	}
	_ = conn.Close(s.ctx)
}

func (s *watchSchedule) closeSessions() {
	for i, c := range s.sessions {
		if c != nil {
			_ = c.Close(s.ctx)
			s.sessions[i] = nil
		}
	}
}
