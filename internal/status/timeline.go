package status

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"
)

// The history in the HTML form: a bar per lease over the window, drawn server-side as SVG
// (positions are attributes, not style attributes, so the page's Content-Security-Policy
// stays as it is), and the instances that died or left; a page of each, as the JSON form
// has them. The marks drawn are capped too, so that the page keeps its weight whatever
// the history holds; the JSON form has every leadership.
const (
	// leadershipsDrawn is how many leaderships the bars shown draw in all, the newest of
	// each lease's, and at least minLeadershipsDrawn per bar: a lease that changed hands a
	// thousand times must not weigh the page down.
	leadershipsDrawn    = 200
	minLeadershipsDrawn = 4
	// minGapWidth is a gap's least width, in percent of the bar: one second of a day is
	// still visible. minSegmentWidth likewise for a leadership.
	minGapWidth     = 0.4
	minSegmentWidth = 0.15
	// labelWidth is the width, in percent of the bar, from which a mark is labelled.
	labelWidth   = 6.0
	maxLabelText = 24 // characters of a host on a segment
	holderColors = 8  // .h0 … .h7 in page.css
)

// historyHTML is the history section as the HTML form shows it.
type historyHTML struct {
	AxisFrom, AxisTo time.Time
	Timelines        []timeline
	Lives            []InstanceLifeView // the page's instances that died or left, newest first
	LeasesFrom       int                // the page's first lease, counting from 1
	LeasesTo         int
	Prev, Next       string // the history's previous and next pages
	Windows          []windowLink
}

// windowLink is one of the windows the page offers.
type windowLink struct {
	Label, Link string
	Current     bool
}

// timeline is one lease's bar, and what its row says in words.
type timeline struct {
	Name    string
	Summary string // the bar's text alternative
	Marks   []mark
	// Now: leaderless since a gap began (After says how), led (LedBy for LedFor), or
	// neither (the lease was let go and nothing says more).
	LeaderlessNow bool
	LeaderlessFor float64
	After         string
	Led           bool
	LedBy         string
	LedEpoch      int64
	LedFor        float64
	HolderDead    bool // led, by the history, by a holder that the lease's row says is dead
	Gaps          int
	LongestGap    float64
}

// mark is one shape of a bar: a leadership ("seg"), a gap, a holder's death, or the
// leaderships left undrawn ("elided"). X and W are percentages of the bar.
type mark struct {
	Death   bool
	Class   string
	X, W    string
	Label   string
	Title   string
	Seconds string // a gap's length, for data-seconds
}

func newHistoryHTML(h *HistoryView, v view) *historyHTML {
	// The bars span the window from the first lease event in it, or from where the rows
	// read begin: a history younger than the window, or a burst that filled the read,
	// would otherwise be a sliver at the bars' right end. The page says when they begin.
	out := &historyHTML{AxisFrom: later(h.From, firstLeaseEvent(h)), AxisTo: h.To}
	if h.Truncated {
		out.AxisFrom = later(out.AxisFrom, h.CompleteFrom)
	}
	for _, w := range []time.Duration{time.Hour, 6 * time.Hour, 24 * time.Hour, maxHistoryWindow} {
		label := windowText(w)
		if w == maxHistoryWindow {
			label = "7 days"
		}
		value := windowText(w)
		if w == DefaultHistoryWindow {
			value = "" // the default: no parameter
		}
		out.Windows = append(out.Windows, windowLink{Label: label, Current: w == v.q.history, Link: v.link("history", value, "history_page", "")})
	}
	drawn := minLeadershipsDrawn
	if len(h.Leases) > 0 {
		drawn = max(minLeadershipsDrawn, leadershipsDrawn/len(h.Leases))
	}
	for _, l := range h.Leases {
		out.Timelines = append(out.Timelines, newTimeline(l, out.AxisFrom, h.To, drawn))
	}
	out.LeasesFrom, out.LeasesTo = pageRange(h.Page, HistoryLeasesPerPage, len(h.Leases))
	for _, l := range h.Instances {
		if l.gone() {
			out.Lives = append(out.Lives, l)
		}
	}
	if h.Page > 1 {
		out.Prev = v.link("history_page", strconv.Itoa(h.Page-1))
	}
	if h.Page*HistoryEventsPerPage < h.EventsTotal || h.Page*HistoryLeasesPerPage < h.LeasesTotal ||
		h.Page*HistoryInstancesPerPage < h.InstancesTotal {
		out.Next = v.link("history_page", strconv.Itoa(h.Page+1))
	}
	return out
}

// newTimeline draws l over [from, now], at most drawn leaderships (the newest).
func newTimeline(l LeaseHistoryView, from, now time.Time, drawn int) timeline {
	t := timeline{Name: l.Name, Gaps: len(l.Gaps)}
	span := max(now.Sub(from).Seconds(), 1)
	pos := func(at time.Time) float64 { return min(max(at.Sub(from).Seconds()/span*100, 0), 100) }
	pct := func(p float64) string { return strconv.FormatFloat(p, 'f', 3, 64) + "%" }
	stamp := func(at time.Time) string { return at.UTC().Format("2006-01-02 15:04:05Z") }

	leaderships, gaps := l.Leaderships, l.Gaps
	if hidden := len(leaderships) - drawn; hidden > 0 {
		first := leaderships[hidden].From
		leaderships = leaderships[hidden:]
		for len(gaps) > 0 && gaps[0].To != nil && !gaps[0].To.After(first) {
			gaps = gaps[1:]
		}
		t.Marks = append(t.Marks, mark{Class: "elided", X: pct(0), W: pct(pos(first)),
			Title: fmt.Sprintf("%s and %s before, not drawn: see the JSON form", count(hidden, "leadership", "leaderships"),
				count(len(l.Gaps)-len(gaps), "gap", "gaps"))})
	}
	holderOf := map[int64]string{} // a leadership's holder by its end (Unix nanoseconds), for the death marks
	for _, s := range leaderships {
		end := now
		if s.To != nil {
			end = *s.To
			holderOf[end.UnixNano()] = shorten(s.HolderHost, maxNameShown).label()
		}
		if end.Before(from) {
			continue
		}
		x := pos(s.From)
		w := max(pos(end)-x, minSegmentWidth)
		title := fmt.Sprintf("epoch %d: %s", s.Epoch, cmp.Or(shorten(s.HolderHost, maxNameShown).label(), "a holder with no host recorded"))
		if s.HolderInstanceID != "" {
			title += " (instance " + s.HolderInstanceID + ")"
		}
		title += fmt.Sprintf(", from %s", stamp(s.From))
		if s.To != nil {
			title += fmt.Sprintf(" to %s (%s)", stamp(*s.To), formatSeconds(s.To.Sub(s.From).Seconds()))
		} else {
			title += fmt.Sprintf(", %s so far", formatSeconds(secondsTo(s.From, now)))
		}
		title += "; began " + cmp.Or(shorten(s.Began, maxNameShown).label(), "before the rows read")
		if s.Ended != "" {
			title += ", ended " + shorten(s.Ended, maxNameShown).label()
			if s.Reason != "" {
				title += " (" + shorten(s.Reason, maxNameShown).label() + ")"
			}
			if !s.EndRecorded && s.To != nil {
				title += " (not recorded yet: the next holder's takeover records it)"
			}
		}
		m := mark{Class: "seg h" + strconv.Itoa(colorOf(s)), X: pct(x), W: pct(w), Title: title}
		if w >= labelWidth {
			m.Label = shorten(s.HolderHost, maxLabelText).label()
		}
		t.Marks = append(t.Marks, m)
	}
	var deaths []mark
	for _, g := range gaps {
		end := now
		if g.To != nil {
			end = *g.To
		}
		t.LongestGap = max(t.LongestGap, g.Seconds)
		if end.Before(from) {
			continue
		}
		w := max(pos(end)-pos(g.From), minGapWidth)
		x := min(pos(g.From), 100-w)
		title := fmt.Sprintf("no leader for %s, after %s: from %s", formatSeconds(g.Seconds), shorten(g.After, maxNameShown).label(), stamp(g.From))
		class := "gap"
		if g.To != nil {
			title += " to " + stamp(*g.To)
		} else {
			title += ", still none"
			class = "gap open"
		}
		m := mark{Class: class, X: pct(x), W: pct(w), Title: title, Seconds: strconv.FormatFloat(g.Seconds, 'f', 3, 64)}
		if w >= labelWidth {
			m.Label = formatSeconds(g.Seconds)
		}
		t.Marks = append(t.Marks, m)
		if g.HolderDeadAt != nil && !g.HolderDeadAt.Before(from) {
			title := fmt.Sprintf("its holder %s dead by the verdict at %s, %s after its last sign of life", cmp.Or(holderOf[g.From.UnixNano()], "(no host recorded)"),
				stamp(*g.HolderDeadAt), formatSeconds(g.HolderDeadAt.Sub(g.From).Seconds()))
			deaths = append(deaths, mark{Death: true, Class: "death", X: pct(pos(*g.HolderDeadAt)), Title: title})
		}
	}
	t.Marks = append(t.Marks, deaths...) // drawn last: on top

	if n := len(l.Gaps); n > 0 && l.Gaps[n-1].To == nil {
		t.LeaderlessNow, t.LeaderlessFor, t.After = true, l.Gaps[n-1].Seconds, shorten(l.Gaps[n-1].After, maxNameShown).label()
	} else if n := len(l.Leaderships); n > 0 && l.Leaderships[n-1].To == nil {
		last := l.Leaderships[n-1]
		t.Led, t.LedBy, t.LedEpoch, t.LedFor = true, last.HolderHost, last.Epoch, secondsTo(last.From, now)
		t.HolderDead = last.Ended == "holder_dead"
	}
	t.Summary = fmt.Sprintf("lease %s: %s and %s in the window", shorten(l.Name, maxNameShown).label(),
		count(len(l.Leaderships), "leadership", "leaderships"), count(len(l.Gaps), "gap", "gaps"))
	switch {
	case t.LeaderlessNow:
		t.Summary += fmt.Sprintf("; no leader for %s now", formatSeconds(t.LeaderlessFor))
	case t.Led:
		t.Summary += "; led by " + shorten(t.LedBy, maxNameShown).label()
	}
	return t
}

// firstLeaseEvent is when the first leadership or gap of the section begins; h.To when
// there is none.
func firstLeaseEvent(h *HistoryView) time.Time {
	first := h.To
	for _, l := range h.Leases {
		for _, s := range l.Leaderships {
			first = earlier(first, s.From)
		}
		for _, g := range l.Gaps {
			first = earlier(first, g.From)
		}
	}
	return first
}

func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// colorOf is a holder's colour, the same on every bar.
func colorOf(l LeadershipView) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(cmp.Or(l.HolderInstanceID, l.HolderHost)))
	return int(h.Sum32() % holderColors)
}

// label is the value as one line of a label: its start and an ellipsis when shortened.
func (s shortened) label() string {
	if s.Short != "" {
		return s.Short + "…"
	}
	return s.Full
}
