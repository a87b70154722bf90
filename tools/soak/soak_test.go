package soak

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/binaries"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/netns"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/wait"
)

var (
	durationFlag   = flag.Duration("soak.duration", 2*time.Minute, "how long the fleet runs under the nemesis")
	seedFlag       = flag.Uint64("soak.seed", SeedForTests, "the schedule's seed; the same seed replays it")
	reportFlag     = flag.String("soak.report", "", "write the soak's section of the failover report (Markdown) into this file")
	historyFlag    = flag.String("soak.history-dir", "", "folder of the history file (default: the temporary folder); kept only when a check fails")
	keepFlag       = flag.Bool("soak.keep-history", false, "keep the history file even when every check passes, to study a run")
	recheckFlag    = flag.String("soak.check", "", "check this kept history again instead of running the fleet (with -soak.report, -soak.seed and -soak.duration: its section)")
	recheckFleet   = flag.String("soak.check-fleet", "as in the run", "with -soak.check: the fleet, as the run's section stated it")
	recheckMachine = flag.String("soak.check-machine", "", "with -soak.check: the machine, as the run's section stated it")
	recheckRev     = flag.String("soak.check-revision", "", "with -soak.check: the source revision the run was built from")
)

const schema = "liveness"

// rulesFile is the alert rule file the project ships, loaded unchanged.
const rulesFile = "../../alerts/pg_liveness.rules.yml"

// The binaries TestMain builds: the exporter and the faultagent.
var bins binaries.Built

func TestMain(m *testing.M) { binaries.Main(m, "pg_liveness_soak_bin_", &bins, nil) }

// agentDefaults reads the exporter's agent flags and their defaults from its --help: the
// fleet runs at the defaults the binary ships.
func agentDefaults(t *testing.T) (flags []string, stale time.Duration) {
	d, err := bins.AgentDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range binaries.AgentFlags {
		flags = append(flags, "--"+name+"="+d[name])
	}
	if stale, err = time.ParseDuration(d["agent.stale-threshold"]); err != nil {
		t.Fatalf("--agent.stale-threshold=%s: %v", d["agent.stale-threshold"], err)
	}
	return flags, stale
}

// cluster is the primary and its replica; the nemesis's faults act on the current primary.
type cluster struct {
	mu       sync.Mutex
	primary  *pgtest.Server
	replica  *pgtest.Server
	promoted bool
	db       string
}

func (c *cluster) current() *pgtest.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.primary
}

// exec runs statements on the current primary as the superuser, in a session that may
// write even while the database is read-only.
func (c *cluster) exec(ctx context.Context, sqls ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.current().AdminDSN(c.db)+" default_transaction_read_only=off")
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, q := range sqls {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// TestSoak runs the fleet under the nemesis for -soak.duration, checks the history and,
// with -soak.report, writes the report section.
func TestSoak(t *testing.T) {
	if *recheckFlag != "" {
		recheck(t, *recheckFlag)
		return
	}
	if os.Geteuid() != 0 {
		t.Fatal(netns.RootHint)
	}
	d, seed := *durationFlag, *seedFlag
	rev := revision() // at the start: the source the binaries were built from
	if d < Warmup+Quiet()+30*time.Second {
		t.Fatalf("-soak.duration=%s: at least %s (warm-up %s, quiet end %s, and time for faults)", d, Warmup+Quiet()+30*time.Second, Warmup, Quiet())
	}
	// SIGINT or SIGTERM ends the run early: faults healed, servers, processes and
	// namespaces removed by the cleanups, the history kept.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	dir := *historyFlag
	if dir == "" {
		dir = os.TempDir()
	}
	histPath := filepath.Join(dir, fmt.Sprintf("pg_liveness_soak_%d_%s.jsonl", seed, time.Now().UTC().Format("20060102T150405")))
	h, err := NewHistory(histPath)
	if err != nil {
		t.Fatalf("-soak.history-dir: %v", err)
	}
	keep := true
	defer func() {
		_ = h.Close()
		if !keep {
			_ = os.Remove(histPath)
			_ = os.Remove(ProcessLogPath(histPath))
		}
	}()

	// Namespaces: two lease competitors and one exporter agent.
	var spaces []*netns.Namespace
	for range 3 {
		ns, err := netns.Create("plsoak")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ns.Remove)
		spaces = append(spaces, ns)
	}
	listen := "127.0.0.1"
	for _, ns := range spaces {
		listen += "," + ns.HostIP
	}
	// Commits survive an immediate shutdown, as in production.
	primary := pgtest.NewServer(t, pgtest.WithSetting("synchronous_commit", "on"), pgtest.WithSetting("listen_addresses", listen))
	for _, ns := range spaces {
		if err := primary.AllowHost(ns.CIDR); err != nil {
			t.Fatalf("pg_hba: %v", err)
		}
	}
	db := pgtest.NewDBOn(t, primary)
	prepare(t, db.DSN)
	replica, err := pgtest.StartReplica(primary, pgtest.WithSetting("synchronous_commit", "on"), pgtest.WithSetting("listen_addresses", listen))
	if err != nil {
		t.Fatalf("replica: %v", err)
	}
	t.Cleanup(replica.Close)
	cl := &cluster{primary: primary, replica: replica, db: db.Name}
	dsnVia := func(host, app string) string {
		return fmt.Sprintf("host=%s,%s port=%d,%d user=%s password=%s dbname=%s sslmode=disable target_session_attrs=read-write connect_timeout=2 application_name=%s",
			host, host, primary.Port, replica.Port, pgtest.Superuser, primary.Password, db.Name, app)
	}

	defaults, stale := agentDefaults(t)
	// The node agent's socket, and the proxies' way to the current primary.
	socket := filepath.Join(t.TempDir(), "node.sock")
	primaryAddr := func() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(cl.current().Port)) }
	var members []*member
	byName := map[string]*member{}
	add := func(m *member) { m.h, m.t = h, t; members = append(members, m); byName[m.name] = m }
	for l := range leases {
		for k := range competitorsPerJob {
			m := &member{name: fmt.Sprintf("fa-%d-%d", l, k), lease: fmt.Sprintf("soak-%d", l)}
			if k == 0 && l < 2 {
				m.ns = spaces[l]
			}
			var extra []string
			if k < shardMembersPerJob {
				m.set = shardSetName
				extra = []string{"--shards.set=" + m.set, "--shards.count=" + fmt.Sprint(shardCount), "--shards.write-every=" + shardWriteEvery.String()}
			}
			m.addr = metricsAddr(t, m.ns)
			host := "127.0.0.1"
			if m.ns != nil {
				host = m.ns.HostIP
			}
			dsn := dsnVia(host, m.name)
			switch {
			case slices.Contains(attachedNames, m.name):
				m.node = nodeAgentName
				extra = append(extra, "--node-agent.socket="+socket)
			case m.ns == nil:
				m.proxy = newLockProxy(t, primaryAddr)
				extra = append(extra, fmt.Sprintf("--direct-dsn=host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable "+
					"target_session_attrs=read-write connect_timeout=2 application_name=%s",
					m.proxy.port(), pgtest.Superuser, primary.Password, db.Name, m.name))
			}
			m.argv = func(uuid.UUID) []string {
				return append([]string{bins.Agent, "--dsn=" + dsn, "--schema=" + schema, "--service=" + m.name,
					"--lease=" + m.lease, "--lease.write-every=" + writeEvery.String(), "--fence-table=" + ledgerTable,
					"--lease.tx-every=" + fmt.Sprint(txEvery),
					"--busy-for=" + PoolBusyFor.String(), "--web.listen-address=" + m.addr,
					// A killed agent is restarted when its time is up, database or not, as a
					// supervisor would; with the library's default it would stop for good
					// if the database happens to be away then.
					"--agent.wait-for-schema"}, append(extra, defaults...)...)
			}
			add(m)
		}
	}
	for k := range exporterAgents {
		m := &member{name: fmt.Sprintf("ex-%d", k), exp: true}
		if k == 0 {
			m.ns = spaces[2]
		}
		m.addr = metricsAddr(t, m.ns)
		host := "127.0.0.1"
		if m.ns != nil {
			host = m.ns.HostIP
		}
		dsn := dsnVia(host, m.name)
		var extra []string
		if m.name == nodeAgentName {
			extra = []string{"--node-agent.socket=" + socket}
		}
		m.argv = func(id uuid.UUID) []string {
			return append(append([]string{bins.Exporter, "--web.listen-address=" + m.addr, "--db.dsn=" + dsn, "--db.schema=" + schema,
				"--agent.instance-id=" + id.String(), "--agent.service-name=" + m.name, "--log.level=warn"}, extra...), defaults...)
		}
		add(m)
	}
	// The node agent first, so that its processes attach to it from their start.
	slices.SortStableFunc(members, func(a, b *member) int { return cmpBool(b.name == nodeAgentName, a.name == nodeAgentName) })
	for _, m := range members {
		if err := m.start(); err != nil {
			t.Fatal(err)
		}
		if m.name == nodeAgentName {
			if err := waitNodeAgent(cl, m.name); err != nil {
				t.Fatal(err)
			}
		}
	}

	// The observer: the exporter as an operator runs it, scraped by Prometheus with the
	// shipped rules, beside every agent's own /metrics.
	const observerApp = "soak-observer"
	obsAddr := metricsAddr(t, nil)
	obs := proctest.Start(t, "observer", proctest.Options{}, bins.Exporter, "--no-agent", "--web.listen-address="+obsAddr,
		"--db.dsn="+dsnVia("127.0.0.1", observerApp), "--db.schema="+schema, "--log.level=warn")
	obs.WaitReady(t, "http://"+obsAddr+"/metrics", 30*time.Second)
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	targets := []string{obsAddr}
	for _, m := range members {
		targets = append(targets, m.addr)
	}
	prom := proctest.StartPrometheus(t, map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"rule_files": []string{rules},
		"scrape_configs": []any{map[string]any{
			"job_name": "pg_liveness", "static_configs": []any{map[string]any{"targets": targets}},
		}},
	}, "--log.level=warn")

	// The samplers run until the run ends; each has this one owner.
	sctx, stopSampling := context.WithCancel(context.Background())
	var samplers sync.WaitGroup
	var failMu sync.Mutex
	var samplerFailures []string
	failed := func(s string) {
		failMu.Lock()
		defer failMu.Unlock()
		if len(samplerFailures) < 10 && !strings.Contains(strings.Join(samplerFailures, "\n"), s) {
			samplerFailures = append(samplerFailures, s)
		}
	}
	ch := newChanges(h)
	var killedMu sync.Mutex
	recentlyKilled := map[string]time.Time{}
	ids := func() []string {
		var out []string
		for _, m := range members {
			if _, inst := m.current(); inst != "" {
				out = append(out, inst)
			}
		}
		killedMu.Lock()
		defer killedMu.Unlock()
		for inst, at := range recentlyKilled {
			if time.Since(at) > time.Minute {
				delete(recentlyKilled, inst)
				continue
			}
			out = append(out, inst)
		}
		return out
	}
	var services []string
	for _, m := range members {
		services = append(services, m.name)
	}
	samplerDSN := dsnVia("127.0.0.1", "soak-sampler")
	samplers.Go(func() { sampleSQL(sctx, samplerDSN, schema, stale, ids, ch, failed) })
	samplers.Go(func() { sampleExporter(sctx, "http://"+obsAddr+"/metrics", services, ch, failed) })
	samplers.Go(func() { sampleAlerts(sctx, prom.Addr, ch) })
	samplers.Go(func() { sampleReader(sctx, dsnVia("127.0.0.1", "soak-sampler"), ids, ch, failed) })
	samplers.Go(func() {
		if wait.Sleep(sctx, Warmup) { // the observer's start-up is not growth
			sampleResources(sctx, "http://"+obsAddr+"/metrics", samplerDSN, observerApp, h)
		}
	})

	fleet := Fleet{Failover: true, Competitors: map[string][]string{}, NodeAgent: nodeAgentName, Attached: attachedNames}
	for _, m := range members {
		fleet.Procs = append(fleet.Procs, m.name)
		if m.ns != nil {
			fleet.Netns = append(fleet.Netns, m.name)
		}
		if !m.exp {
			fleet.Pools = append(fleet.Pools, m.name)
			fleet.Competitors[m.lease] = append(fleet.Competitors[m.lease], m.name)
		}
		if m.proxy != nil {
			fleet.Proxied = append(fleet.Proxied, m.name)
		}
	}
	sort.Strings(fleet.Procs)
	sort.Strings(fleet.Netns)
	if want := soakFleet(); !reflect.DeepEqual(fleet, want) {
		t.Fatalf("the fleet started is %+v; soakFleet, which the schedule's tests draw from, says %+v", fleet, want)
	}
	schedule := NewSchedule(seed, d, fleet)
	// Printed, not only logged: the seed is what replays a failing run.
	fmt.Printf("soak: seed %d, %s, %d faults (replay: make soak SOAK_SEED=%d SOAK_DURATION=%s); history %s\n%s",
		seed, d, len(schedule), seed, d, histPath, Describe(schedule))

	n := &nemesis{t: t, h: h, ch: ch, cl: cl, byName: byName, killed: func(inst string) {
		killedMu.Lock()
		recentlyKilled[inst] = time.Now()
		killedMu.Unlock()
	}}
	t0 := time.Now()
	var faults sync.WaitGroup
	for _, f := range schedule {
		faults.Go(func() { n.run(ctx, t0, f) })
	}
	interrupted := !wait.Sleep(ctx, time.Until(t0.Add(d)))
	faults.Wait()
	ran := time.Since(t0)
	for _, m := range members {
		m.endRun()
	}
	if interrupted {
		h.Add(Event{Kind: EvInterrupt})
	}
	h.Add(Event{Kind: EvRunEnd})
	stopSampling()
	samplers.Wait()
	readLedger(t, cl, h)

	results := Check(h.Events())
	sum := Summary{Generated: time.Now(), Revision: rev, Machine: machine(cl), Seed: seed, Requested: d, Ran: ran,
		Interrupted: interrupted, Applied: n.applied(), Overlapping: n.overlapping(h.Events()), Results: results,
		Fleet: fmt.Sprintf("%d agents: %d faultagent processes (the liveness library: Agent, Elect on %d leases, %d competitors each, fenced ledger rows every %s, one write in %d a transaction of two rows; %d of them, %d competitors of each lease, also members of a shard set of %d shards, Agent.Shards, each owner writing fenced rows every %s, one write in %d a transaction of two rows) and %d exporter binaries as agents, one of them also the node agent (--node-agent.socket) of %d faultagents (%s); %d faultagents' alive-lock sessions through a proxy that can hold them (late_close); %d agents in network namespaces; an observer exporter scraped with every agent by Prometheus with the shipped rules; PostgreSQL %s primary with a streaming replica; agent defaults as the exporter ships them; the lease rows recorded by a trigger of the soak's",
			len(members), leases*competitorsPerJob, leases, competitorsPerJob, writeEvery, txEvery, leases*shardMembersPerJob, shardMembersPerJob,
			shardCount, shardWriteEvery, txEvery, exporterAgents, len(attachedNames), strings.Join(attachedNames, ", "), len(fleet.Proxied), len(fleet.Netns), pgVersion(cl))}
	failing := sum.Violations() > 0 || interrupted || len(samplerFailures) > 0
	keep = failing || *keepFlag
	if keep {
		sum.History = histPath
	}
	for _, r := range results {
		t.Logf("%-80s cases %4d, not measured %3d, violations %d: %s", r.Name, r.Cases, r.NotMeasured, len(r.Violations), r.Detail)
		for _, v := range r.Violations {
			t.Errorf("%s: %s", r.Name, v)
		}
	}
	for _, f := range samplerFailures {
		t.Errorf("sampler: %s", f)
	}
	if interrupted {
		t.Errorf("interrupted after %s", ran.Round(time.Second))
	}
	if *reportFlag != "" {
		if err := WriteSection(*reportFlag, sum); err != nil {
			t.Errorf("-soak.report: %v", err)
		}
	}
	if keep {
		t.Logf("history kept: %s (seed %d), the processes' log lines in %s", histPath, seed, ProcessLogPath(histPath))
	}
}

// recheck runs the checks over a kept history.
func recheck(t *testing.T, path string) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("-soak.check: %v", err)
	}
	defer f.Close()
	events, err := ReadHistory(f)
	if err != nil {
		t.Fatalf("-soak.check: %v", err)
	}
	results := Check(events)
	for _, r := range results {
		t.Logf("%-80s cases %4d, not measured %3d, violations %d: %s", r.Name, r.Cases, r.NotMeasured, len(r.Violations), r.Detail)
		for _, v := range r.Violations {
			t.Errorf("%s: %s", r.Name, v)
		}
	}
	if *reportFlag == "" || len(events) == 0 {
		return
	}
	// The section of a kept history checked again (by a newer checker): what the run
	// itself knew (the seed, the length asked for, the fleet, the machine) comes from
	// the flags and the section it wrote, which this one replaces.
	applied := map[string]int{}
	var ends []int64
	for _, e := range events {
		switch e.Kind {
		case EvFault:
			applied[e.Fault]++
		case EvRunEnd:
			ends = append(ends, e.T)
		}
	}
	first, last := events[0].T, events[len(events)-1].T
	if len(ends) > 0 {
		last = ends[0]
	}
	n := &nemesis{}
	sum := Summary{Generated: time.Unix(0, last), Revision: *recheckRev, Machine: *recheckMachine, Seed: *seedFlag, Requested: *durationFlag,
		Ran: time.Duration(last - first), Applied: applied, Overlapping: n.overlapping(events), Results: results, History: path,
		Fleet: *recheckFleet, Note: fmt.Sprintf("Checks run again over the kept history (`-soak.check`) by the checker at %s; the run itself ended %s.",
			revision(), time.Unix(0, last).UTC().Format("2006-01-02 15:04 MST"))}
	if err := WriteSection(*reportFlag, sum); err != nil {
		t.Errorf("-soak.report: %v", err)
	}
}

// waitNodeAgent waits until the node agent's session is open.
func waitNodeAgent(cl *cluster, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		var n int
		conn, err := pgx.Connect(ctx, cl.current().AdminDSN(cl.db))
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, name+":node-agent").Scan(&n)
			conn.Close(context.Background())
		}
		if err == nil && n == 1 {
			return nil
		}
		if !wait.Sleep(ctx, 100*time.Millisecond) {
			return fmt.Errorf("the node agent %s: no session of it within 60 s (last error: %v)", name, err)
		}
	}
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// prepare applies the migrations and creates the ledger the jobs append to.
func prepare(t *testing.T, dsn string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := migrations.Apply(ctx, conn, schema); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	// A row is accepted when its transaction commits, not when it is inserted: a
	// deferred trigger stamps committed_at during the COMMIT (after the fence's own check
	// at commit, queued earlier), so that a transaction whose COMMIT lands after its
	// writer was told counts as a write after it.
	if _, err := conn.Exec(ctx, `CREATE TABLE `+ledgerTable+` (
		id bigserial PRIMARY KEY, lease text NOT NULL, epoch bigint NOT NULL,
		writer text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp(), committed_at timestamptz,
		began_at timestamptz NOT NULL DEFAULT now());
		CREATE FUNCTION ledger_committed() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			UPDATE `+ledgerTable+` SET committed_at = clock_timestamp() WHERE id = NEW.id;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER ledger_committed AFTER INSERT ON `+ledgerTable+`
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ledger_committed()`); err != nil {
		t.Fatalf("ledger: %v", err)
	}
	// The database's own record of the leases (the checker's lease rows): each insert,
	// update and delete of a row, in the transaction that made it, with the server's
	// clock. The soak's, not the schema's: a trigger that writes another table takes no
	// lock on the leases' rows, so the library's statements behave as without it.
	if _, err := conn.Exec(ctx, `CREATE TABLE `+leaseRowsTable+` (
		id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(), op text NOT NULL,
		name text NOT NULL, epoch bigint NOT NULL, taken_at timestamptz NOT NULL, expires_at timestamptz NOT NULL);
		CREATE FUNCTION soak_lease_row() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF TG_OP = 'DELETE' THEN
				INSERT INTO `+leaseRowsTable+` (op, name, epoch, taken_at, expires_at)
				VALUES ('delete', OLD.name, OLD.epoch, OLD.taken_at, OLD.expires_at);
			ELSE
				INSERT INTO `+leaseRowsTable+` (op, name, epoch, taken_at, expires_at)
				VALUES (lower(TG_OP), NEW.name, NEW.epoch, NEW.taken_at, NEW.expires_at);
			END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER soak_lease_row AFTER INSERT OR UPDATE OR DELETE ON `+schema+`.leases
			FOR EACH ROW EXECUTE FUNCTION soak_lease_row()`); err != nil {
		t.Fatalf("lease rows: %v", err)
	}
}

// leaseRowsTable is the soak's record of the leases table's changes.
const leaseRowsTable = "public.soak_lease_rows"

// readLedger adds every accepted ledger row, and every recorded change of a lease's or a
// shard's row, to the history.
func readLedger(t *testing.T, cl *cluster, h *History) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, cl.current().AdminDSN(cl.db))
	if err != nil {
		t.Fatalf("ledger: %v", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT id, lease, epoch, writer, committed_at, began_at FROM `+ledgerTable+` ORDER BY id`)
	if err != nil {
		t.Fatalf("ledger: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e Event
		var at, began time.Time
		if err := rows.Scan(&e.ID, &e.Lease, &e.Epoch, &e.Inst, &at, &began); err != nil {
			t.Fatalf("ledger: %v", err)
		}
		e.Kind, e.T, e.From = EvLedger, at.UnixNano(), began.UnixNano()
		h.Add(e)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("ledger: %v", err)
	}
	rows, err = conn.Query(ctx, `SELECT at, op, name, epoch, taken_at, expires_at FROM `+leaseRowsTable+`
		WHERE name LIKE 'soak-%' OR name ~ ('^'||$1||'/[0-9]+$') ORDER BY id`, shardSetName)
	if err != nil {
		t.Fatalf("lease rows: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		e := Event{Kind: EvLeaseRow}
		var at, taken, exp time.Time
		if err := rows.Scan(&at, &e.Note, &e.Lease, &e.Epoch, &taken, &exp); err != nil {
			t.Fatalf("lease rows: %v", err)
		}
		e.T, e.Taken, e.Exp = at.UnixNano(), taken.UnixNano(), exp.UnixNano()
		h.Add(e)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("lease rows: %v", err)
	}
	rows, err = conn.Query(ctx, `SELECT at, kind, lease_name, epoch, coalesce(instance_id::text, ''), coalesce(how, ''), since
		FROM `+schema+`.history
		WHERE kind IN ('acquired', 'ended') AND (lease_name LIKE 'soak-%' OR lease_name ~ ('^'||$1||'/[0-9]+$')) ORDER BY id`, shardSetName)
	if err != nil {
		t.Fatalf("history: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		e := Event{Kind: EvDBHistory}
		var at time.Time
		var since *time.Time
		if err := rows.Scan(&at, &e.Note, &e.Lease, &e.Epoch, &e.Inst, &e.Name, &since); err != nil {
			t.Fatalf("history: %v", err)
		}
		e.T = at.UnixNano()
		if since != nil {
			e.Prev = since.UnixNano()
		}
		h.Add(e)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("history: %v", err)
	}
}

// nemesis applies and heals the schedule's faults.
type nemesis struct {
	t      *testing.T
	h      *History
	ch     *changes
	cl     *cluster
	byName map[string]*member
	killed func(inst string)

	mu      sync.Mutex
	count   map[string]int
	busy    map[string]bool // processes under a process fault
	stopped map[string]bool // processes stopped (SIGSTOP) now: terminations spare their lock

	// dbMu is held by a database fault from when it is applied to its heal: the schedule
	// keeps them apart, and this keeps a failover that waits for its replica apart too.
	dbMu sync.Mutex
}

// claim marks a process as under a fault; false when it already is.
func (n *nemesis) claim(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.busy == nil {
		n.busy = map[string]bool{}
	}
	if n.busy[name] {
		return false
	}
	n.busy[name] = true
	return true
}

func (n *nemesis) release(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.busy, name)
}

func (n *nemesis) setStopped(name string, stopped bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped == nil {
		n.stopped = map[string]bool{}
	}
	n.stopped[name] = stopped
}

func (n *nemesis) isStopped(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stopped[name]
}

// holder is the member inside lease's job (any lease's: AnyLease) now among those ok
// accepts, if any.
func (n *nemesis) holder(lease string, ok func(*member) bool) *member {
	for _, m := range n.competitors(lease) {
		if ok(m) && m.inJob() {
			return m
		}
	}
	return nil
}

// competitors are lease's competitors (every lease's: AnyLease), by name.
func (n *nemesis) competitors(lease string) []*member {
	var out []*member
	for _, m := range n.byName {
		if m.lease != "" && (m.lease == lease || lease == AnyLease) {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func (n *nemesis) applied() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]int{}
	for k, v := range n.count {
		out[k] = v
	}
	return out
}

// overlapping counts the faults applied while another was applied.
func (n *nemesis) overlapping(events []Event) int {
	active := map[int]bool{}
	count := 0
	for _, e := range events {
		switch e.Kind {
		case EvFault:
			if len(active) > 0 {
				count++
			}
			active[e.FaultID] = true
		case EvHeal:
			delete(active, e.FaultID)
		}
	}
	return count
}

// run waits for f's time, applies it, waits its length and heals it; an interrupted run
// heals at once, and applies nothing more. Each fault is recorded before it acts, and
// each heal after; after a heal, every verdict is recorded afresh from the next sample.
func (n *nemesis) run(ctx context.Context, t0 time.Time, f Fault) {
	if !wait.Sleep(ctx, time.Until(t0.Add(f.At))) {
		return
	}
	targets := []string{f.Target}
	if databaseFault[f.Kind] {
		targets = []string{AllProcs}
	}
	m := n.byName[f.Target]
	if lease, ok := strings.CutPrefix(f.Target, HolderPrefix); ok {
		// Among those it may take: a late close, the competitors behind a proxy.
		may := func(c *member) bool { return f.Kind != FaultLateClose || c.proxy != nil }
		for deadline := time.Now().Add(HolderWait); ; {
			if m = n.holder(lease, may); m != nil || time.Now().After(deadline) || !wait.Sleep(ctx, 20*time.Millisecond) {
				break
			}
		}
		if m == nil {
			var cands []*member
			for _, c := range n.competitors(lease) {
				if may(c) {
					cands = append(cands, c)
				}
			}
			if len(cands) == 0 {
				n.t.Logf("fault %s: no competitor of %s to take, skipped", f, lease)
				return
			}
			m = cands[f.Pick%uint64(len(cands))]
			n.t.Logf("fault %s: nobody held %s for %s; %s instead", f, lease, HolderWait, m.name)
		}
		targets = []string{m.name}
	}
	// A process takes one process fault at a time (the schedule keeps them apart; this
	// is the last guard).
	switch f.Kind {
	case FaultKill, FaultStop, FaultPoolExhaustion, FaultLateClose, FaultNodeRestart:
		if !n.claim(m.name) {
			n.t.Logf("fault %s: %s is under another fault, skipped", f, m.name)
			return
		}
		defer n.release(m.name)
	}
	fault := func(tg []string) {
		n.h.Add(Event{Kind: EvFault, Fault: f.Kind, FaultID: f.ID, Targets: tg})
		n.mu.Lock()
		if n.count == nil {
			n.count = map[string]int{}
		}
		n.count[f.Kind]++
		n.mu.Unlock()
	}
	heal := func(tg []string) {
		at := time.Now().UnixNano()
		n.h.Add(Event{T: at, Kind: EvHeal, Fault: f.Kind, FaultID: f.ID, Targets: tg})
		n.ch.resample(at)
	}
	hold := func() { wait.Sleep(ctx, f.For) }
	if databaseFault[f.Kind] {
		n.dbMu.Lock()
		defer n.dbMu.Unlock()
	}
	switch f.Kind {
	case FaultKill:
		p, inst := m.current()
		if p == nil || !p.Running() {
			n.t.Logf("fault %s: %s not running, skipped", f, m.name)
			return
		}
		fault(targets)
		m.kill()
		n.killed(inst)
		hold()
		heal(targets)
		if err := m.start(); err != nil {
			n.t.Errorf("fault %s: restart: %v", f, err)
		}
	case FaultNodeRestart:
		p, inst := m.current()
		if p == nil || !p.Running() {
			n.t.Logf("fault %s: %s not running, skipped", f, m.name)
			return
		}
		fault(targets)
		m.stop()
		n.killed(inst)
		hold()
		heal(targets)
		if err := m.start(); err != nil {
			n.t.Errorf("fault %s: restart: %v", f, err)
		}
	case FaultStop:
		fault(targets)
		n.setStopped(m.name, true)
		if !m.signal(syscall.SIGSTOP) {
			n.t.Logf("fault %s: %s not running", f, m.name)
		}
		hold()
		m.signal(syscall.SIGCONT)
		n.setStopped(m.name, false)
		heal(targets)
	case FaultLinkDown, FaultBlip:
		fault(targets)
		if err := m.ns.Cut(); err != nil {
			n.t.Errorf("fault %s: %v", f, err)
		}
		hold()
		if err := m.ns.Heal(); err != nil {
			n.t.Errorf("fault %s: heal: %v", f, err)
		}
		heal(targets)
	case FaultPoolExhaustion:
		fault(targets)
		m.signal(syscall.SIGUSR1)
		hold()
		heal(targets)
	case FaultLateClose:
		// The lock's session frozen at its proxy, its backend ended: the server lets the
		// lock go at once (and the fleet may call the process dead a lock grace later),
		// while the end of the session reaches the process only when the proxy delivers
		// what it held, For later.
		fault(targets)
		m.proxy.freeze()
		if err := n.cl.exec(context.Background(), fmt.Sprintf(
			"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
			quoteLiteral(m.name+":alive-lock"))); err != nil {
			n.t.Logf("fault %s: %v", f, err)
		}
		hold()
		m.proxy.thaw()
		heal(targets)
	case FaultRestartFast, FaultRestartImmediate:
		srv := n.cl.current()
		fault(targets)
		mode := map[string]string{FaultRestartFast: "fast", FaultRestartImmediate: "immediate"}[f.Kind]
		if err := srv.StopMode(mode); err != nil {
			n.t.Errorf("fault %s: %v", f, err)
		}
		hold()
		if err := srv.Start(); err != nil {
			n.t.Errorf("fault %s: start: %v", f, err)
		}
		heal(targets)
	case FaultFailover:
		n.cl.mu.Lock()
		old, next := n.cl.primary, n.cl.replica
		n.cl.mu.Unlock()
		if next == nil {
			return
		}
		// A failover that loses nothing the primary committed, as the checks assume (a
		// lease's takeover lost with it would let its old holder lead again for a while):
		// the replica streaming when the primary stops, since a fast shutdown sends a
		// connected standby all its WAL before it exits. Right after a restart of the
		// primary the replica reconnects only after wal_retrieve_retry_interval (5 s); a
		// promotion then lost every commit since the restart (seed 4139).
		written, err := waitStreaming(ctx, old, n.cl.db)
		if err != nil {
			if ctx.Err() == nil {
				n.t.Errorf("fault %s: %v", f, err)
			}
			return
		}
		fault(targets)
		old.Stop()
		pctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = next.Promote(pctx)
		if err == nil {
			err = replayedTo(pctx, next, n.cl.db, written)
		}
		cancel()
		if err != nil {
			n.t.Errorf("fault %s: promote: %v", f, err)
		}
		n.cl.mu.Lock()
		n.cl.primary, n.cl.replica, n.cl.promoted = next, nil, true
		n.cl.mu.Unlock()
		heal(targets)
	case FaultReadOnly:
		fault(targets)
		if err := n.cl.exec(context.Background(), "ALTER SYSTEM SET default_transaction_read_only = on", "SELECT pg_reload_conf()"); err != nil {
			n.t.Errorf("fault %s: %v", f, err)
		}
		hold()
		if err := n.cl.exec(context.Background(), "ALTER SYSTEM RESET default_transaction_read_only", "SELECT pg_reload_conf()"); err != nil {
			n.t.Errorf("fault %s: heal: %v", f, err)
		}
		heal(targets)
	case FaultTerminate:
		if err := n.terminate(f, fault, heal); err != nil {
			n.t.Logf("fault %s: %v", f, err) // the database may be away: another fault
		}
	}
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// streamingWait bounds how long a failover waits for its replica to stream.
const streamingWait = 30 * time.Second

// waitStreaming waits until primary streams to a standby, and returns the WAL position
// it had written then.
func waitStreaming(ctx context.Context, primary *pgtest.Server, db string) (string, error) {
	deadline := time.Now().Add(streamingWait)
	var last error
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var lsn string
		var streaming bool
		conn, err := pgx.Connect(qctx, primary.AdminDSN(db))
		if err == nil {
			err = conn.QueryRow(qctx, `SELECT pg_current_wal_lsn()::text,
				EXISTS (SELECT 1 FROM pg_stat_replication WHERE state = 'streaming')`).Scan(&lsn, &streaming)
			conn.Close(context.Background())
		}
		cancel()
		switch {
		case err == nil && streaming:
			return lsn, nil
		case err != nil:
			last = err
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the replica did not stream within %s (last error: %v)", streamingWait, last)
		}
		if !wait.Sleep(ctx, 100*time.Millisecond) {
			return "", ctx.Err()
		}
	}
}

// replayedTo checks that a promoted replica replayed the WAL up to written at least.
func replayedTo(ctx context.Context, promoted *pgtest.Server, db, written string) error {
	conn, err := pgx.Connect(ctx, promoted.AdminDSN(db))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var replayed string
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn()::text, pg_last_wal_replay_lsn() >= $1::pg_lsn`, written).Scan(&replayed, &ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("the promoted replica replayed the WAL to %s only; the primary had written %s before it stopped: commits lost", replayed, written)
	}
	return nil
}

// terminate ends one to three random sessions of the fleet (not the soak's samplers),
// recording first as its targets the processes whose alive lock is among them: the
// lock's session of a faultagent or an exporter agent, or the node agent's session,
// which holds its own lock and its processes'. It spares the locks of stopped processes
// (and the node agent's session while it or one of its processes is stopped): a stopped
// holder whose lock is taken away is dead by the verdict, and its lease may be taken
// while its job runs on when it resumes, an overlap nothing could excuse.
func (n *nemesis) terminate(f Fault, fault, heal func([]string)) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.cl.current().AdminDSN(n.cl.db))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT pid, application_name FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
		  AND application_name <> 'soak-sampler' ORDER BY application_name, pid`)
	if err != nil {
		return err
	}
	type session struct {
		pid int32
		app string
	}
	var all []session
	for rows.Next() {
		var s session
		if err := rows.Scan(&s.pid, &s.app); err != nil {
			return err
		}
		all = append(all, s)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	// lockOf is the process whose lock a session holds, "" for none; spared says whether
	// it must be left alone.
	lockOf := func(app string) (proc string, spared bool) {
		if svc, ok := strings.CutSuffix(app, ":alive-lock"); ok && n.byName[svc] != nil {
			return svc, n.isStopped(svc)
		}
		if svc, ok := strings.CutSuffix(app, ":node-agent"); ok && n.byName[svc] != nil {
			spared = n.isStopped(svc)
			for _, a := range attachedNames {
				spared = spared || n.isStopped(a)
			}
			return svc, spared
		}
		return "", false
	}
	all = slices.DeleteFunc(all, func(s session) bool { _, spared := lockOf(s.app); return spared })
	r := rand.New(rand.NewPCG(f.Pick, 0))
	r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	k := min(len(all), 1+int(f.Pick%3))
	victims := []string{}
	for _, s := range all[:k] {
		// A pool's session ending takes nothing away from anyone's liveness.
		if p, _ := lockOf(s.app); p != "" && !slices.Contains(victims, p) {
			victims = append(victims, p)
		}
	}
	sort.Strings(victims)
	fault(victims)
	defer heal(victims)
	for _, s := range all[:k] {
		if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", s.pid); err != nil {
			return err
		}
	}
	return nil
}

func revision() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", ":/", ":(top,exclude)docs/failover.md").Output(); err == nil && len(st) > 0 {
		rev += " (with uncommitted changes)"
	}
	return rev
}

func pgVersion(cl *cluster) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cl.current().AdminDSN(cl.db))
	if err != nil {
		return "?"
	}
	defer conn.Close(context.Background())
	var v string
	_ = conn.QueryRow(ctx, "SHOW server_version").Scan(&v)
	return v
}

func machine(cl *cluster) string {
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%d CPUs; Linux %s; PostgreSQL %s; Go %s", runtime.NumCPU(), strings.TrimSpace(string(kernel)), pgVersion(cl), runtime.Version())
}
