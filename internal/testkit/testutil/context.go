package testutil

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Context returns a context that ends d from now, or when the test ends if that is
// sooner, so that no test waits on the database without a deadline. It is cancelled in
// the test's clean-up, not before, so that clean-ups registered earlier may still use it.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// RunUntilCleanup runs run in a goroutine until the returned stop (or the test's end)
// cancels it, and checks that it returns nil promptly.
func RunUntilCleanup(t testing.TB, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return within 10s of its context ending")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
