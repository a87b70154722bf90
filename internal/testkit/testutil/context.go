package testutil

import (
	"context"
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
