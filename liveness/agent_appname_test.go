package liveness_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// A direct DSN's application_name does not name the alive lock's session: the library
// names it after the service and the role, a bounded label of the exporter's metrics
// (an instance's name would not be), and one line says so; it replaced it silently.
func TestDirectDSNApplicationNameReplacedIsSaidOnce(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 2)
	said := func(logs *logbuf.Buffer) (lines []string) {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "dsn_application_name") {
				lines = append(lines, line)
			}
		}
		return lines
	}
	logger, logs := logbuf.Logger()
	a := newAgent(t, liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN + " application_name=worker-7f3a", InstanceID: uuid.New(),
		ServiceName: "billing", Logger: logger})
	runAgent(t, a)
	testutil.Eventually(t, 10*time.Second, "the lock's session named after the service", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'billing:alive-lock'`) == 1
	})
	if lines := said(logs); len(lines) != 1 || !strings.Contains(lines[0], "application_name=billing:alive-lock") ||
		!strings.Contains(lines[0], "dsn_application_name=worker-7f3a") {
		t.Errorf("lines about the DSN's application_name: %q; want one naming both", lines)
	}

	logger, logs = logbuf.Logger()
	newAgent(t, liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "billing", Logger: logger})
	if lines := said(logs); len(lines) != 0 {
		t.Errorf("lines about an application_name the DSN does not set: %q", lines)
	}
}
