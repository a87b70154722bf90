package lease

import (
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// TestMain runs the tests on a throwaway PostgreSQL.
func TestMain(m *testing.M) {
	pgtest.Main(m)
}
