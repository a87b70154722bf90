package nodeagent_test

import (
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/nodeagenttest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// TestMain runs the test binary as an attached process when a test started it as one
// (nodeagenttest.AttachProcess), and otherwise the tests, on a throwaway PostgreSQL.
func TestMain(m *testing.M) {
	nodeagenttest.MaybeRunAttachedProcess()
	pgtest.Main(m)
}
