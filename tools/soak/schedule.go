package soak

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kinds of fault the nemesis applies.
const (
	FaultKill             = "kill"              // kill -9 of a process, restarted (a new instance) after For
	FaultStop             = "stop"              // SIGSTOP of a process, SIGCONT after For
	FaultLinkDown         = "link_down"         // a namespace's link down (half-open: sockets stay open), up after For
	FaultBlip             = "blip"              // the same for 5 s
	FaultRestartFast      = "restart_fast"      // PostgreSQL stopped with -m fast, started after For
	FaultRestartImmediate = "restart_immediate" // with -m immediate (crash recovery on start)
	FaultFailover         = "failover"          // the primary stopped, the replica promoted (once per run)
	FaultTerminate        = "terminate"         // pg_terminate_backend of random sessions of the fleet
	FaultPoolExhaustion   = "pool_exhaustion"   // every pool connection of a process in a long transaction for For
	FaultReadOnly         = "read_only"         // default_transaction_read_only on for For
)

// FaultKinds lists every kind, in the report's order.
var FaultKinds = []string{FaultKill, FaultStop, FaultLinkDown, FaultBlip, FaultRestartFast,
	FaultRestartImmediate, FaultFailover, FaultTerminate, FaultPoolExhaustion, FaultReadOnly}

// databaseFault says which kinds act on the server: they affect every process, and one
// runs at a time.
var databaseFault = map[string]bool{FaultRestartFast: true, FaultRestartImmediate: true,
	FaultFailover: true, FaultReadOnly: true}

// Fleet is what the schedule needs to know of the fleet: process names, those in a
// network namespace (link faults), those whose pool can be exhausted, the leases.
type Fleet struct {
	Procs    []string
	Netns    []string
	Pools    []string
	Leases   []string
	Failover bool // a replica to promote exists
}

// HolderPrefix makes a kill's target "whoever holds this lease when the fault is
// applied": the schedule cannot know who that is, and a crashed holder is what the
// takeover bound is about.
const HolderPrefix = "holder:"

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
	meanGap = 4 * time.Second
	// BlipFor is the blip's length, as the fault suite's.
	BlipFor = 5 * time.Second
	// PoolBusyFor is how long a pool stays exhausted (the faultagent's --busy-for).
	PoolBusyFor = 8 * time.Second
)

// Quiet is the end of the run kept free of faults: everything is healed at least this
// long before the end, so that convergence can be checked.
func Quiet() time.Duration { return ConvergenceBound + 5*time.Second }

// NewSchedule draws the schedule for a run of length d from seed. It depends on nothing
// else: the same seed, length and fleet give the same schedule. Kinds are drawn from
// shuffled decks holding each kind once (the failover in the first deck only), so that
// every kind comes up early and often; faults overlap, except that one database fault
// runs at a time and a process or namespace takes one fault at a time.
func NewSchedule(seed uint64, d time.Duration, fleet Fleet) []Fault {
	r := rand.New(rand.NewPCG(seed, 0x50a4))
	end := d - Quiet()
	var out []Fault
	busyUntil := map[string]time.Duration{} // a target, or "db"
	var deck []string
	decks := 0
	at := Warmup
	for id := 1; ; id++ {
		gap := time.Duration(r.ExpFloat64() * float64(meanGap))
		at += min(max(gap, 500*time.Millisecond), 3*meanGap)
		if at >= end {
			return out
		}
		if len(deck) == 0 {
			if len(fleet.Leases) > 0 {
				deck = append(deck, FaultKill) // a second kill per deck, of a lease's holder
			}
			for _, k := range FaultKinds {
				if k == FaultFailover && (decks > 0 || !fleet.Failover) {
					continue
				}
				if (k == FaultLinkDown || k == FaultBlip) && len(fleet.Netns) == 0 {
					continue
				}
				if k == FaultPoolExhaustion && len(fleet.Pools) == 0 {
					continue
				}
				deck = append(deck, k)
			}
			r.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
			decks++
		}
		// The first kind of the deck that can run now; the others wait for later draws.
		placed := false
		for i, kind := range deck {
			f := Fault{ID: id, At: at, Kind: kind, Pick: r.Uint64()}
			f.For = faultLength(r, kind)
			var pool []string
			switch {
			case databaseFault[kind]:
				pool = []string{"db"}
			case kind == FaultTerminate:
				pool = []string{""}
			case kind == FaultLinkDown || kind == FaultBlip:
				pool = fleet.Netns
			case kind == FaultPoolExhaustion:
				pool = fleet.Pools
			case kind == FaultKill && len(fleet.Leases) > 0 && !slices.Contains(deck[:i], FaultKill) && slices.Contains(deck[i+1:], FaultKill):
				for _, l := range fleet.Leases {
					pool = append(pool, HolderPrefix+l)
				}
			default:
				pool = fleet.Procs
			}
			var free []string
			for _, p := range pool {
				key := p
				if kind == FaultLinkDown || kind == FaultBlip {
					key = "net:" + p
				}
				if p == "" || busyUntil[key] <= at {
					free = append(free, p)
				}
			}
			if len(free) == 0 || at+f.For > end {
				continue
			}
			target := free[r.IntN(len(free))]
			key := target
			if kind == FaultLinkDown || kind == FaultBlip {
				key = "net:" + target
			}
			if target != "db" {
				f.Target = target
			}
			if target != "" {
				busyUntil[key] = at + f.For + time.Second
			}
			out = append(out, f)
			deck = slices.Delete(deck, i, i+1)
			placed = true
			break
		}
		if !placed {
			id-- // nothing could run at this moment: draw the next moment
		}
	}
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
