// Package wait holds the waits that the tools' harnesses share (the fleet simulator, the
// fleet benchmark, the fault suite and the soak): a sleep that the context ends early,
// and a ticker loop that ends with the context.
package wait

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends; false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Every calls f every d until ctx ends; the first call comes after d.
func Every(ctx context.Context, d time.Duration, f func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		f()
	}
}
