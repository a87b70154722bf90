package soak

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"
)

// Kinds of fault the nemesis applies.
const (
	FaultKill             = "kill"               // kill -9 of a process, restarted (a new instance) after For
	FaultStop             = "stop"               // SIGSTOP of a process, SIGCONT after For
	FaultLinkDown         = "link_down"          // a namespace's link down (half-open: sockets stay open), up after For
	FaultBlip             = "blip"               // the same for 5 s
	FaultRestartFast      = "restart_fast"       // PostgreSQL stopped with -m fast, started after For
	FaultRestartImmediate = "restart_immediate"  // with -m immediate (crash recovery on start)
	FaultFailover         = "failover"           // the primary stopped, the replica promoted (once per run)
	FaultTerminate        = "terminate"          // pg_terminate_backend of random sessions of the fleet
	FaultPoolExhaustion   = "pool_exhaustion"    // every pool connection of a process in a long transaction for For
	FaultReadOnly         = "read_only"          // default_transaction_read_only on for For
	FaultLateClose        = "late_close"         // a lock session frozen at its proxy, its backend ended, the close delivered For later
	FaultNodeRestart      = "node_agent_restart" // the node agent stopped (SIGTERM), started again (a new instance) after For
)

// FaultKinds lists every kind, in the report's order.
var FaultKinds = []string{FaultKill, FaultStop, FaultLinkDown, FaultBlip, FaultRestartFast,
	FaultRestartImmediate, FaultFailover, FaultTerminate, FaultPoolExhaustion, FaultReadOnly,
	FaultLateClose, FaultNodeRestart}

// databaseFault says which kinds act on the server: they affect every process, and one
// runs at a time.
var databaseFault = map[string]bool{FaultRestartFast: true, FaultRestartImmediate: true,
	FaultFailover: true, FaultReadOnly: true}

// Fleet is what the schedule needs to know of the fleet.
type Fleet struct {
	Procs       []string
	Netns       []string            // in a network namespace: link faults
	Pools       []string            // whose pool can be exhausted
	Competitors map[string][]string // lease → the processes that compete for it
	NodeAgent   string              // the node agent's process, "" without one
	Attached    []string            // the processes attached to it
	Proxied     []string            // whose alive lock's session runs through a proxy: late_close
	Failover    bool                // a replica to promote exists
}

// Leases are the fleet's leases, sorted.
func (f Fleet) Leases() []string {
	out := make([]string, 0, len(f.Competitors))
	for l := range f.Competitors {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// leaseOf is the lease proc competes for, "" for none.
func (f Fleet) leaseOf(proc string) string {
	for l, ps := range f.Competitors {
		if slices.Contains(ps, proc) {
			return l
		}
	}
	return ""
}

// HolderPrefix makes a target "whoever holds this lease when the fault is applied": the
// schedule cannot know who that is. A kill of it is what the takeover bound is about. A
// late close takes "holder:*": a holder of any lease among the processes behind a proxy,
// which is what the leader's guarantee is about.
const HolderPrefix = "holder:"

// AnyLease is the lease of a late close's target: any.
const AnyLease = "*"

// HolderWait is how long a fault on a lease's holder waits for one; then it takes
// another of the processes it may (the schedule keeps them all free of other faults for
// it, HolderWait longer), so that it comes within the window the schedule kept for it.
const HolderWait = time.Second

// Fault is one entry of the schedule: at At from the run's start, applied to Target
// (a process, or "" for the database) and healed For later. Pick chooses among what is
// only known when the fault is applied (the sessions to terminate).
type Fault struct {
	ID     int
	At     time.Duration
	Kind   string
	Target string
	For    time.Duration
	Pick   uint64
}

func (f Fault) String() string {
	t := f.Target
	if t == "" {
		t = "database"
	}
	return fmt.Sprintf("#%d %s %s at %s for %s", f.ID, f.Kind, t, f.At.Round(time.Millisecond), f.For.Round(time.Millisecond))
}

// Schedule bounds.
const (
	// Warmup is how long the fleet runs before the first fault: every agent joined.
	Warmup = 15 * time.Second
	// meanGap is the mean pause between two faults' starts (exponential, clipped).
	meanGap = 3 * time.Second
	// BlipFor is the blip's length, as the fault suite's.
	BlipFor = 5 * time.Second
	// PoolBusyFor is how long a pool stays exhausted (the faultagent's --busy-for).
	PoolBusyFor = 8 * time.Second
)

// Quiet is the end of the run kept free of faults: everything is healed at least this
// long before the end, so that convergence can be checked.
func Quiet() time.Duration { return ConvergenceBound + 5*time.Second }

// A kill is judged for detection and takeover only when nothing else disturbs it (see the
// checker): its victim and the victim's heirs (the other competitors of its lease) held
// their alive locks when it came, and nothing disturbs them, the database or the sessions
// until the bounds have passed. So a kill keeps a window free of other faults on them,
// on the database and of terminations, from before it (each earlier fault's settling
// time: until the locks it took away are held again) to KillWindow after it.
//
// A stop is kept apart in the same way, and for its whole length: a stopped holder whose
// lock is taken away (the database restarting, its session ended, its node agent gone)
// is dead by the verdict, its lease may be taken before it expires, and its job runs on
// when it resumes, an overlap nothing could excuse (the checker excuses only one whose
// lease had expired, by the database's clock).
const (
	// KillWindow: the longest bound a kill is judged by, and a second.
	KillWindow = LeaseTakeBound + time.Second
	// settleDatabase: after a restart or a failover heals, every lock held again (the
	// reconnect backoff had grown to a few seconds while the server was away).
	settleDatabase = 8 * time.Second
	// settleReadOnly: locks stay held while the database is read-only; the stamps of
	// vanished locks (and so the detection of a crash) resume with writes.
	settleReadOnly = time.Second
	// settleTerminate: a terminated lock session reconnects and claims again.
	settleTerminate = 3 * time.Second
	// settleRestart: a restarted process (a kill, the node agent) is joined and locked,
	// and the node agent's processes attached again.
	settleRestart = 6 * time.Second
	// settleLink: a half-open link's lock session may have been ended by the server's
	// keepalive; the agent notices at its next verification after the link is back.
	settleLink = 12 * time.Second
	// settleBlip: a blip leaves the session open; its verification may have timed out.
	settleBlip = 3 * time.Second
	// settleLateClose: the close delivered, the agent claims again.
	settleLateClose = 3 * time.Second
	// settleProcess: a stop or an exhausted pool leaves the lock held.
	settleProcess = time.Second
)

// planner keeps what the schedule has reserved: resources, each busy until a time (no
// fault that needs it free may start before) and settled from a time (a kill or a stop
// that needs it undisturbed may not start before). The resources: "db", the database's
// faults, one at a time; "nodb", held by kills, stops and late closes, during which no
// database fault may start; "term", settled after a termination; "noterm", held by kills,
// during which no termination may come; and for each process "p:<proc>", its process
// faults, and "net:<proc>", its link faults.
type planner struct {
	busy, settled map[string]time.Duration
}

func (p *planner) free(at time.Duration, keys ...string) bool {
	for _, k := range keys {
		if p.busy[k] > at {
			return false
		}
	}
	return true
}

func (p *planner) ready(at time.Duration, keys ...string) bool {
	for _, k := range keys {
		if p.busy[k] > at || p.settled[k] > at {
			return false
		}
	}
	return true
}

func (p *planner) hold(until time.Duration, keys ...string) {
	for _, k := range keys {
		p.busy[k] = max(p.busy[k], until)
	}
}

func (p *planner) settle(until time.Duration, keys ...string) {
	for _, k := range keys {
		p.settled[k] = max(p.settled[k], until)
	}
}

func procKeys(procs ...string) []string {
	var out []string
	for _, p := range procs {
		out = append(out, "p:"+p, "net:"+p)
	}
	return out
}

// draw is an entry of a deck: a kind and whom it may target.
type draw struct {
	kind string
	whom string // "any", "holder", "node", "net", "pool", "db", ""
}

// killReserved are the processes a kill of victims keeps undisturbed: the victims, the
// other competitors of their leases (the heirs), and the node agent when one of them is
// attached to it.
func (f Fleet) killReserved(victims []string) []string {
	out := slices.Clone(victims)
	for _, v := range victims {
		for _, c := range f.Competitors[f.leaseOf(v)] {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	for _, p := range slices.Clone(out) {
		if f.NodeAgent != "" && slices.Contains(f.Attached, p) && !slices.Contains(out, f.NodeAgent) {
			out = append(out, f.NodeAgent)
		}
	}
	sort.Strings(out)
	return out
}

// NewSchedule draws the schedule for a run of length d from seed. It depends on nothing
// else: the same seed, length and fleet give the same schedule. Kinds are drawn from
// shuffled decks holding each kind once (a kill three times: of any process, of a lease's
// holder, of the node agent; the failover in the first deck only), so that every kind
// comes up early and often. Faults overlap, except that one database fault runs at a
// time, a process takes one process fault and one link fault at a time, and kills and
// stops keep their windows (KillWindow).
func NewSchedule(seed uint64, d time.Duration, fleet Fleet) []Fault {
	r := rand.New(rand.NewPCG(seed, 0x50a4))
	end := d - Quiet()
	var out []Fault
	pl := &planner{busy: map[string]time.Duration{}, settled: map[string]time.Duration{}}
	var deck []draw
	decks := 0
	at := Warmup
	for id := 1; ; id++ {
		gap := time.Duration(r.ExpFloat64() * float64(meanGap))
		at += min(max(gap, 500*time.Millisecond), 3*meanGap)
		if at >= end {
			return out
		}
		if len(deck) == 0 {
			deck = fleet.deck(decks == 0)
			r.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
			decks++
		}
		// The first entry of the deck that can run now; the others wait for later draws.
		placed := false
		for i, dr := range deck {
			f := Fault{ID: id, At: at, Kind: dr.kind, Pick: r.Uint64()}
			f.For = faultLength(r, dr.kind)
			if ok := fleet.place(pl, r, &f, dr.whom, end); ok {
				out = append(out, f)
				deck = slices.Delete(deck, i, i+1)
				placed = true
				break
			}
		}
		if !placed {
			id-- // nothing could run at this moment: draw the next moment
		}
	}
}

// deck is one deck of draws for the fleet.
func (f Fleet) deck(first bool) []draw {
	var deck []draw
	add := func(kind, whom string) { deck = append(deck, draw{kind, whom}) }
	add(FaultKill, "any")
	if len(f.Competitors) > 0 {
		add(FaultKill, "holder")
	}
	if f.NodeAgent != "" {
		add(FaultKill, "node")
		add(FaultNodeRestart, "node")
	}
	add(FaultStop, "any")
	if len(f.Netns) > 0 {
		add(FaultLinkDown, "net")
		add(FaultBlip, "net")
	}
	add(FaultRestartFast, "db")
	add(FaultRestartImmediate, "db")
	if first && f.Failover {
		add(FaultFailover, "db")
	}
	add(FaultTerminate, "")
	if len(f.Pools) > 0 {
		add(FaultPoolExhaustion, "pool")
	}
	add(FaultReadOnly, "db")
	if len(f.Proxied) > 0 && len(f.Competitors) > 0 {
		add(FaultLateClose, "holder")
	}
	return deck
}

// place picks f's target and reserves what it needs, or reports that it cannot run at
// f.At.
func (f Fleet) place(pl *planner, r *rand.Rand, fault *Fault, whom string, end time.Duration) bool {
	at, length := fault.At, fault.For
	if at+HolderWait+length > end || (fault.Kind == FaultKill && at+HolderWait+max(length, KillWindow) > end) {
		return false
	}
	// pick chooses one candidate that ok accepts.
	pick := func(cands []string, ok func(string) bool) (string, bool) {
		var free []string
		for _, c := range cands {
			if ok(c) {
				free = append(free, c)
			}
		}
		if len(free) == 0 {
			return "", false
		}
		return free[r.IntN(len(free))], true
	}
	switch fault.Kind {
	case FaultKill:
		var victims []string
		switch whom {
		case "holder":
			lease, ok := pick(f.Leases(), func(l string) bool { return f.killReady(pl, at, f.Competitors[l]) })
			if !ok {
				return false
			}
			victims, fault.Target = f.Competitors[lease], HolderPrefix+lease
			at += HolderWait // it may come that much later
		case "node":
			if !f.killReady(pl, at, []string{f.NodeAgent}) {
				return false
			}
			victims, fault.Target = []string{f.NodeAgent}, f.NodeAgent
		default:
			p, ok := pick(f.Procs, func(p string) bool { return f.killReady(pl, at, []string{p}) })
			if !ok {
				return false
			}
			victims, fault.Target = []string{p}, p
		}
		window := at + KillWindow
		pl.hold(window, "nodb", "noterm")
		pl.hold(window, procKeys(f.killReserved(victims)...)...)
		pl.hold(at+length+time.Second, procKeys(victims...)...)
		pl.settle(at+length+settleRestart, procKeys(victims...)...)
		if slices.Contains(victims, f.NodeAgent) {
			pl.settle(at+length+settleRestart, procKeys(f.Attached...)...)
		}
	case FaultStop:
		p, ok := pick(f.Procs, func(p string) bool {
			return pl.ready(at, "db", "term") && pl.ready(at, procKeys(p)...) && pl.ready(at, f.nodeKeys(p)...)
		})
		if !ok {
			return false
		}
		fault.Target = p
		pl.hold(at+length, "nodb")
		pl.hold(at+length, f.nodeKeys(p)...)
		if p == f.NodeAgent { // its processes' locks are its session's
			pl.hold(at+length, procKeys(f.Attached...)...)
		}
		pl.hold(at+length+time.Second, procKeys(p)...)
		pl.settle(at+length+settleProcess, procKeys(p)...)
	case FaultLinkDown, FaultBlip:
		p, ok := pick(f.Netns, func(p string) bool { return pl.free(at, "net:"+p) })
		if !ok {
			return false
		}
		fault.Target = p
		pl.hold(at+length+time.Second, "net:"+p)
		settle := settleLink
		if fault.Kind == FaultBlip {
			settle = settleBlip
		}
		pl.settle(at+length+settle, procKeys(p)...)
	case FaultPoolExhaustion:
		p, ok := pick(f.Pools, func(p string) bool { return pl.free(at, "p:"+p) })
		if !ok {
			return false
		}
		fault.Target = p
		pl.hold(at+length+time.Second, "p:"+p)
		pl.settle(at+length+settleProcess, procKeys(p)...)
	case FaultLateClose:
		if !pl.free(at, "db") || !pl.free(at, procKeys(f.Proxied...)...) {
			return false
		}
		fault.Target = HolderPrefix + AnyLease
		at += HolderWait // it may come that much later
		pl.hold(at+length, "nodb")
		pl.hold(at+length+time.Second, procKeys(f.Proxied...)...)
		pl.settle(at+length+settleLateClose, procKeys(f.Proxied...)...)
	case FaultNodeRestart:
		if !pl.free(at, "p:"+f.NodeAgent) {
			return false
		}
		fault.Target = f.NodeAgent
		pl.hold(at+length+time.Second, "p:"+f.NodeAgent)
		pl.settle(at+length+settleRestart, procKeys(append([]string{f.NodeAgent}, f.Attached...)...)...)
	case FaultTerminate:
		if !pl.free(at, "noterm") {
			return false
		}
		pl.settle(at+settleTerminate, "term")
	default: // the database's
		if !pl.free(at, "db", "nodb") {
			return false
		}
		pl.hold(at+length+time.Second, "db")
		settle := settleDatabase
		if fault.Kind == FaultReadOnly {
			settle = settleReadOnly
		}
		pl.settle(at+length+settle, "db")
	}
	return true
}

// killReady reports whether a kill (or a stop) of one of victims may come at at: the
// database, the sessions and every process it keeps undisturbed settled and free.
func (f Fleet) killReady(pl *planner, at time.Duration, victims []string) bool {
	return pl.ready(at, "db", "term") && pl.ready(at, procKeys(f.killReserved(victims)...)...)
}

// nodeKeys are the keys of p's node agent, when p is attached to one.
func (f Fleet) nodeKeys(p string) []string {
	if f.NodeAgent != "" && slices.Contains(f.Attached, p) {
		return []string{"p:" + f.NodeAgent}
	}
	return nil
}

func faultLength(r *rand.Rand, kind string) time.Duration {
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo))) }
	switch kind {
	case FaultKill:
		return between(time.Second, 8*time.Second)
	case FaultStop:
		return between(2*time.Second, 20*time.Second)
	case FaultLinkDown:
		return between(12*time.Second, 35*time.Second)
	case FaultBlip:
		return BlipFor
	case FaultRestartFast, FaultRestartImmediate:
		return between(time.Second, 4*time.Second)
	case FaultReadOnly:
		return between(3*time.Second, 20*time.Second)
	case FaultPoolExhaustion:
		return PoolBusyFor
	case FaultLateClose:
		// From half the lock grace (1 s at the defaults) to one and a half: the close
		// reaches the leader before, around and after the fleet may call it dead.
		return between(500*time.Millisecond, 1500*time.Millisecond)
	case FaultNodeRestart:
		return between(500*time.Millisecond, 3*time.Second)
	}
	return 0 // failover and terminate heal at once (the promotion, the reconnect)
}

// CountByKind counts the schedule's faults by kind.
func CountByKind(s []Fault) map[string]int {
	out := map[string]int{}
	for _, f := range s {
		out[f.Kind]++
	}
	return out
}

// Overlaps counts the faults that begin while another is still applied.
func Overlaps(s []Fault) int {
	n := 0
	for i, f := range s {
		for _, g := range s[:i] {
			if g.At+g.For > f.At {
				n++
				break
			}
		}
	}
	return n
}

// Describe is the schedule, one fault a line.
func Describe(s []Fault) string {
	var b strings.Builder
	for _, f := range s {
		b.WriteString(f.String() + "\n")
	}
	return b.String()
}
