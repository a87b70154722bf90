package liveness_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/nodeagenttest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// TestMain gives the runnable examples a throwaway database in DATABASE_URL, where a
// service would have its own, so that the examples import nothing internal and can be
// copied as they are.
func TestMain(m *testing.M) {
	nodeagenttest.MaybeRunAttachedProcess() // a process attached to a node agent, when a test started one
	dsn, err := pgtest.FreshDSN()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.Setenv("DATABASE_URL", dsn); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pgtest.Main(m)
}
