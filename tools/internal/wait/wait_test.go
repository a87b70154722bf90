package wait

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// Sleep sleeps its time when nothing ends it, and returns false at once when the context
// ends.
func TestSleep(t *testing.T) {
	start := time.Now()
	if !Sleep(context.Background(), 50*time.Millisecond) || time.Since(start) < 50*time.Millisecond {
		t.Errorf("Sleep(50 ms) returned false or after %s", time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	start = time.Now()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep returned true although its context ended")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Sleep returned %s after its context ended", took)
	}
}

// Every calls its function again and again, never before the first period, and not after
// its context ended.
func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	start := time.Now()
	var first time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, 10*time.Millisecond, func() {
			if calls.Add(1) == 1 {
				first = time.Since(start)
			}
			if calls.Load() == 3 {
				cancel()
			}
		})
	}()
	<-done
	if n := calls.Load(); n != 3 {
		t.Errorf("%d calls; want 3, the last one ending the context", n)
	}
	if first < 10*time.Millisecond {
		t.Errorf("first call after %s, before the period", first)
	}
}
