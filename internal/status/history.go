package status

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// The history section: what happened in a window (migration 0020's history table), read
// with one statement (history_recent), newest first and at most MaxHistoryEvents rows, and
// derived from those rows alone: each lease's leaderships and the gaps between them, and
// each instance's life. Every time is the database's clock.

const (
	// DefaultHistoryWindow is how far back the page reads the history; ?history= overrides
	// it, from minHistoryWindow to maxHistoryWindow.
	DefaultHistoryWindow = 24 * time.Hour
	minHistoryWindow     = time.Minute
	maxHistoryWindow     = 7 * 24 * time.Hour // the reaper's default retention: there is no more to read
	// MaxHistoryEvents bounds the rows one page reads, whatever the history holds.
	MaxHistoryEvents = 2000
	// The section shows one page (?history_page=) of each of its lists, so that the page
	// keeps its weight at MaxHistoryEvents rows.
	HistoryEventsPerPage    = 500
	HistoryLeasesPerPage    = 50
	HistoryInstancesPerPage = 50
	// historyTimeout bounds the history's read inside the page's queryTimeout: it is the
	// page's least urgent part, and must not keep the pool's connection long.
	historyTimeout = 3 * time.Second
	// aheadTolerance: a row dated up to this much after the read's clock is not ahead of
	// it. Rows are dated by clock_timestamp() when written, the read's clock is its
	// transaction's start, and a row committed between that start and the read's snapshot
	// is read.
	aheadTolerance = time.Second
)

// HistoryView is what happened in the window.
type HistoryView struct {
	// Available is false when there is no history to read: the schema predates migration
	// 0020, or the source keeps none (a Whizbang table). Note says which.
	Available bool   `json:"available"`
	Note      string `json:"note,omitempty"`
	// From and To are the window, by the database's clock at the read.
	From          time.Time `json:"from,omitzero"`
	To            time.Time `json:"to,omitzero"`
	WindowSeconds float64   `json:"window_seconds"`
	MaxEvents     int       `json:"max_events"`
	// Truncated: the read stopped at MaxEvents, the newest rows first; the window's older
	// rows were not read. CompleteFrom is then about when the rows read begin (the oldest
	// row's time); From otherwise.
	Truncated    bool      `json:"truncated"`
	CompleteFrom time.Time `json:"complete_from,omitzero"`
	// Page is the page shown of Events, Leases and Instances, each list's own page of
	// HistoryEventsPerPage, HistoryLeasesPerPage and HistoryInstancesPerPage; the totals
	// are the whole lists'. LeaseName filters Leases as it does the leases: ?lease=.
	Page           int    `json:"page"`
	LeaseName      string `json:"lease_name,omitempty"`
	EventsTotal    int    `json:"events_total"`
	LeasesTotal    int    `json:"leases_total"`
	InstancesTotal int    `json:"instances_total"`
	// Skipped counts the rows read but left out of the leases and instances below, by
	// reason (a row dated after the read, a lease event without a lease name…); they are
	// still in Events.
	Skipped []SkippedView `json:"skipped"`
	// Events are the rows read, newest first (by id: the order they were written in).
	Events []EventView `json:"events"`
	// Leases: each lease with an acquisition or an end in the window; leaderless ones
	// first, then those with the longest gaps, then the most recently active.
	Leases []LeaseHistoryView `json:"leases"`
	// Instances: each instance with an event of its own in the window; those that died,
	// left or were reaped first; the most recently active first.
	Instances []InstanceLifeView `json:"instances"`
}

// SkippedView is how many rows were left out for one reason.
type SkippedView struct {
	Reason string `json:"reason"`
	Count  int    `json:"count"`
}

// EventView is one row of the history as it is; empty fields are left out.
type EventView struct {
	ID         int64      `json:"id"`
	At         time.Time  `json:"at"`
	Kind       string     `json:"kind"`
	Lease      string     `json:"lease,omitempty"`
	Epoch      int64      `json:"epoch,omitempty"`
	InstanceID string     `json:"instance_id,omitempty"`
	Host       string     `json:"host,omitempty"`
	Service    string     `json:"service,omitempty"`
	How        string     `json:"how,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	Since      *time.Time `json:"since,omitempty"`
	DeadAt     *time.Time `json:"dead_at,omitempty"`
}

// LeaseHistoryView is one lease's leaderships, oldest first, and the gaps between them.
type LeaseHistoryView struct {
	Name        string           `json:"name"`
	Leaderships []LeadershipView `json:"leaderships"`
	Gaps        []GapView        `json:"gaps"`
}

// LeadershipView is one epoch of a lease.
type LeadershipView struct {
	Epoch            int64     `json:"epoch"`
	HolderInstanceID string    `json:"holder_instance_id,omitempty"`
	HolderHost       string    `json:"holder_host"`
	From             time.Time `json:"from"`
	// To is null while led, or while its end is not known; never before From (a holder
	// whose last sign of life came before it took the lease ended at its start).
	To *time.Time `json:"to"`
	// Began is how it began: free, released, expired or holder_dead; "" when it began
	// before the rows read (From is then its end's record of it).
	Began string `json:"began"`
	// Ended is how it ended: released, stepped_down (Reason: the LeaseLostError.Reason),
	// expired or holder_dead; "" while led.
	Ended  string `json:"ended"`
	Reason string `json:"reason,omitempty"`
	// EndRecorded: the history records the end. An expiry, or a holder's death, is
	// recorded when the next holder takes the lease; until then the end comes from the
	// lease's row on this page (expired, or its holder dead) or from the holder's
	// recorded death, and this is false.
	EndRecorded bool `json:"end_recorded"`
}

// GapView is a time the lease was led by nobody: from a leadership's end to the next
// acquisition (To), or to now (To null).
type GapView struct {
	From    time.Time  `json:"from"`
	To      *time.Time `json:"to"`
	Seconds float64    `json:"seconds"`
	// After is how the leadership before it ended: released (a release, or a step down),
	// expired or holder_dead.
	After string `json:"after"`
	// HolderDeadAt is when the holder became dead by the verdict, after holder_dead.
	HolderDeadAt *time.Time `json:"holder_dead_at,omitempty"`
}

// InstanceLifeView is one instance's events in the window.
type InstanceLifeView struct {
	InstanceID   string            `json:"instance_id"`
	Host         string            `json:"host"`
	Service      string            `json:"service"`
	Joined       *time.Time        `json:"joined"`
	LockAbsences []LockAbsenceView `json:"lock_absences"`
	Deaths       []DeathView       `json:"deaths"`
	Left         *time.Time        `json:"left"`
	Reaped       *time.Time        `json:"reaped"`
	LastEvent    time.Time         `json:"last_event"`
}

// LockAbsenceView is a time the instance's alive lock was not held, as the watcher
// stamped it: Back null while it has not come back (or the row went first).
type LockAbsenceView struct {
	Vanished time.Time  `json:"vanished"`
	Back     *time.Time `json:"back"`
	Seconds  *float64   `json:"seconds"`
}

// DeathView is the instance dead by the verdict: At when the rule made it dead, LastAlive
// its last sign of life, DetectionSeconds the time between.
type DeathView struct {
	At               time.Time  `json:"at"`
	LastAlive        *time.Time `json:"last_alive"`
	How              string     `json:"how"` // lock_lost, heartbeat_stale or zombie
	DetectionSeconds *float64   `json:"detection_seconds"`
}

// readHistory reads the window's newest rows, within historyTimeout. A schema before
// migration 0020 has no history table: (nil, errNoHistory).
func (h *Handler) readHistory(ctx context.Context, window time.Duration) ([]store.HistoryRow, error) {
	ctx, cancel := context.WithTimeout(ctx, historyTimeout)
	defer cancel()
	rows, err := h.cfg.DB.Query(ctx, h.history.SQL, h.history.Args(window.Seconds(), MaxHistoryEvents)...)
	if err == nil {
		var read []store.HistoryRow
		read, err = pgx.CollectRows(rows, pgx.RowToStructByName[store.HistoryRow])
		if err == nil {
			return read, nil
		}
	}
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return nil, errNoHistory
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("the database did not answer within %s", historyTimeout)
	}
	return nil, err
}

// errNoHistory: the schema has no history table.
var errNoHistory = errors.New("no history table")

// noHistory is the section when there is none to read.
func noHistory(q query, note string) *HistoryView {
	return &HistoryView{Note: note, WindowSeconds: q.history.Seconds(), MaxEvents: MaxHistoryEvents, Page: q.historyPage,
		LeaseName: q.lease, Skipped: []SkippedView{}, Events: []EventView{}, Leases: []LeaseHistoryView{},
		Instances: []InstanceLifeView{}}
}

// Why a row is left out of the leases and instances.
const (
	skipAhead        = "dated after the read (ahead of the database's clock)"
	skipNoLease      = "a lease event without a lease name"
	skipNoEpoch      = "a lease event without an epoch"
	skipNoInstance   = "an instance event without an instance id"
	skipSinceAfter   = "since later than the event"
	skipDeadAfter    = "dead_at later than the event"
	skipUnknownKind  = "an unknown kind"
	skipTwice        = "a second acquisition or end of one epoch"
	skipNoBeginning  = "an end without when its leadership began"
	skipBackNoSince  = "a lock back without when it vanished"
	skipUnknownEpoch = "an end after a later acquisition of the lease"
)

// newHistoryView derives the section from rows (history_recent's, newest first) read over
// q's window, and keeps q's page of it; clock is the database's clock when the rows say
// none (no row). shown are the leases on this page: their rows say whether a lease whose
// latest event is an acquisition is still led.
func newHistoryView(rows []store.HistoryRow, q query, clock time.Time, shown []LeaseView) *HistoryView {
	now := clock
	if len(rows) > 0 {
		now = rows[0].Now
	}
	v := noHistory(q, "")
	v.Available, v.From, v.To = true, now.Add(-q.history), now
	v.CompleteFrom = v.From
	if len(rows) >= MaxHistoryEvents {
		v.Truncated = true
		v.CompleteFrom = earlier(later(v.From, rows[len(rows)-1].At), now)
		v.Note = fmt.Sprintf("the window holds %d events or more: only the newest %d were read, back to about %s",
			MaxHistoryEvents, len(rows), v.CompleteFrom.UTC().Format(time.RFC3339))
	}
	skipped := map[string]int{}
	usable := make([]store.HistoryRow, 0, len(rows))
	for _, r := range pageOf(rows, q.historyPage, HistoryEventsPerPage) {
		v.Events = append(v.Events, eventView(r))
	}
	for _, r := range rows {
		if why := unusable(r, now); why != "" {
			skipped[why]++
			continue
		}
		usable = append(usable, r)
	}
	slices.SortFunc(usable, func(a, b store.HistoryRow) int { return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.ID, b.ID)) })

	d := deriving{now: now, leases: map[string]*leaseBuild{}, lives: map[uuid.UUID]*InstanceLifeView{}, skipped: skipped}
	for _, r := range usable {
		switch r.Kind {
		case "acquired":
			d.acquired(r)
		case "ended":
			d.ended(r)
		default:
			d.instanceEvent(r)
		}
	}
	byName := map[string]LeaseView{}
	for _, l := range shown {
		byName[l.Name] = l
	}
	filter := strings.ToLower(q.lease)
	for _, b := range d.leases {
		if strings.Contains(strings.ToLower(b.view.Name), filter) {
			v.Leases = append(v.Leases, d.finish(b, byName))
		}
	}
	slices.SortFunc(v.Leases, func(a, b LeaseHistoryView) int {
		return cmp.Or(boolOrder(leaderlessNow(a), leaderlessNow(b)), cmp.Compare(gapSeconds(b), gapSeconds(a)),
			lastOf(b).Compare(lastOf(a)), cmp.Compare(a.Name, b.Name))
	})
	lives := make([]*InstanceLifeView, 0, len(d.lives))
	for _, l := range d.lives {
		lives = append(lives, l)
	}
	slices.SortFunc(lives, func(a, b *InstanceLifeView) int {
		return cmp.Or(boolOrder(a.gone(), b.gone()), b.LastEvent.Compare(a.LastEvent), cmp.Compare(a.InstanceID, b.InstanceID))
	})
	for _, l := range pageOf(lives, q.historyPage, HistoryInstancesPerPage) {
		v.Instances = append(v.Instances, *l)
	}
	for why, n := range skipped {
		v.Skipped = append(v.Skipped, SkippedView{Reason: why, Count: n})
	}
	slices.SortFunc(v.Skipped, func(a, b SkippedView) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Reason, b.Reason))
	})
	v.EventsTotal, v.LeasesTotal, v.InstancesTotal = len(rows), len(v.Leases), len(lives)
	v.Leases = pageOf(v.Leases, q.historyPage, HistoryLeasesPerPage)
	return v
}

// pageOf is the page'th page of size elements of all (1 is the first).
func pageOf[T any](all []T, page, size int) []T {
	from := min((page-1)*size, len(all))
	return all[from:min(from+size, len(all))]
}

// gone reports whether the instance died, left or was reaped in the window.
func (l InstanceLifeView) gone() bool { return len(l.Deaths) > 0 || l.Left != nil || l.Reaped != nil }

func eventView(r store.HistoryRow) EventView {
	e := EventView{ID: r.ID, At: r.At, Kind: text(r.Kind), Lease: text(r.LeaseName), Epoch: r.Epoch, Host: text(r.Host),
		Service: text(r.Service), How: text(r.How), Reason: text(r.Reason), Since: timePtr(r.Since.Time, r.Since.Valid),
		DeadAt: timePtr(r.DeadAt.Time, r.DeadAt.Valid)}
	if r.InstanceID != nil {
		e.InstanceID = r.InstanceID.String()
	}
	return e
}

func timePtr(t time.Time, valid bool) *time.Time {
	if !valid {
		return nil
	}
	return &t
}

// unusable says why a row cannot be part of a timeline; "" when it can. The triggers
// never write such rows: they come from hand-written rows, or a clock that jumped. An
// end after a holder's death is dated at its last sign of life, before its dead_at, and
// may be before its since: the last heartbeat can come before the lease was taken.
func unusable(r store.HistoryRow, now time.Time) string {
	measured := r.Kind == "acquired" || r.Kind == "lock_back" || r.Kind == "dead" // durations end at their time
	switch {
	case r.At.After(now.Add(aheadTolerance)):
		return skipAhead
	case measured && r.Since.Valid && r.Since.Time.After(r.At):
		return skipSinceAfter
	case measured && r.DeadAt.Valid && r.DeadAt.Time.After(r.At):
		return skipDeadAfter
	}
	switch r.Kind {
	case "acquired", "ended":
		switch {
		case r.LeaseName == "":
			return skipNoLease
		case r.Epoch == 0:
			return skipNoEpoch
		}
	case "joined", "left", "reaped", "lock_vanished", "lock_back", "dead":
		if r.InstanceID == nil {
			return skipNoInstance
		}
	default:
		return skipUnknownKind
	}
	return ""
}

// deriving is the derivation in progress, over the rows oldest first.
type deriving struct {
	now     time.Time
	leases  map[string]*leaseBuild
	lives   map[uuid.UUID]*InstanceLifeView
	skipped map[string]int
}

// leaseBuild is one lease's leaderships so far.
type leaseBuild struct {
	view     LeaseHistoryView
	acquired map[int64]int // leadership index by epoch, of those whose acquisition was read
	ended    map[int64]bool
	open     int               // the leadership with no end yet; -1 when none
	lastEnd  *store.HistoryRow // the latest end not followed by an acquisition
}

func (d *deriving) lease(r store.HistoryRow) *leaseBuild {
	name := text(r.LeaseName)
	b := d.leases[name]
	if b == nil {
		b = &leaseBuild{view: LeaseHistoryView{Name: name, Leaderships: []LeadershipView{}, Gaps: []GapView{}},
			acquired: map[int64]int{}, ended: map[int64]bool{}, open: -1}
		d.leases[name] = b
	}
	return b
}

// afterOf is the gap's "after" for how a leadership ended.
func afterOf(ended string) string {
	if ended == "stepped_down" {
		return "released"
	}
	return ended
}

func (d *deriving) acquired(r store.HistoryRow) {
	b := d.lease(r)
	if _, twice := b.acquired[r.Epoch]; twice || b.ended[r.Epoch] {
		d.skipped[skipTwice]++
		return
	}
	if b.open >= 0 {
		// Its end was not read (pruned, or before the rows read): the acquisition says
		// when the lease was last led, and how that ended.
		l := &b.view.Leaderships[b.open]
		end := r.At
		if r.Since.Valid {
			end = later(r.Since.Time, l.From)
		}
		l.To, l.Ended = &end, text(r.How)
		if l.Ended == "free" {
			l.Ended = ""
		}
		b.open = -1
	}
	if r.How != "free" {
		from, ok := r.Since.Time, r.Since.Valid
		if !ok && b.lastEnd != nil {
			from, ok = b.lastEnd.At, true
		}
		if ok {
			at := r.At
			b.view.Gaps = append(b.view.Gaps, GapView{From: from, To: &at, Seconds: at.Sub(from).Seconds(), After: text(r.How),
				HolderDeadAt: timePtr(r.DeadAt.Time, r.DeadAt.Valid)})
		}
	}
	b.lastEnd = nil
	l := LeadershipView{Epoch: r.Epoch, HolderHost: text(r.Host), From: r.At, Began: text(r.How)}
	if r.InstanceID != nil {
		l.HolderInstanceID = r.InstanceID.String()
	}
	b.acquired[r.Epoch] = len(b.view.Leaderships)
	b.open = len(b.view.Leaderships)
	b.view.Leaderships = append(b.view.Leaderships, l)
}

func (d *deriving) ended(r store.HistoryRow) {
	b := d.lease(r)
	if b.ended[r.Epoch] {
		d.skipped[skipTwice]++
		return
	}
	at := r.At
	i, read := b.acquired[r.Epoch]
	switch {
	case read && b.open != i:
		// A later epoch was acquired before this end: out of order.
		d.skipped[skipUnknownEpoch]++
		return
	case read:
		b.open = -1
	case !r.Since.Valid:
		d.skipped[skipNoBeginning]++
		return
	case b.open >= 0:
		// An end of an epoch whose acquisition was not read, while another one is open.
		d.skipped[skipUnknownEpoch]++
		return
	default:
		// It began before the rows read: its end records when.
		l := LeadershipView{Epoch: r.Epoch, HolderHost: text(r.Host), From: r.Since.Time}
		if r.InstanceID != nil {
			l.HolderInstanceID = r.InstanceID.String()
		}
		i = len(b.view.Leaderships)
		b.view.Leaderships = append(b.view.Leaderships, l)
	}
	b.ended[r.Epoch] = true
	l := &b.view.Leaderships[i]
	end := later(at, l.From) // a holder dead before it showed life as the holder ended at its start
	l.To, l.Ended, l.Reason, l.EndRecorded = &end, text(r.How), text(r.Reason), true
	b.lastEnd = &r
}

// finish closes the lease's view: the gap since its last end if nobody took it after, and
// whether the leadership the history leaves open is still led.
func (d *deriving) finish(b *leaseBuild, shown map[string]LeaseView) LeaseHistoryView {
	if b.lastEnd != nil {
		from := b.lastEnd.At
		b.view.Gaps = append(b.view.Gaps, GapView{From: from, Seconds: secondsTo(from, d.now), After: afterOf(text(b.lastEnd.How))})
	}
	if b.open >= 0 {
		l := &b.view.Leaderships[b.open]
		row, onPage := shown[b.view.Name]
		same := onPage && row.Epoch == l.Epoch
		switch {
		case same && row.Held, onPage && !same:
			// Led now, or the lease's row is of another epoch than the history's (taken
			// between the two reads): the history's view stands.
		case same && row.ExpiresInSeconds < 0:
			end := later(row.ExpiresAt, l.From)
			l.To, l.Ended = &end, "expired"
			b.view.Gaps = append(b.view.Gaps, GapView{From: end, Seconds: secondsTo(end, d.now), After: "expired"})
		default:
			// Its holder is dead by the verdict (the lease's row on this page says so), or
			// the lease is not on this page: the holder's recorded death after it began
			// ends it, at the last sign of life, as the next takeover will record.
			death := d.deathOf(l.HolderInstanceID, l.From)
			switch {
			case death != nil && death.LastAlive != nil:
				lastAlive, at := *death.LastAlive, death.At
				end := later(lastAlive, l.From)
				l.To, l.Ended = &end, "holder_dead"
				b.view.Gaps = append(b.view.Gaps, GapView{From: lastAlive, Seconds: secondsTo(lastAlive, d.now),
					After: "holder_dead", HolderDeadAt: &at})
			case same:
				l.Ended = "holder_dead" // when, the history does not say yet
			}
		}
	}
	slices.SortStableFunc(b.view.Leaderships, func(x, y LeadershipView) int {
		return cmp.Or(x.From.Compare(y.From), cmp.Compare(x.Epoch, y.Epoch))
	})
	slices.SortStableFunc(b.view.Gaps, func(x, y GapView) int { return x.From.Compare(y.From) })
	return b.view
}

// deathOf is the instance's latest recorded death by the verdict at or after from (an
// instance dead by the verdict takes no lease); nil when none.
func (d *deriving) deathOf(id string, from time.Time) *DeathView {
	u, err := uuid.Parse(id)
	if err != nil || d.lives[u] == nil {
		return nil
	}
	deaths := d.lives[u].Deaths
	for i := len(deaths) - 1; i >= 0; i-- {
		if !deaths[i].At.Before(from) {
			return &deaths[i]
		}
	}
	return nil
}

func (d *deriving) instanceEvent(r store.HistoryRow) {
	id := *r.InstanceID
	l := d.lives[id]
	if l == nil {
		l = &InstanceLifeView{InstanceID: id.String(), LockAbsences: []LockAbsenceView{}, Deaths: []DeathView{}}
		d.lives[id] = l
	}
	at := r.At
	switch r.Kind {
	case "joined":
		if l.Joined == nil {
			l.Joined = &at
		}
	case "lock_vanished":
		l.LockAbsences = append(l.LockAbsences, LockAbsenceView{Vanished: at})
	case "lock_back":
		var open *LockAbsenceView
		if n := len(l.LockAbsences); n > 0 && l.LockAbsences[n-1].Back == nil {
			open = &l.LockAbsences[n-1]
		}
		if open == nil {
			if !r.Since.Valid {
				d.skipped[skipBackNoSince]++
				return
			}
			l.LockAbsences = append(l.LockAbsences, LockAbsenceView{Vanished: r.Since.Time})
			open = &l.LockAbsences[len(l.LockAbsences)-1]
		}
		s := at.Sub(open.Vanished).Seconds()
		open.Back, open.Seconds = &at, &s
	case "dead":
		death := DeathView{At: at, How: text(r.How)}
		if r.Since.Valid {
			since := r.Since.Time
			s := at.Sub(since).Seconds()
			death.LastAlive, death.DetectionSeconds = &since, &s
		}
		l.Deaths = append(l.Deaths, death)
	case "left":
		l.Left = &at
	case "reaped":
		l.Reaped = &at
	}
	l.Host = cmp.Or(text(r.Host), l.Host)
	l.Service = cmp.Or(text(r.Service), l.Service)
	l.LastEvent = at
}

// leaderlessNow reports whether the lease's last gap has not ended.
func leaderlessNow(l LeaseHistoryView) bool {
	return len(l.Gaps) > 0 && l.Gaps[len(l.Gaps)-1].To == nil
}

func gapSeconds(l LeaseHistoryView) float64 {
	var s float64
	for _, g := range l.Gaps {
		s += g.Seconds
	}
	return s
}

// lastOf is the lease's latest change: the last leadership's start or end, or the last
// gap's start.
func lastOf(l LeaseHistoryView) time.Time {
	var t time.Time
	for _, x := range l.Leaderships {
		t = later(t, x.From)
		if x.To != nil {
			t = later(t, *x.To)
		}
	}
	for _, g := range l.Gaps {
		t = later(t, g.From)
	}
	return t
}

// secondsTo is how long from was before now; 0 for a row up to aheadTolerance after it.
func secondsTo(from, now time.Time) float64 { return max(now.Sub(from).Seconds(), 0) }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
