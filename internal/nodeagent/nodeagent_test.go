package nodeagent_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/nodeagenttest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// A node agent that stops keeps its session, and the locks, until the rows of the
// processes it held them for stop claiming them, and no longer than its bound: a raw
// process that never beats keeps it only that long.
func TestNodeAgentStopWaitsForItsProcessesRows(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	locked := func(id uuid.UUID) bool {
		return db.QueryInt(t, `SELECT count(*) FROM liveness.instance_alive_locks WHERE instance_id = $1`, id) == 1
	}
	stopWhileClaiming := func(id uuid.UUID) (stopped chan struct{}, began time.Time) {
		db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock) VALUES ($1, 'raw', true)`, id)
		node, stopNode := nodeagenttest.Start(t, db, socket)
		nodeagenttest.RawAttach(t, socket, id, db.Name)
		testutil.Eventually(t, 10*time.Second, "the raw process's lock held", func() bool { return node.Snapshot().LocksHeld == 1 && locked(id) })
		stopped, began = make(chan struct{}), time.Now()
		go func() { stopNode(); close(stopped) }()
		return stopped, began
	}

	answering := uuid.New()
	stopped, _ := stopWhileClaiming(answering)
	select {
	case <-stopped:
		t.Fatal("the node agent stopped while a row still claimed the lock it held")
	case <-time.After(500 * time.Millisecond):
	}
	if !locked(answering) {
		t.Fatal("the lock went while its row still claimed it")
	}
	db.Exec(t, `UPDATE liveness.instances SET holds_alive_lock = false WHERE instance_id = $1`, answering)
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the node agent did not stop once the row no longer claimed its lock")
	}
	// Its session closed; the server's backend exits, and frees the lock, just after.
	testutil.Eventually(t, 5*time.Second, "the lock gone with the stopped node agent's session", func() bool {
		return !locked(answering)
	})

	silent := uuid.New()
	stopped, began := stopWhileClaiming(silent)
	// A successor starts on the socket while the stopping node agent hands over (a
	// restart that does not wait): the stopping one removed its socket as it stopped
	// accepting, and does not take the successor's away when it ends.
	testutil.Eventually(t, 10*time.Second, "the stopping node agent's socket removed", func() bool {
		_, err := os.Lstat(socket)
		return errors.Is(err, fs.ErrNotExist)
	})
	nodeagenttest.Start(t, db, socket)
	select {
	case <-stopped:
	case <-time.After(15 * time.Second):
		t.Fatal("a process that never beats held the node agent's stop past its bound")
	}
	if took := time.Since(began); took < 2*time.Second {
		t.Errorf("the node agent stopped %v after the stop began, with a row still claiming its lock; want it to wait its bound (2s)", took)
	}
	testutil.Eventually(t, 5*time.Second, "the lock gone with the stopped node agent's session", func() bool {
		return !locked(silent)
	})
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatalf("the successor's socket after the stopped node agent ended: %v", err)
	}
	_ = c.Close()
}

// A process whose pool reaches another database is refused: a lock held in the node
// agent's database would count for nobody while the process believed it held.
func TestNodeAgentRefusesAnotherDatabase(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	node, _ := nodeagenttest.Start(t, db, socket)
	conn := nodeagenttest.RawAttach(t, socket, uuid.New(), "not_"+db.Name)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var reply struct {
		Op, Error string
	}
	if err := json.NewDecoder(conn).Decode(&reply); err != nil || reply.Op != "error" {
		t.Fatalf("reply to an attach for another database: %+v, %v; want an error", reply, err)
	}
	t.Logf("refused: %s", reply.Error)
	if s := node.Snapshot(); s.LocksHeld != 0 || s.Refused != 1 {
		t.Fatalf("node agent %+v after the refusal; want no lock, one refusal", s)
	}
}

// TestNodeAgentCountsWhatIsNotItsProtocol: a line that is not the protocol closes its
// connection, an unknown op and proofs asked before attaching are answered or ignored;
// each is counted, none stops the node agent, and a connection that never attaches costs
// the database nothing however many proofs it asks for.
func TestNodeAgentCountsWhatIsNotItsProtocol(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 2)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	node, _ := nodeagenttest.Start(t, db, socket)
	dial := func() net.Conn {
		c, err := net.Dial("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	send := func(c net.Conn, line string) {
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
	}

	// Garbage: the connection is closed, and counted.
	garbage := dial()
	send(garbage, "GET / HTTP/1.1")
	_ = garbage.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := garbage.Read(make([]byte, 1)); err == nil {
		t.Fatalf("the node agent answered %d bytes to a line that is not the protocol; want its connection closed", n)
	}
	testutil.Eventually(t, 5*time.Second, "the garbage counted", func() bool { return node.Snapshot().ProtocolErrors >= 1 })

	// Proofs asked before attaching: answered not held, with no verification sent.
	before := node.Snapshot()
	idle := dial()
	dec := json.NewDecoder(idle)
	const proves, batch = 512, 32 // a batch at a time: a process that reads nothing is dropped
	for i := 0; i < proves; i += batch {
		for j := range batch {
			send(idle, fmt.Sprintf(`{"op":"prove","seq":%d}`, i+j+1))
		}
		for range batch {
			_ = idle.SetReadDeadline(time.Now().Add(10 * time.Second))
			var m struct {
				Op   string `json:"op"`
				Held bool   `json:"held"`
			}
			if err := dec.Decode(&m); err != nil {
				t.Fatalf("a proof asked before attaching: %v", err)
			}
			if m.Op != "proof" || m.Held {
				t.Fatalf("a proof asked before attaching answered %+v; want a proof, not held", m)
			}
		}
	}
	after := node.Snapshot()
	if after.Proofs-before.Proofs > 1 { // its own verification may come due meanwhile
		t.Errorf("%d verifications of the session for %d proofs asked by a connection that never attached; want none",
			after.Proofs-before.Proofs, proves)
	}
	if got := after.ProtocolErrors - before.ProtocolErrors; got != proves {
		t.Errorf("%d protocol errors counted for %d proofs asked before attaching", got, proves)
	}

	// An unknown op is counted; the connection stays, and attaches after it.
	c := dial()
	send(c, `{"op":"frobnicate"}`)
	var database string
	if err := pool.QueryRow(testutil.Context(t, 10*time.Second), `SELECT current_database()`).Scan(&database); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"op": "attach", "instance": uuid.New(), "schema": "liveness", "database": database})
	send(c, string(b))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var st struct {
		Op   string `json:"op"`
		Held bool   `json:"held"`
	}
	if err := json.NewDecoder(c).Decode(&st); err != nil || st.Op != "state" || !st.Held {
		t.Fatalf("the attach after an unknown op: %+v, %v; want its lock held", st, err)
	}
	if got := node.Snapshot().ProtocolErrors - after.ProtocolErrors; got != 1 {
		t.Errorf("%d protocol errors counted for one unknown op", got)
	}
	if s := node.Snapshot(); !s.SessionUp || s.LocksHeld != 1 {
		t.Errorf("the node agent after all that: %+v; want its session up, the one lock held", s)
	}
}

// TestNodeAgentGivesAnInstanceToNoOtherProcess: an instance is the process that claimed
// it. Another process that names it is refused, counted, while its claimant runs; after
// the claimant is killed, until the fleet has called the instance dead (a dead instance
// is never kept alive by someone else's lock), and only then may the id begin a new life.
// Across a restart of the node agent too: a process that attaches first after it cannot
// take a running process's instance, which attaches again as its own.
func TestNodeAgentGivesAnInstanceToNoOtherProcess(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 2)
	ctx := testutil.Context(t, time.Minute)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	node, stop := nodeagenttest.Start(t, db, socket)
	var database string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&database); err != nil {
		t.Fatal(err)
	}

	id := uuid.New()
	owner := nodeagenttest.AttachProcess(t, socket, id, database)
	if a := owner.Next(t); a.Op != "state" || !a.Held {
		t.Fatalf("the owner's attach: %+v; want its lock held", a)
	}
	// Its row, as its heartbeat would write it: the lock held by the node agent's session.
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, lock_pid, lock_grace,
		stale_threshold, definitive_dead_cutoff)
		SELECT $1, 'owner', true, pid, interval '1 second', interval '90 seconds', interval '5 minutes'
		  FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'node:node-agent'`, id)

	impostor := nodeagenttest.AttachProcess(t, socket, id, database)
	if a := impostor.Next(t); a.Op != "error" || !strings.Contains(a.Error, "which still runs") {
		t.Fatalf("another process's attach of the owner's instance: %+v; want refused, its claimant running", a)
	}
	if n := node.Snapshot().Impostors; n == 0 {
		t.Error("no impostor counted")
	}
	impostor.Kill(t)

	// Across a restart of the node agent: a process that comes first is refused; the
	// owner attaches again as its own.
	stop()
	first := nodeagenttest.AttachProcess(t, socket, id, database) // dials until the node agent listens
	restarted, _ := nodeagenttest.Start(t, db, socket)            // stopped at the test's end
	if a := first.Next(t); a.Op != "error" || !strings.Contains(a.Error, "which still runs") {
		t.Fatalf("another process's attach first after the node agent's restart: %+v; want refused", a)
	}
	first.Kill(t)
	// The owner attaches again as its own: a state, not a refusal. Its lock may not be
	// free yet when it does (the stopped node agent's backend ends, and its session's
	// locks with it, when the server gets to it), so that answer may say not held; the
	// restarted node agent then takes the lock once it is free. (The process prints only
	// each connection's first answer.)
	if a := owner.Next(t); a.Op != "state" {
		t.Fatalf("the owner's attach again after the node agent's restart: %+v; want a state", a)
	}
	testutil.Eventually(t, 20*time.Second, "the restarted node agent holding the owner's lock", func() bool {
		return restarted.Snapshot().LocksHeld == 1
	})

	// The owner killed: its lock goes; until the fleet calls it dead, nobody else may
	// claim it, and then the id may begin a new life.
	owner.Kill(t)
	heir := nodeagenttest.AttachProcess(t, socket, id, database)
	// Held only once the fleet called the instance dead: it was refused meanwhile.
	nodeagenttest.AwaitDeathThenHold(t, heir)
}
