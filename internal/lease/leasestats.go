// What Leases counts for Stats: the acquisitions held and their epochs, the leases lost
// by reason, and the fenced writes refused.

package lease

import "sort"

type counts struct {
	held    int
	epochs  map[int64]int // epochs held now, with how many acquisitions hold each
	lost    map[string]uint64
	refused uint64 // fenced writes refused (noteRefused)
	// refusalTold: the first refusal has been logged.
	refusalTold bool
}

// statName is the name the lease counts under in Leases.Stats: its own, or for a lease a
// group renews (a shard set's) the group's, so that a thousand shards are one entry.
func (le *Lease) statName() string {
	if le.group != nil {
		return le.group.statName
	}
	return le.Name
}

func (l *Leases) countsOf(name string) *counts {
	c := l.names[name]
	if c == nil {
		c = &counts{epochs: map[int64]int{}, lost: map[string]uint64{}}
		l.names[name] = c
	}
	return c
}

func (l *Leases) noteAcquired(name string, epoch int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.countsOf(name)
	c.held++
	c.epochs[epoch]++
}

func (l *Leases) noteEnded(name string, epoch int64, lost *Loss) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.countsOf(name)
	c.held--
	if c.epochs[epoch]--; c.epochs[epoch] <= 0 {
		delete(c.epochs, epoch)
	}
	if lost != nil {
		c.lost[lost.Reason]++
	}
}

// Stats is a point-in-time view of one lease name as used by this process: the library's
// LeaseStats, of the same fields, which documents them.
type Stats struct {
	Name          string
	Held          bool
	Epoch         int64
	Lost          map[string]uint64
	FencedRefused uint64
}

// Stats lists every name this Leases has acquired, sorted by Name. Lost has every reason,
// zero included.
func (l *Leases) Stats() []Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Stats, 0, len(l.names))
	for name, c := range l.names {
		lost := map[string]uint64{ReasonExpired: 0, ReasonTaken: 0, ReasonError: 0, ReasonNotAlive: 0}
		for r, n := range c.lost {
			lost[r] = n
		}
		var epoch int64
		for e := range c.epochs {
			epoch = max(epoch, e)
		}
		out = append(out, Stats{Name: name, Held: c.held > 0, Epoch: epoch, Lost: lost, FencedRefused: c.refused})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
