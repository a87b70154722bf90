// What Leases counts for Stats: the acquisitions held and their epochs, the leases lost
// by reason, and the fenced writes refused.

package liveness

import "sort"

type leaseCounts struct {
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

func (l *Leases) counts(name string) *leaseCounts {
	c := l.names[name]
	if c == nil {
		c = &leaseCounts{epochs: map[int64]int{}, lost: map[string]uint64{}}
		l.names[name] = c
	}
	return c
}

func (l *Leases) noteAcquired(name string, epoch int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.counts(name)
	c.held++
	c.epochs[epoch]++
}

func (l *Leases) noteEnded(name string, epoch int64, lost *LeaseLostError) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.counts(name)
	c.held--
	if c.epochs[epoch]--; c.epochs[epoch] <= 0 {
		delete(c.epochs, epoch)
	}
	if lost != nil {
		c.lost[lost.Reason]++
	}
}

// Stats lists every name this Leases has acquired, sorted by Name. Lost has every reason,
// zero included.
func (l *Leases) Stats() []LeaseStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]LeaseStats, 0, len(l.names))
	for name, c := range l.names {
		lost := map[string]uint64{lostExpired: 0, lostTaken: 0, lostError: 0, lostNotAlive: 0}
		for r, n := range c.lost {
			lost[r] = n
		}
		var epoch int64
		for e := range c.epochs {
			epoch = max(epoch, e)
		}
		out = append(out, LeaseStats{Name: name, Held: c.held > 0, Epoch: epoch, Lost: lost, FencedRefused: c.refused})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
