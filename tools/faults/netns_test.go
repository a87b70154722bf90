package faults

import (
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/netns"
)

// newNetns creates a network namespace joined to the host by a veth pair. It is removed
// when the test ends, and by a watchdog process if the test binary dies first.
func newNetns(t testing.TB) *netns.Namespace {
	t.Helper()
	n, err := netns.Create("plf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Remove)
	return n
}
