package lifegate_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/lifegate"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// schedulesPerRun is how many schedules TestGateNeverOutlivesTheVerdict generates unless
// -rapid.checks (or RAPID_CHECKS) says otherwise.
const schedulesPerRun = 10000

func TestMain(m *testing.M) {
	flag.Parse()
	explicit := os.Getenv("RAPID_CHECKS") != ""
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "rapid.checks" })
	if !explicit {
		if err := flag.Set("rapid.checks", fmt.Sprint(schedulesPerRun)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	pgtest.Main(m)
}

// TestGateNeverOutlivesTheVerdict is the leader's guarantee, checked: over generated
// schedules of everything that can happen to one instance (its lock's session ended by
// the server, noticed late or at once; the client's connection failing while the
// server's backend lives on; server restarts; proofs, beats and claims sent at any time,
// reaching the server and answered after any delays, beats committing out of order or
// refused; the fleet's watcher stamping absences at any moment; the process paused, its
// evaluations late or missing), at no instant does a leadership's Trust say alive, nor
// does the fence deadline taken from it lie past, a moment at which the schema's rule may
// call the instance dead. The rule is the migrations' own instance_state_rule, run on a
// real server for every instant that can decide it; the stamps and the two ways of
// reading the lock (a reader's pg_locks, a fresh watch's trust in the row) are modelled
// as the schema's functions do them (stamp_alive_lock_absences, instance_states,
// instance_watched_alive). A failure shrinks to a minimal schedule, printed as a
// timeline.
func TestGateNeverOutlivesTheVerdict(t *testing.T) {
	db := testdb.Migrated(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rule := fmt.Sprintf(ruleSQL, migrations.DefaultSchema)
	var leaderships, checked int
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim(rt)
		s.run()
		leaderships += s.led
		instants := s.instants()
		if len(instants) == 0 {
			return
		}
		checked += len(instants)
		if bad := s.verdicts(ctx, conn, rule, instants); bad != nil {
			rt.Fatalf("the rule may call the instance dead at %s (%s), inside %s\n%s", s.fmt(bad.at), bad.path, bad.why,
				s.timeline())
		}
	})
	t.Logf("%d leaderships, %d instants judged by the rule", leaderships, checked)
	if leaderships == 0 || checked == 0 {
		t.Fatal("the schedules started no leadership, or judged none: the generator is broken")
	}
}

// ruleSQL judges each instant by the schema's rule; the first instant whose state is not
// one of instance_state_verdicts' alive states, or none.
const ruleSQL = `
SELECT c.i, c.path FROM unnest($1::bool[], $2::bool[], $3::timestamptz[], $4::timestamptz[], $5::timestamptz[], $6::text[])
       WITH ORDINALITY AS c(locked, holds, hb, now_, missing, path, i)
 WHERE %s.instance_state_rule(c.locked, c.holds, c.hb, c.now_, $7::interval, $8::interval, c.missing, $9::interval)
       NOT IN ('alive', 'lock_only', 'lock_lost', 'heartbeat_only')
 ORDER BY c.i LIMIT 1`

// The model. Every time is the true time since the schedule began (the process's clock);
// the server's clock reads it plus offset.

type session struct {
	pid        int
	alive      bool          // at the server
	held       bool          // holds the key at the server
	claim      uint64        // the client's claim number once it knows the lock held
	noticeAt   time.Duration // when the client learns it ended; -1 until scheduled
	lastAnswer time.Duration // the latest answer sent on it: the close comes after
	closed     bool          // the client knows it is gone
}

type row struct {
	hb      time.Duration
	holds   bool
	lockPid int
}

type stamp struct {
	ok      bool
	since   time.Duration
	lockPid int
	epoch   int
}

// snapshot is the server's state from at on: what the rule reads.
type snapshot struct {
	at     time.Duration
	up     bool
	epoch  int
	row    row
	locked bool // a live session of the row's lock_pid holds the key
	stamp  stamp
}

type event struct {
	at, orig time.Duration
	seq      int
	client   bool
	name     string
	do       func()
}

// span is one stretch in which a leadership's Trust said alive, or a fence deadline
// let writes in; why says which.
type span struct {
	from, to time.Duration
	why      string
}

type sim struct {
	rt     *rapid.T
	timing lifegate.Timing
	offset time.Duration
	now    time.Duration
	seq    int
	queue  []*event
	log    []string

	// the server
	up       bool
	epoch    int
	sessions []*session
	row      row
	stamp    stamp
	history  []snapshot
	nextPid  int

	// the client
	pausedUntil time.Duration
	cur         *session // the lock's session, as the client knows it; nil between sessions
	connecting  *session // a session being connected and claimed
	claims      uint64
	ev          lifegate.Evidence
	anchor      lifegate.Anchor
	lead        *leadership
	leads       int // leaderships asked for
	led         int // leaderships that started

	spans []span
}

type leadership struct {
	from      time.Duration // asked (the lease was taken)
	markClaim uint64
	markHeld  bool
	started   bool
	trust     lifegate.Trust
	lastObs   time.Duration
}

func newSim(rt *rapid.T) *sim {
	s := &sim{rt: rt, up: true, epoch: 1, nextPid: 100}
	grace := rapid.SampledFrom([]time.Duration{time.Second, 4 * time.Second, 0}).Draw(rt, "grace")
	if grace == 0 {
		grace = time.Duration(rapid.IntRange(100, 10000).Draw(rt, "grace_ms")) * time.Millisecond
	}
	if rapid.Bool().Draw(rt, "default_heartbeat") {
		s.timing = lifegate.Timing{Grace: grace, Stale: 90 * time.Second, Dead: 5 * time.Minute, Margin: 15 * time.Second}
	} else {
		// Short heartbeat limits, so that schedules reach them; valid as the agent's
		// config checks: fast <= slow <= stale, fast < stale, dead > slow + stale.
		stale := grace * time.Duration(rapid.IntRange(2, 12).Draw(rt, "stale_graces"))
		fast := time.Duration(rapid.Int64Range(int64(grace/4), int64(stale/2)).Draw(rt, "fast"))
		slow := time.Duration(rapid.Int64Range(int64(fast), int64(stale)).Draw(rt, "slow"))
		dead := slow + stale + time.Duration(rapid.Int64Range(1, int64(stale)).Draw(rt, "dead_extra"))
		s.timing = lifegate.Timing{Grace: grace, Stale: stale, Dead: dead, Margin: fast / 2}
	}
	s.offset = time.Duration(rapid.Int64Range(-int64(time.Hour), int64(time.Hour)).Draw(rt, "server_offset"))
	s.timing.Stale = s.timing.Stale.Truncate(time.Microsecond)
	s.timing.Dead = s.timing.Dead.Truncate(time.Microsecond)
	s.timing.Margin = s.timing.Margin.Truncate(time.Microsecond)
	s.ev.LockMode = rapid.IntRange(0, 9).Draw(rt, "lock_mode") > 0
	s.snap()
	return s
}

// delay draws a duration, mostly short against the grace, sometimes long.
func (s *sim) delay(label string) time.Duration {
	g := s.timing.Grace
	var d time.Duration
	switch rapid.IntRange(0, 9).Draw(s.rt, label+"_kind") {
	case 0:
		d = 0
	case 1, 2, 3, 4:
		d = time.Duration(rapid.Int64Range(0, int64(g/10)).Draw(s.rt, label))
	case 5, 6, 7:
		d = time.Duration(rapid.Int64Range(0, int64(g)).Draw(s.rt, label))
	case 8:
		d = time.Duration(rapid.Int64Range(0, int64(3*g)).Draw(s.rt, label))
	default:
		d = time.Duration(rapid.Int64Range(0, int64(s.timing.Stale+g)).Draw(s.rt, label))
	}
	return d.Truncate(time.Microsecond)
}

func (s *sim) logf(format string, args ...any) {
	s.log = append(s.log, fmt.Sprintf("%12s  ", s.fmt(s.now))+fmt.Sprintf(format, args...))
}

func (s *sim) fmt(d time.Duration) string { return fmt.Sprintf("%.6fs", d.Seconds()) }

func (s *sim) timeline() string {
	return fmt.Sprintf("timing: %+v, server clock offset %s\n%s", s.timing, s.offset, strings.Join(s.log, "\n"))
}

func (s *sim) at(d time.Duration, client bool, name string, do func()) {
	s.seq++
	s.queue = append(s.queue, &event{at: d, orig: d, seq: s.seq, client: client, name: name, do: do})
}

// step runs the events due by t, in order; a client event due while the process is
// paused runs when it resumes.
func (s *sim) advance(to time.Duration) {
	for {
		i := -1
		for j, e := range s.queue {
			if e.at > to {
				continue
			}
			if i < 0 || e.at < s.queue[i].at || (e.at == s.queue[i].at && (e.orig < s.queue[i].orig ||
				(e.orig == s.queue[i].orig && e.seq < s.queue[i].seq))) {
				i = j
			}
		}
		if i < 0 {
			break
		}
		e := s.queue[i]
		s.queue = slices.Delete(s.queue, i, i+1)
		if e.client && e.at < s.pausedUntil {
			e.at = s.pausedUntil
			s.queue = append(s.queue, e)
			continue
		}
		s.now = e.at
		e.do()
	}
	s.now = to
}

// actions are the steps a schedule is made of, each as often as it appears.
var actions = []string{
	"verify", "verify", "verify", "beat", "beat", "terminate", "terminate", "restart", "reconnect", "reconnect",
	"watch", "pause", "lead", "lead", "drop", "evaluate", "evaluate",
}

func (s *sim) run() {
	if s.ev.LockMode && rapid.IntRange(0, 4).Draw(s.rt, "established") > 0 {
		s.establish()
	}
	steps := rapid.IntRange(1, 40).Draw(s.rt, "steps")
	for range steps {
		s.advance(s.now + s.delay("wait"))
		s.act(rapid.SampledFrom(actions).Draw(s.rt, "action"))
	}
	// Let everything in flight land, then look past the last deadline.
	for len(s.queue) > 0 {
		s.advance(s.now + s.timing.Grace)
	}
	if l := s.lead; l != nil && l.started {
		if until, ok := l.trust.Until(); ok {
			s.trusted(l.lastObs, until.Sub(t0), "the last leadership's trust, not evaluated since")
		}
	}
}

// trusted records a stretch in which a leadership's Trust said alive. The job is told to
// stop when it ends, and has the rest of the lock grace's last quarter (or of the
// heartbeat's margin, if shorter) before anyone may take over: the rule must hold that
// much longer.
func (s *sim) trusted(from, to time.Duration, why string) {
	s.spans = append(s.spans, span{from, to + min(s.timing.Grace/4, s.timing.Margin), why + ", and the job's time to stop"})
}

// establish starts the schedule with the instance as a healthy one is: its lock held by
// a session (claim 1, proved at 0) and a beat that recorded it, acknowledged.
func (s *sim) establish() {
	s.nextPid++
	x := &session{pid: s.nextPid, alive: true, held: true, noticeAt: -1}
	s.sessions = append(s.sessions, x)
	s.claims++
	x.claim = s.claims
	s.cur = x
	s.row = row{hb: 0, holds: true, lockPid: x.pid}
	s.ev.Held, s.ev.Proof, s.ev.BeatSent, s.ev.BeatHolds = true, at(0), at(0), true
	s.anchor = lifegate.Anchor{Sent: at(0), Server: at(s.offset)}
	s.logf("established: session %d holds the lock (claim 1, proved), a beat recorded it", x.pid)
	s.snap()
}

func (s *sim) act(a string) {
	if s.now < s.pausedUntil {
		switch a {
		case "verify", "beat", "reconnect", "lead", "drop", "evaluate":
			return // the process runs nothing while paused
		}
	}
	switch a {
	case "verify":
		s.verify()
	case "beat":
		s.beat()
	case "terminate":
		s.terminate()
	case "restart":
		s.restart()
	case "reconnect":
		s.reconnect()
	case "watch":
		s.tick()
	case "pause":
		s.pause()
	case "lead":
		s.startLeading()
	case "drop":
		s.clientDrop()
	case "evaluate":
		s.logf("client: evaluates")
		s.observe()
	}
}

// snap records the server's state from now on.
func (s *sim) snap() {
	locked := false
	for _, x := range s.sessions {
		if x.alive && x.held && x.pid == s.row.lockPid {
			locked = true
		}
	}
	s.history = append(s.history, snapshot{at: s.now, up: s.up, epoch: s.epoch, row: s.row, locked: locked, stamp: s.stamp})
}

func (s *sim) keyHolder() *session {
	for _, x := range s.sessions {
		if x.alive && x.held {
			return x
		}
	}
	return nil
}

// endSession: the server ends x now (terminated, restarted, or the client's close or
// keepalive reached it); the client learns after a delay, never before the answers
// already sent on it.
func (s *sim) endSession(x *session, why string) {
	if !x.alive {
		return
	}
	x.alive, x.held = false, false
	s.logf("server: session %d ends (%s)", x.pid, why)
	if s.ev.LockMode && rapid.Bool().Draw(s.rt, "watch_at_once") {
		defer s.tick() // the fleet's watcher reads pg_locks the moment it vanished
	}
	s.snap()
	if !x.closed && x.noticeAt < 0 {
		x.noticeAt = max(s.now+s.delay("notice"), x.lastAnswer)
		s.at(x.noticeAt, true, "notice", func() { s.notice(x) })
	}
}

func (s *sim) notice(x *session) {
	if x.closed {
		return
	}
	x.closed = true
	s.logf("client: notices session %d ended", x.pid)
	if s.connecting == x {
		s.connecting = nil
	}
	if s.cur == x {
		s.cur = nil
		if s.ev.Held {
			s.ev.Held, s.ev.LossNoticed = false, at(s.now)
		}
	}
	s.observe()
}

// answer schedules a statement's answer on x, unless x's end reaches the client first
// (the answer would have come before the close).
func (s *sim) answer(x *session, name string, do func()) {
	t := s.now + s.delay(name+"_answer")
	if x != nil {
		if x.noticeAt >= 0 && t > x.noticeAt {
			return
		}
		x.lastAnswer = max(x.lastAnswer, t)
	}
	s.at(t, true, name, do)
}

func (s *sim) verify() {
	x := s.cur
	if x == nil || x.claim == 0 || !s.ev.LockMode {
		return
	}
	sent := s.now
	claim := x.claim
	s.logf("client: sends a verification on session %d", x.pid)
	s.at(s.now+s.delay("verify_there"), false, "verify runs", func() {
		if !s.up || !x.alive || !x.held {
			return // no answer: the session's end is what the client will see
		}
		server := s.now + s.offset
		s.answer(x, "verify", func() {
			s.logf("client: verification sent at %s answers held (claim %d)", s.fmt(sent), claim)
			s.proved(sent, server, claim)
		})
	})
}

func (s *sim) proved(sent, server time.Duration, claim uint64) {
	s.ev.Proof = maxTime(s.ev.Proof, at(sent))
	s.anchor = lifegate.Later(s.anchor, lifegate.Anchor{Sent: at(sent), Server: at(server), RoundTrip: s.now - sent})
	if l := s.lead; l != nil && !l.started && l.markHeld {
		switch {
		case claim > l.markClaim:
			s.logf("client: the leadership is refused: the lock was claimed again meanwhile")
			s.lead = nil
		case at(sent).Before(at(l.from)):
		default:
			s.begin()
		}
	}
	s.observe()
}

func (s *sim) beat() {
	holds := s.ev.LockMode && s.cur != nil && s.cur.claim != 0 && s.ev.Held
	pid := 0
	if holds {
		pid = s.cur.pid
	}
	sent := s.now
	s.logf("client: sends a beat (holds %v, pid %d)", holds, pid)
	s.at(s.now+s.delay("beat_there"), false, "beat starts", func() {
		if !s.up {
			s.logf("server: down, the beat is refused")
			return
		}
		start := s.now // its now(): the hb it writes
		epoch := s.epoch
		s.at(s.now+s.delay("beat_commit"), false, "beat commits", func() {
			if !s.up || s.epoch != epoch {
				return // rolled back by the restart
			}
			s.row.hb = max(s.row.hb, start) // greatest(): the row's time never moves back
			s.row.holds = holds
			if holds && s.row.lockPid == 0 {
				s.row.lockPid = pid
			}
			s.logf("server: beat sent at %s commits (hb %s, holds %v)", s.fmt(sent), s.fmt(s.row.hb), holds)
			s.snap()
			stamped := s.row.hb + s.offset
			if rapid.IntRange(0, 9).Draw(s.rt, "beat_answer_lost") == 0 {
				return
			}
			s.answer(nil, "beat", func() {
				s.logf("client: beat sent at %s acknowledged", s.fmt(sent))
				if at(sent).After(s.ev.BeatSent) {
					s.ev.BeatSent, s.ev.BeatHolds = at(sent), holds
				}
				s.anchor = lifegate.Later(s.anchor, lifegate.Anchor{Sent: at(sent), Server: at(stamped), RoundTrip: s.now - sent})
				s.observe()
			})
		})
	})
}

func (s *sim) terminate() {
	if x := s.keyHolder(); x != nil {
		s.endSession(x, "pg_terminate_backend")
	}
}

func (s *sim) restart() {
	if !s.up {
		return
	}
	s.logf("server: restarts")
	for _, x := range s.sessions {
		s.endSession(x, "restart")
	}
	s.up = false
	s.snap()
	s.at(s.now+s.delay("down"), false, "server up", func() {
		s.up = true
		s.epoch++
		s.logf("server: up again")
		s.snap()
	})
}

// clientDrop: the client's connection fails (it stops waiting), while the server's
// backend lives on until its keepalive gives up, or the client's close reaches it.
func (s *sim) clientDrop() {
	x := s.cur
	if x == nil {
		return
	}
	s.logf("client: session %d's connection fails on this side", x.pid)
	x.closed = true
	s.cur = nil
	if s.ev.Held {
		s.ev.Held, s.ev.LossNoticed = false, at(s.now)
	}
	s.at(s.now+s.delay("keepalive"), false, "server drops it", func() { s.endSession(x, "the client's close or keepalive") })
	s.observe()
}

func (s *sim) reconnect() {
	if s.cur != nil || s.connecting != nil || !s.ev.LockMode {
		return
	}
	s.nextPid++
	x := &session{pid: s.nextPid, noticeAt: -1}
	s.connecting = x
	sent := s.now
	s.logf("client: connects session %d and claims", x.pid)
	s.at(s.now+s.delay("claim_there"), false, "claim runs", func() {
		if !s.up {
			s.logf("server: down, the connection is refused")
			s.answer(nil, "refused", func() { s.connecting = nil })
			return
		}
		s.sessions = append(s.sessions, x)
		x.alive = true
		if s.keyHolder() != nil {
			s.logf("server: session %d's claim finds the key held", x.pid)
			s.answer(x, "claim", func() {
				s.connecting = nil
				x.closed = true
				s.at(s.now+s.delay("close"), false, "close reaches the server", func() { s.endSession(x, "closed") })
			})
			return
		}
		x.held = true
		s.row.lockPid = x.pid // the claim records its backend on the row
		server := s.now + s.offset
		s.logf("server: session %d claims the lock", x.pid)
		s.snap()
		s.answer(x, "claim", func() {
			s.connecting = nil
			s.claims++
			x.claim = s.claims
			s.cur = x
			s.ev.Held = true
			s.logf("client: session %d holds the lock (claim %d)", x.pid, x.claim)
			s.proved(sent, server, x.claim)
		})
	})
}

// tick is the fleet's watcher (or a reader) stamping absences, as
// stamp_alive_lock_absences does: a lock the row says held, missing, is stamped with the
// time of the read unless a stamp of the same backend and server start stands; a stamp
// of an instance not missing is cleared.
func (s *sim) tick() {
	if !s.up {
		return
	}
	missing := s.row.holds && !s.history[len(s.history)-1].locked
	switch {
	case missing && !(s.stamp.ok && s.stamp.lockPid == s.row.lockPid && s.stamp.epoch == s.epoch):
		s.stamp = stamp{ok: true, since: s.now, lockPid: s.row.lockPid, epoch: s.epoch}
		s.logf("server: the watcher stamps pid %d's lock missing", s.row.lockPid)
	case !missing && s.stamp.ok:
		s.stamp = stamp{}
		s.logf("server: the watcher clears the stamp")
	default:
		return
	}
	s.snap()
}

func (s *sim) pause() {
	d := s.delay("pause")
	s.logf("client: paused for %s", d)
	end := s.now + d
	s.pausedUntil = max(s.pausedUntil, end)
	for _, e := range s.queue {
		if e.client && e.at < s.pausedUntil {
			e.at = s.pausedUntil
		}
	}
	s.at(end, true, "resume", func() { s.logf("client: resumes"); s.observe() })
}

// startLeading is a lease taken now: the leadership is trusted once a proof sent after it,
// on the claim that held the lock before, is answered (or at once without a lock held).
func (s *sim) startLeading() {
	if s.lead != nil || s.leads >= 4 {
		return
	}
	if until, ok := lifegate.Deadline(s.timing, s.ev, false); !ok || !at(s.now).Before(until) {
		return // acquisitions are refused while the gate says not alive
	}
	s.leads++
	l := &leadership{from: s.now}
	if s.cur != nil && s.ev.Held {
		l.markClaim, l.markHeld = s.cur.claim, true
	}
	s.lead = l
	s.logf("client: takes a lease (lock held: %v)", l.markHeld)
	if !l.markHeld {
		s.begin()
		return
	}
	s.verify() // a leadership wakes the session for a proof at once
	s.at(s.now+s.timing.Grace, true, "lead gives up", func() {
		if s.lead == l && !l.started {
			s.logf("client: no proof in time; the lease is given back")
			s.lead = nil
		}
	})
}

func (s *sim) begin() {
	l := s.lead
	until, ok := lifegate.Deadline(s.timing, s.ev, true)
	l.trust = lifegate.Start(at(s.now), until, ok)
	l.started, l.lastObs = true, s.now
	if !l.trust.Alive(at(s.now)) {
		s.logf("client: the leadership cannot start (deadline %s)", s.fmtT(until))
		s.lead = nil
		return
	}
	s.led++
	s.logf("client: starts leading, until %s", s.fmtT(until))
	s.fence()
}

func (s *sim) fmtT(t time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return s.fmt(t.Sub(t0))
}

// observe is the gate's evaluation at now, as the process runs it at each piece of
// evidence and timer: the leadership's Trust takes the deadline as of now.
func (s *sim) observe() {
	l := s.lead
	if l == nil || !l.started {
		return
	}
	prev, _ := l.trust.Until()
	// What the Trust said since the last evaluation: alive until the earlier of now and
	// the deadline then in force.
	s.trusted(l.lastObs, min(s.now, prev.Sub(t0)), "a leadership's trust")
	until, ok := lifegate.Deadline(s.timing, s.ev, true)
	l.lastObs = s.now
	alive := l.trust.Observe(at(s.now), until, ok)
	if alive && !at(s.now).Before(prev) {
		s.rt.Fatalf("a leadership's trust said alive again at %s after its deadline %s had passed\n%s", s.fmt(s.now),
			s.fmt(prev.Sub(t0)), s.timeline())
	}
	if !alive {
		s.logf("client: the leadership ends (deadline %s, now %s)", s.fmtT(until), s.fmt(prev.Sub(t0)))
		s.lead = nil
		return
	}
	s.fence()
}

// fence records the fence deadline a write taken now would carry: while it lies ahead,
// the server accepts the write.
func (s *sim) fence() {
	until, ok := lifegate.FenceUntil(s.timing, s.ev, s.lead.trust, at(s.now))
	if !ok || s.anchor.Server.IsZero() {
		return
	}
	fd := s.anchor.OnServer(until).Sub(t0) - s.offset // on the true time line
	if fd > s.now {
		s.spans = append(s.spans, span{s.now, fd, "a fence deadline taken at " + s.fmt(s.now)})
	}
}

type instant struct {
	at   time.Duration
	why  string
	snap snapshot
}

// instants are the moments that decide each span: between two changes of the server's
// state the rule can only go from alive to dead as time passes, so the last moment
// before each change, and the span's last, are enough.
func (s *sim) instants() []instant {
	var out []instant
	for _, sp := range s.spans {
		if sp.to <= sp.from {
			continue
		}
		var cuts []time.Duration
		for _, h := range s.history {
			if h.at > sp.from && h.at <= sp.to {
				cuts = append(cuts, h.at-time.Microsecond)
			}
		}
		cuts = append(cuts, sp.to-time.Microsecond)
		for _, c := range cuts {
			if c < sp.from {
				continue
			}
			if sn := s.stateAt(c); sn.up {
				out = append(out, instant{at: c, why: fmt.Sprintf("%s [%s, %s)", sp.why, s.fmt(sp.from), s.fmt(sp.to)), snap: sn})
			}
		}
	}
	return out
}

func (s *sim) stateAt(t time.Duration) snapshot {
	var sn snapshot
	for _, h := range s.history {
		if h.at > t {
			break
		}
		sn = h
	}
	return sn
}

type badInstant struct {
	at   time.Duration
	path string
	why  string
}

// verdicts asks the rule about every instant, read both ways: a reader's (pg_locks, and
// a stamp it makes itself when none stands: instance_states) and a fresh watch's (the
// lock trusted while unstamped: instance_watched_alive).
func (s *sim) verdicts(ctx context.Context, conn *pgx.Conn, rule string, instants []instant) *badInstant {
	var locked, holds []bool
	var hb, now []time.Time
	var missing []*time.Time
	var path []string
	var which []int
	for i, in := range instants {
		sn := in.snap
		server := func(d time.Duration) time.Time { return at(d + s.offset) }
		current := sn.stamp.ok && sn.stamp.epoch == sn.epoch && sn.stamp.lockPid == sn.row.lockPid
		// A reader: it stamps first (at its own read, now) when nothing stands.
		var ms *time.Time
		if sn.row.holds && !sn.locked {
			m := server(in.at)
			if current {
				m = server(sn.stamp.since)
			}
			ms = &m
		}
		locked, holds, hb, now, missing, path = append(locked, sn.locked), append(holds, sn.row.holds),
			append(hb, server(sn.row.hb)), append(now, server(in.at)), append(missing, ms), append(path, "a reader's pg_locks")
		which = append(which, i)
		// A fresh watch: the lock counts as held while the row says so and no stamp stands.
		ms = nil
		if current {
			m := server(sn.stamp.since)
			ms = &m
		}
		locked, holds, hb, now, missing, path = append(locked, sn.row.holds && !current), append(holds, sn.row.holds),
			append(hb, server(sn.row.hb)), append(now, server(in.at)), append(missing, ms), append(path, "a fresh watch's trust in the row")
		which = append(which, i)
	}
	var idx int
	var p string
	err := conn.QueryRow(ctx, rule, locked, holds, hb, now, missing, path, s.timing.Stale, s.timing.Dead, s.timing.Grace).Scan(&idx, &p)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		s.rt.Fatalf("the rule's query: %v", err)
	}
	in := instants[which[idx-1]]
	return &badInstant{at: in.at, path: p, why: in.why}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
