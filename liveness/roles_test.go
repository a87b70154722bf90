package liveness_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/netfault"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// grantObserver gives role docs/security.md's observing grants on db.
func grantObserver(t *testing.T, db *pgtest.DB, role string) {
	t.Helper()
	db.Exec(t, fmt.Sprintf(`CREATE ROLE %[2]s LOGIN PASSWORD 'role-pw';
		GRANT CONNECT ON DATABASE %[1]s TO %[2]s;
		GRANT USAGE ON SCHEMA liveness TO %[2]s;
		GRANT SELECT ON liveness.instances, liveness.leases, liveness.schema_migrations,
		                liveness.instance_alive_locks, liveness.bigint_advisory_locks TO %[2]s;
		GRANT pg_read_all_stats TO %[2]s`, pgx.Identifier{db.Name}.Sanitize(), role))
	t.Cleanup(func() {
		// The role outlives the database otherwise (roles are the server's).
		_, _ = pgtest.Pool(t, db.DSN, 1).Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, role))
	})
}

// roleConn connects to db as role.
func roleConn(t *testing.T, db *pgtest.DB, role string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Password = role, "role-pw"
	ctx := testutil.Context(t, 10*time.Second)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestObserversCannotBendALease: a role with exactly docs/security.md's observing grants
// opens a transaction and, inside it, tries everything those grants allow on a held
// lease: every function of the schema it may execute, given the lease's name, epoch and
// holder instance (the fence, the watcher's and the stamps' functions among them), row
// locks on the leases, and table locks. Then, its transaction still open, the holder's
// renewals go on, and when the holder crashes (its links cut, its lock's backend ended)
// a competitor takes the lease once the fleet's watcher has seen it dead, well before
// the lease's ttl, as it would without the observer. Whatever the observer holds, it
// holds nothing a renewal, the watcher or a takeover waits for.
func TestObserversCannotBendALease(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	ctx := testutil.Context(t, 2*time.Minute)
	admin := pgtest.Pool(t, db.DSN, 2)
	observer := "observer_" + db.Name
	grantObserver(t, db, observer)

	proxy := netfault.NewProxy(t, db.DSN, 0)
	holderCfg := liveness.AgentConfig{Pool: pgtest.Pool(t, proxy.DSN(), 4), DirectDSN: proxy.DSN(), InstanceID: uuid.New(),
		ServiceName: "holder"}
	holder := newAgent(t, holderCfg)
	runAgent(t, holder)
	t.Cleanup(proxy.Close)
	competitor := newAgent(t, liveness.AgentConfig{Pool: pgtest.Pool(t, db.DSN, 4), DirectDSN: db.DSN, InstanceID: uuid.New(),
		ServiceName: "competitor"})
	runAgent(t, competitor)

	var wg sync.WaitGroup
	defer wg.Wait()
	electCtx, stopElect := context.WithCancel(ctx)
	defer stopElect()
	leads, takes := make(chan struct{}), make(chan struct{})
	var leadsOnce, takesOnce sync.Once
	elect := func(a *liveness.Agent, began func()) {
		wg.Go(func() {
			_ = a.Elect(electCtx, liveness.ElectorConfig{Lease: "job", OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				began()
				<-ctx.Done()
			}})
		})
	}
	elect(holder, func() { leadsOnce.Do(func() { close(leads) }) })
	select {
	case <-leads:
	case <-time.After(30 * time.Second):
		t.Fatal("the holder does not lead within 30 s")
	}
	elect(competitor, func() { takesOnce.Do(func() { close(takes) }) })
	var epoch int64
	var expires time.Time
	if err := admin.QueryRow(ctx, `SELECT epoch, expires_at FROM liveness.leases WHERE name = 'job'`).Scan(&epoch, &expires); err != nil {
		t.Fatal(err)
	}

	// The observer's transaction: everything it may do, each in a savepoint so that a
	// refusal does not end the transaction.
	obs := roleConn(t, db, observer)
	if _, err := obs.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	try := func(sql string) error {
		if _, err := obs.Exec(ctx, `SAVEPOINT attempt`); err != nil {
			t.Fatal(err)
		}
		_, err := obs.Exec(ctx, sql)
		if err != nil {
			if _, rerr := obs.Exec(ctx, `ROLLBACK TO SAVEPOINT attempt`); rerr != nil {
				t.Fatal(rerr)
			}
			return err
		}
		if _, err := obs.Exec(ctx, `RELEASE SAVEPOINT attempt`); err != nil {
			t.Fatal(err)
		}
		return nil
	}
	rows, err := admin.Query(ctx, `
		SELECT p.proname, coalesce(array_agg(format_type(a.t, NULL) ORDER BY a.n) FILTER (WHERE a.t IS NOT NULL), '{}')
		  FROM pg_proc p
		  LEFT JOIN LATERAL unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, n) ON true
		 WHERE p.pronamespace = 'liveness'::regnamespace AND p.prokind = 'f' AND p.prorettype <> 'trigger'::regtype
		   AND has_function_privilege($1, p.oid, 'EXECUTE')
		 GROUP BY p.oid, p.proname ORDER BY p.proname`, observer)
	if err != nil {
		t.Fatal(err)
	}
	type fn struct {
		name string
		args []string
	}
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn, error) {
		var f fn
		return f, r.Scan(&f.name, &f.args)
	})
	if err != nil {
		t.Fatal(err)
	}
	literal := map[string]string{
		"text": "'job'", "bigint": fmt.Sprint(epoch), "integer": "1", "uuid": "'" + holderCfg.InstanceID.String() + "'",
		"timestamp with time zone": "'infinity'", "interval": "'1 second'", "double precision": "15", "boolean": "true",
		"text[]": "'{job}'", "bigint[]": fmt.Sprintf("'{%d}'", epoch), "integer[]": "'{1}'", "oid[]": "'{1}'",
		"uuid[]": "'{" + holderCfg.InstanceID.String() + "}'",
	}
	var ran, refused []string
	tryAll := func() {
		ran, refused = nil, nil
		for _, f := range fns {
			var args []string
			for _, a := range f.args {
				l, ok := literal[a]
				if !ok {
					t.Fatalf("liveness.%s takes a %s, which this test has no value for: add one", f.name, a)
				}
				args = append(args, l+"::"+a)
			}
			call := fmt.Sprintf(`SELECT * FROM liveness.%s(%s)`, pgx.Identifier{f.name}.Sanitize(), strings.Join(args, ", "))
			if err := try(call); err != nil {
				refused = append(refused, f.name+": "+err.Error())
			} else {
				ran = append(ran, f.name)
			}
		}
		for _, sql := range []string{
			`SELECT 1 FROM liveness.leases WHERE name = 'job' FOR KEY SHARE`,
			`SELECT 1 FROM liveness.leases WHERE name = 'job' FOR SHARE`,
			`SELECT 1 FROM liveness.leases WHERE name = 'job' FOR UPDATE`,
			`LOCK TABLE liveness.leases IN ROW SHARE MODE`,
			`LOCK TABLE liveness.instances IN ROW SHARE MODE`,
		} {
			if err := try(sql); err == nil {
				t.Errorf("the observer may %s", sql)
			}
		}
		if err := try(`LOCK TABLE liveness.leases, liveness.instances IN ACCESS SHARE MODE`); err != nil {
			t.Fatalf("the observer cannot read-lock the tables: %v", err)
		}
		// Nothing written, no row locked: either would have given the transaction an id,
		// and so something for others to wait for.
		var xid *string
		if err := obs.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		if xid != nil {
			t.Fatalf("the observer's transaction wrote or locked rows (it has the id %s): what did it do of %s?", *xid,
				strings.Join(ran, ", "))
		}
	}
	tryAll()
	t.Logf("the observer ran %d functions in its open transaction: %s", len(ran), strings.Join(ran, ", "))
	t.Logf("and was refused %d: %s", len(refused), strings.Join(refused, "; "))
	for _, must := range []string{"fence", "instance_states", "stamp_alive_lock_absences", "is_instance_alive"} {
		found := false
		for _, f := range fns {
			found = found || f.name == must
		}
		if !found {
			t.Errorf("the observer may not even call %s: this test no longer tries what an observer could", must)
		}
	}

	// The renewals go on (every ttl/4, 3.75 s).
	testutil.Eventually(t, 10*time.Second, "the holder's renewal while the observer's transaction is open", func() bool {
		var at time.Time
		err := admin.QueryRow(ctx, `SELECT expires_at FROM liveness.leases WHERE name = 'job' AND epoch = $1`, epoch).Scan(&at)
		return err == nil && at.After(expires)
	})
	// The holder crashes: its links cut, its lock's backend ended.
	var lockPID int32
	if err := admin.QueryRow(ctx, `SELECT lock_pid FROM liveness.instances WHERE instance_id = $1`, holderCfg.InstanceID).Scan(&lockPID); err != nil {
		t.Fatal(err)
	}
	proxy.Freeze()
	crashed := time.Now()
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, lockPID); err != nil {
		t.Fatal(err)
	}
	// Everything again, now that there is a vanished lock to stamp and a dead holder to
	// notify: what the observer's transaction writes, if anything, it keeps.
	testutil.Eventually(t, 5*time.Second, "the lock gone from pg_locks", func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = $1`, lockPID).Scan(&n)
		return err == nil && n == 0
	})
	tryAll()
	select {
	case <-takes:
	case <-time.After(30 * time.Second):
		t.Fatal("the competitor does not take the crashed holder's lease within 30 s")
	}
	took := time.Since(crashed)
	t.Logf("the crashed holder's lease taken %s after the crash, the observer's transaction open", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("the takeover took %s; want about the lock grace and a watcher's tick (the ttl is 15 s): the observer "+
			"held back the fleet's watcher or the takeover", took)
	}
	if _, err := obs.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
}

// TestNothingInAFencedTransactionMovesItsCommitCheck: a writer role (USAGE on the schema
// and its own table, as docs/security.md's application writers have) fences its
// transaction with Lease.Fence and then tries, inside it, every statement that could
// move or disable the check of its COMMIT against the fence's deadline. Each COMMIT sent
// past that deadline is refused, or the statement itself is.
func TestNothingInAFencedTransactionMovesItsCommitCheck(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	writer := "writer_" + db.Name
	db.Exec(t, fmt.Sprintf(`CREATE ROLE %[2]s LOGIN PASSWORD 'role-pw';
		GRANT CONNECT ON DATABASE %[1]s TO %[2]s;
		GRANT USAGE ON SCHEMA liveness TO %[2]s;
		CREATE TABLE ledger (id bigserial PRIMARY KEY, note text);
		GRANT INSERT, SELECT ON ledger TO %[2]s; GRANT USAGE ON SEQUENCE ledger_id_seq TO %[2]s`,
		pgx.Identifier{db.Name}.Sanitize(), writer))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, writer))
	})
	leases := newTestLeases(t, pool)

	const (
		atCommit  = "refused at commit"
		atStmt    = "the statement refused"
		fenceFail = "the fence refused"
	)
	for _, tc := range []struct {
		name   string
		before string // statements before the fence
		after  string // statements after it
		second bool   // fence again after the statements
		want   string
	}{
		{name: "nothing", want: atCommit},
		{name: "set constraints all immediate", after: `SET CONSTRAINTS ALL IMMEDIATE`, want: atStmt},
		{name: "set constraints all immediate first", before: `SET CONSTRAINTS ALL IMMEDIATE`, want: fenceFail},
		{name: "set constraints by name", after: `SET CONSTRAINTS liveness.fence_checks_at_commit IMMEDIATE`, want: atStmt},
		{name: "set constraints by bare name", after: `SET CONSTRAINTS fence_checks_at_commit IMMEDIATE`, want: atStmt},
		{name: "set constraints all deferred", after: `SET CONSTRAINTS ALL DEFERRED`, want: atCommit},
		{name: "a savepoint rolled back", after: `SAVEPOINT s; INSERT INTO ledger (note) VALUES ('x'); ROLLBACK TO SAVEPOINT s`,
			want: atCommit},
		{name: "a savepoint released", after: `SAVEPOINT s; SET CONSTRAINTS ALL DEFERRED; RELEASE SAVEPOINT s`, want: atCommit},
		{name: "replica role", after: `SET session_replication_role = replica`, want: atStmt},
		{name: "local replica role", after: `SET LOCAL session_replication_role = replica`, want: atStmt},
		{name: "disable the trigger", after: `ALTER TABLE liveness.fence_checks DISABLE TRIGGER ALL`, want: atStmt},
		{name: "a forged commit deadline", after: `SELECT set_config('pg_liveness.commit_deadline', '%d:9000000000000000', true)`,
			want: atCommit},
		{name: "a forged signed commit deadline",
			after: `SELECT set_config('pg_liveness.commit_deadline', '%d:9000000000000000:' || encode(sha256('x'), 'hex'), true)`,
			want:  atCommit},
		{name: "a second fence", second: true, want: atCommit},
		{name: "prepare transaction", after: `PREPARE TRANSACTION 'fenced'`, want: atStmt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testutil.Context(t, time.Minute)
			le := mustAcquire(t, ctx, leases, "job-"+strings.ReplaceAll(tc.name, " ", "-"), 2*time.Second)
			conn := roleConn(t, db, writer)
			if _, err := conn.Exec(ctx, `BEGIN`); err != nil {
				t.Fatal(err)
			}
			defer func() { _, _ = conn.Exec(context.Background(), `ROLLBACK`) }()
			tx := txOn(conn)
			if tc.before != "" {
				if _, err := conn.Exec(ctx, tc.before); err != nil {
					t.Fatalf("%s: %v", tc.before, err)
				}
			}
			err := le.Fence(ctx, tx)
			// No earlier than the fence's own (renewals only move it later).
			deadline := le.FenceDeadline()
			if tc.want == fenceFail {
				if !isCode(err, "LVF04") {
					t.Fatalf("Fence after %q: %v; want SQLSTATE LVF04", tc.before, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Fence: %v", err)
			}
			// Idle past the deadline without the server ending the session meanwhile.
			if _, err := conn.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `INSERT INTO ledger (note) VALUES ($1)`, tc.name); err != nil {
				t.Fatal(err)
			}
			if tc.after != "" {
				sql := tc.after
				if strings.Contains(sql, "%d") {
					sql = fmt.Sprintf(sql, le.Epoch)
				}
				_, err := conn.Exec(ctx, sql)
				if tc.want == atStmt {
					if err == nil {
						t.Fatalf("%s inside a fenced transaction: accepted", sql)
					}
					t.Logf("%s: %v", sql, err)
					return
				}
				if err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			time.Sleep(time.Until(deadline.Add(50 * time.Millisecond))) // the server's clock: the same machine's
			if tc.second {
				if err := le.Fence(ctx, tx); err != nil {
					t.Fatalf("the second Fence: %v", err)
				}
			}
			_, err = conn.Exec(ctx, `COMMIT`)
			if !isCode(err, liveness.SQLStateCommitLate) {
				t.Fatalf("a COMMIT sent past the fence's deadline: %v; want SQLSTATE %s", err, liveness.SQLStateCommitLate)
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE note = $1`, tc.name).Scan(&n); err != nil || n != 0 {
				t.Fatalf("%d rows of the refused transaction (%v)", n, err)
			}
		})
	}
}

// txOn is a pgx.Tx over a transaction begun by hand on conn: Fence only runs statements
// on it.
func txOn(conn *pgx.Conn) pgx.Tx { return &manualTx{conn: conn} }

type manualTx struct {
	pgx.Tx
	conn *pgx.Conn
}

func (m *manualTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return m.conn.QueryRow(ctx, sql, args...)
}

func (m *manualTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return m.conn.Exec(ctx, sql, args...)
}

func isCode(err error, code string) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == code
}

// TestAFenceCallersSearchPathReachesNothingInside: the fence functions and the check at
// COMMIT (migration 0018), lease_let_go and the leases' notification triggers (0019) run
// with their owner's rights and without a SET search_path clause, so every name inside
// them carries its schema. A writer role puts a
// schema of its own first in its search_path, with operators there that would run as
// whoever calls them (and say so), and fences a held lease both ways (fence_exec in one
// implicit transaction; fence, then a COMMIT carrying a commit deadline, which the check
// verifies with more operators): none of its operators runs.
func TestAFenceCallersSearchPathReachesNothingInside(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 2)
	writer := "hijacker_" + db.Name
	db.Exec(t, fmt.Sprintf(`CREATE ROLE %[2]s LOGIN PASSWORD 'role-pw';
		GRANT CONNECT ON DATABASE %[1]s TO %[2]s;
		GRANT USAGE ON SCHEMA liveness TO %[2]s;
		CREATE SCHEMA mine AUTHORIZATION %[2]s`, pgx.Identifier{db.Name}.Sanitize(), writer))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP SCHEMA mine CASCADE; DROP OWNED BY %[1]s; DROP ROLE %[1]s`, writer))
	})
	ctx := testutil.Context(t, time.Minute)
	conn := roleConn(t, db, writer)
	var traps []string
	for _, op := range []struct{ name, left, right, result string }{
		{"=", "text", "text", "boolean"}, {"=", "bigint", "bigint", "boolean"}, {"=", "bigint", "integer", "boolean"},
		{"=", "tid", "tid", "boolean"}, {"<>", "text", "text", "boolean"}, {"~*", "text", "text", "boolean"},
		{">=", "timestamptz", "timestamptz", "boolean"}, {"<", "timestamptz", "timestamptz", "boolean"},
		{"||", "text", "text", "text"},
	} {
		fn := fmt.Sprintf("trap_%d", len(traps))
		traps = append(traps, fmt.Sprintf(`CREATE FUNCTION mine.%[1]s(%[2]s, %[3]s) RETURNS %[4]s LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'the caller''s operator %[5]s ran, as %%', current_user; END $$;
			CREATE OPERATOR mine.%[5]s (LEFTARG = %[2]s, RIGHTARG = %[3]s, FUNCTION = mine.%[1]s)`,
			fn, op.left, op.right, op.result, op.name))
	}
	for _, sql := range append(traps, `SET search_path = mine, pg_catalog`) {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// The traps work: an unqualified comparison runs the caller's operator.
	if _, err := conn.Exec(ctx, `SELECT 'a'::text = 'b'::text`); err == nil || !strings.Contains(err.Error(), "operator = ran") {
		t.Fatalf("the caller's own = on text: %v; want its trap, or this test shows nothing", err)
	}

	le := mustAcquire(t, ctx, newTestLeases(t, pool), "job", time.Minute)
	deadline := le.FenceDeadline()
	if _, err := conn.Exec(ctx, `SELECT liveness.fence_exec($1, $2, $3, $4)`, le.Name, le.Holder, le.Epoch, deadline); err != nil {
		t.Fatalf("fence_exec (and the check at its commit) under the caller's search_path: %v", err)
	}
	for _, sql := range []string{`BEGIN`, `SELECT held FROM liveness.fence($1, $2, $3, $4)`,
		`SELECT pg_catalog.set_config('pg_liveness.commit_deadline', $1 || ':1:not-signed', true)`, `COMMIT`} {
		var args []any
		switch {
		case strings.Contains(sql, "fence("):
			args = []any{le.Name, le.Holder, le.Epoch, deadline}
		case strings.Contains(sql, "commit_deadline"):
			sql = strings.Replace(sql, "$1 ||", "$1::pg_catalog.text OPERATOR(pg_catalog.||)", 1)
			args = []any{fmt.Sprint(le.Epoch)}
		}
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			_, _ = conn.Exec(context.Background(), `ROLLBACK`)
			t.Fatalf("%s under the caller's search_path: %v", sql, err)
		}
	}

	// The lease writes and their notification triggers (migration 0019), for a role that
	// may write the table as the owner's functions do.
	db.Exec(t, fmt.Sprintf(`GRANT EXECUTE ON FUNCTION liveness.lease_let_go(text, text, bigint) TO %[1]s;
		GRANT INSERT ON liveness.leases TO %[1]s; GRANT USAGE ON SEQUENCE liveness.lease_epoch_seq TO %[1]s`, writer))
	if _, err := conn.Exec(ctx, `INSERT INTO liveness.leases (name, holder, expires_at)
		VALUES ('inserted', 'not-a-token', pg_catalog.now())`); err != nil {
		t.Fatalf("an insert into leases (its trigger notifies taken:) under the caller's search_path: %v", err)
	}
	var gone int64
	if err := conn.QueryRow(ctx, `SELECT liveness.lease_let_go($1, $2, $3)`, le.Name, le.Holder, le.Epoch).Scan(&gone); err != nil || gone != 1 {
		t.Fatalf("lease_let_go (and its trigger, which notifies free: and records the end) under the caller's search_path: %d rows, %v", gone, err)
	}
	// The history's writes in those triggers (migration 0020): a release that says why,
	// and the takeovers of an expired lease and of a dead holder's.
	le = mustAcquire(t, ctx, newTestLeases(t, pool), "job", time.Minute)
	if err := conn.QueryRow(ctx, `SELECT liveness.lease_let_go($1, $2, $3) FROM pg_catalog.set_config('pg_liveness.end_reason', 'not_alive', true)`,
		le.Name, le.Holder, le.Epoch).Scan(&gone); err != nil || gone != 1 {
		t.Fatalf("a release that says why under the caller's search_path: %d rows, %v", gone, err)
	}
	dead := uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at) VALUES ($1, 'svc', now() - interval '1 hour')`, dead)
	db.Exec(t, `INSERT INTO liveness.leases (name, holder, holder_instance_id, expires_at) VALUES ('dead-holder', 'x', $1, now() + interval '1 hour')`, dead)
	db.Exec(t, fmt.Sprintf(`GRANT SELECT, UPDATE ON liveness.leases TO %[1]s`, writer))
	for _, name := range []string{"inserted", "dead-holder"} {
		if _, err := conn.Exec(ctx, `UPDATE liveness.leases SET epoch = pg_catalog.nextval('liveness.lease_epoch_seq'), taken_at = pg_catalog.now()
			WHERE name OPERATOR(pg_catalog.=) $1`, name); err != nil {
			t.Fatalf("a takeover of lease %s (its trigger records the end and the acquisition) under the caller's search_path: %v", name, err)
		}
	}
	var recorded int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM liveness.history WHERE kind = 'ended' AND (reason = 'not_alive' OR how IN ('expired', 'holder_dead'))`).Scan(&recorded); err != nil || recorded != 3 {
		t.Fatalf("%d ends recorded (%v); want the release that said why and the two takeovers", recorded, err)
	}
}
