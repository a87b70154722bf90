package store_test

import (
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
