package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/migrationstest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// A rolling upgrade: a later release has migrated the schema one version past this
// binary. When that migration still serves this binary's version, the binary runs
// normally; when it does not, the binary keeps serving as an observer, says why in
// /metrics, and writes nothing (no instance row). It never exits.
func TestOlderBinaryAgainstNewerSchema(t *testing.T) {
	latest := migrations.Latest()
	for _, tc := range []struct {
		name       string
		compatFrom int
		want       []string
	}{
		{"compatible", 1, []string{
			"pg_liveness_schema_compatible 1", "pg_liveness_agent_joined 1", "pg_liveness_agent_alive_lock_held 1",
			fmt.Sprintf("pg_liveness_schema_compatible_from %d", 1),
		}},
		{"incompatible", latest + 1, []string{
			"pg_liveness_schema_compatible 0", "pg_liveness_agent_joined 0", "pg_liveness_up 1",
			fmt.Sprintf("pg_liveness_schema_compatible_from %d", latest+1),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := pgtest.NewDB(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := migrationstest.Future(t, tc.compatFrom).Apply(ctx, db.Pool(t, 1), "liveness"); err != nil {
				t.Fatal(err)
			}
			const id = "5d0c3a8e-6f1b-4e8a-9d55-0b7c2f4e1a99"
			p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--agent.instance-id="+id,
				"--agent.heartbeat-interval=300ms", "--agent.heartbeat-slow-interval=600ms",
				"--agent.stale-threshold=2s", "--agent.definitive-dead-cutoff=5s")
			p.waitFor(t, `(?m)^`+tc.want[0]+`$`, 30*time.Second)
			if tc.compatFrom > latest {
				time.Sleep(2 * time.Second) // the agent would have beaten by now
			}
			body := p.waitFor(t, `(?m)^`+tc.want[1]+`$`, 30*time.Second)
			for _, want := range append(tc.want, fmt.Sprintf("pg_liveness_schema_version %d", latest+1),
				fmt.Sprintf("pg_liveness_schema_binary_version %d", latest)) {
				if !strings.Contains(body, want+"\n") {
					t.Errorf("no %q in /metrics", want)
				}
			}
			var rows int
			if err := db.Conn(t).QueryRow(ctx, `SELECT count(*) FROM liveness.instances WHERE instance_id = $1`, id).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 1, false: 0}[tc.compatFrom <= latest]; rows != want {
				t.Errorf("%d instance rows for the agent, want %d", rows, want)
			}
			select {
			case <-p.done:
				t.Fatalf("the exporter exited with %d", p.code)
			default:
			}
			if tc.compatFrom > latest && !strings.Contains(p.Logs(), "upgrade pg_liveness_exporter") {
				t.Errorf("no log line says to upgrade:\n%s", p.Logs())
			}
			if t.Failed() {
				t.Logf("/metrics:\n%s", body)
			}
		})
	}
}
