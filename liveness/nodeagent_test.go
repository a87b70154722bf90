package liveness_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// startNodeAgent runs a node agent on a socket in a temporary folder until stop (or the
// test's end).
func startNodeAgent(t *testing.T, db *pgtest.DB, socket string) (n *liveness.NodeAgent, stop func()) {
	t.Helper()
	logger, logs := logbuf.Logger()
	n, err := liveness.NewNodeAgent(liveness.NodeAgentConfig{DirectDSN: db.DSN, Socket: socket, ServiceName: "node",
		Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("node agent: %v", err)
			}
			if t.Failed() {
				t.Logf("the node agent's log:\n%s", logs)
			}
		})
	}
	t.Cleanup(stop)
	testutil.Eventually(t, 10*time.Second, "the node agent's session up", func() bool { return n.Snapshot().SessionUp })
	return n, stop
}

// sessionsNamed counts the database's sessions whose application_name ends with suffix.
func sessionsNamed(t *testing.T, db *pgtest.DB, suffix string) int {
	t.Helper()
	return db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE '%' || $1`, suffix)
}

// rawAttach attaches an instance over the socket as a process would, without an Agent:
// the connection is the lock, and closing it is what a killed process's kernel does.
func rawAttach(t *testing.T, socket string, id uuid.UUID, database string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	b, _ := json.Marshal(map[string]any{"op": "attach", "instance": id, "schema": "liveness", "database": database})
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	return c
}

// The node agent holds the alive locks of every process attached to it on one session:
// three agents, one liveness backend and no session of their own; their locks count by
// the verdict (the row records the node agent's backend), they lead through it (proofs
// are the node agent's verifications), and a process whose connection closes without a
// word (what kill -9 leaves) is dead about a lock grace later.
func TestNodeAgentHoldsItsProcessesLocksOnOneSession(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, time.Minute)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	node, _ := startNodeAgent(t, db, socket)

	var agents []*liveness.Agent
	for i := range 3 {
		cfg := liveness.AgentConfig{Pool: pool, NodeAgentSocket: socket, InstanceID: uuid.New(), ServiceName: "attached"}
		if i == 0 {
			cfg.Reaper = true
		}
		a := newAgent(t, cfg)
		runAgent(t, a)
		agents = append(agents, a)
	}
	if n := sessionsNamed(t, db, ":alive-lock"); n != 0 {
		t.Errorf("%d alive-lock sessions of their own; want none", n)
	}
	if n := sessionsNamed(t, db, ":node-agent"); n != 1 {
		t.Errorf("%d node agent sessions; want 1", n)
	}
	r, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		id := a.Snapshot().InstanceID
		testutil.Eventually(t, 10*time.Second, "an attached instance alive by its lock", func() bool {
			st, err := r.Instance(ctx, id)
			return err == nil && st.State == liveness.StateAlive && st.LockHeld
		})
	}
	if s := node.Snapshot(); s.Attached != 3 || s.LocksHeld != 3 {
		t.Errorf("node agent snapshot %+v; want 3 attached, 3 locks held", s)
	}

	// Leading through it: a lease is trusted only after a proof sent after the
	// acquisition, which the node agent's verification gives.
	led := make(chan *liveness.Lease, 1)
	campaign, stopCampaign := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopCampaign()
	wg.Go(func() {
		_ = agents[1].Elect(campaign, liveness.ElectorConfig{Lease: "node-job", OnStartedLeading: func(ctx context.Context, self *liveness.Lease) {
			led <- self
			<-ctx.Done()
		}})
	})
	select {
	case self := <-led:
		if _, err := self.Exec(ctx, pool, `SELECT 1`); err != nil {
			t.Fatalf("a fenced statement of a leader through the node agent: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the attached agent did not lead within 15 s")
	}
	proofsBefore := node.Snapshot().ProveAsked
	time.Sleep(time.Second)
	if got := node.Snapshot().ProveAsked - proofsBefore; got < 2 {
		t.Errorf("a leader through the node agent asked %d proofs in a second; want about four", got)
	}

	// A process that vanishes: its connection closes without a word.
	victim := uuid.New()
	conn := rawAttach(t, socket, victim, db.Name)
	testutil.Eventually(t, 10*time.Second, "the raw process's lock held", func() bool { return node.Snapshot().LocksHeld == 4 })
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, lock_grace, stale_threshold,
	            definitive_dead_cutoff, lock_pid) VALUES ($1, 'raw', true, '1 s', '90 s', '5 min', $2)`, victim, node.Snapshot().BackendPID)
	deaths := db.ConnAs(t, "test:listener")
	if _, err := deaths.Exec(ctx, `SELECT liveness.members_listen()`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * defaults.WatchInterval)
	killed := time.Now()
	_ = conn.Close()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		n, err := deaths.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no dead:%s within 10 s of its connection's end: %v", victim, err)
		}
		if n.Payload == "dead:"+victim.String() {
			break
		}
	}
	took := time.Since(killed)
	t.Logf("a vanished process was notified dead %s after its connection closed", took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Errorf("dead %s after its connection closed; want within a few seconds", took)
	}
	for _, a := range agents {
		if st, err := r.Instance(ctx, a.Snapshot().InstanceID); err != nil || !st.State.Alive() {
			t.Errorf("an attached agent is %v (%v) after another process vanished", st.State, err)
		}
	}
}

// When the node agent dies, its processes notice at once (their connections close) and
// prove life by their heartbeats: none is ever called dead. They attach again, and hold
// their locks again, when a node agent is back on the socket.
func TestNodeAgentDeathKillsNoneOfItsProcesses(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, time.Minute)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	_, stopNode := startNodeAgent(t, db, socket)
	var ids []uuid.UUID
	var agents []*liveness.Agent
	for range 3 {
		a := newAgent(t, liveness.AgentConfig{Pool: pool, NodeAgentSocket: socket, InstanceID: uuid.New(), ServiceName: "attached"})
		runAgent(t, a)
		agents = append(agents, a)
		ids = append(ids, a.Snapshot().InstanceID)
	}
	// An agent outside the node, as another node's would run: it stands in for the
	// watchers, which may have been attached, and judges the attached processes.
	runAgent(t, newAgent(t, defaultAgentConfig(db, db.Pool(t, 4), "other-node")))
	time.Sleep(2 * defaults.WatchInterval)

	falseDead := func() (dead []uuid.UUID) {
		for _, id := range ids {
			var alive bool
			if err := pool.QueryRow(ctx, `SELECT liveness.is_instance_alive($1)`, id).Scan(&alive); err != nil {
				t.Fatal(err)
			}
			if !alive {
				dead = append(dead, id)
			}
		}
		return dead
	}
	// Each process has beaten its claim: a claim's beat still in flight when the node
	// agent stops can land after the hand-over (the process's next beat, sent at once,
	// corrects it), which the check below would count.
	testutil.Eventually(t, 10*time.Second, "every attached process's row claiming its lock", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM liveness.instances WHERE instance_id = ANY($1) AND holds_alive_lock`, ids) == len(ids)
	})
	stopNode()
	// A graceful stop (SIGTERM, a rolling update) hands over: the locks went only once
	// every process's row had stopped claiming its lock, so no observer ever saw a lock
	// vanish from under a row that claimed it.
	if n := db.QueryInt(t, `SELECT count(*) FROM liveness.instances WHERE instance_id = ANY($1) AND holds_alive_lock`, ids); n != 0 {
		t.Errorf("%d rows still claimed their locks when the stopped node agent's session had ended", n)
	}
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if dead := falseDead(); len(dead) > 0 {
			t.Fatalf("attached processes called dead after the node agent died: %v", dead)
		}
	}
	for _, a := range agents {
		if a.Snapshot().AliveLock.Held {
			t.Fatalf("an attached agent still believes it holds its lock with the node agent gone")
		}
	}
	node, _ := startNodeAgent(t, db, socket)
	testutil.Eventually(t, 30*time.Second, "every process attached again, its lock held", func() bool {
		for _, a := range agents {
			if !a.Snapshot().AliveLock.Held {
				return false
			}
		}
		return node.Snapshot().LocksHeld == 3
	})
	if dead := falseDead(); len(dead) > 0 {
		t.Fatalf("attached processes dead after the node agent came back: %v", dead)
	}
}

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
		node, stopNode := startNodeAgent(t, db, socket)
		rawAttach(t, socket, id, db.Name)
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
	startNodeAgent(t, db, socket)
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
	node, _ := startNodeAgent(t, db, socket)
	conn := rawAttach(t, socket, uuid.New(), "not_"+db.Name)
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
	node, _ := startNodeAgent(t, db, socket)
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

// TestNodeAgentLeadersStepDownWhileItIsAwayAndAttachAgainAtOnce: a process leading through
// its node agent leads nothing while the node agent is away (its trust runs out three
// quarters of the grace after its last proof, lostNotAlive), and attaches again, its lock
// held, within half a second of the node agent's return, whether it was away one second
// or five. Five trials.
func TestNodeAgentLeadersStepDownWhileItIsAwayAndAttachAgainAtOnce(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	_, stop := startNodeAgent(t, db, socket)
	start := func(listening *time.Time) func() {
		_, stop := startNodeAgentAt(t, db, socket, listening)
		return stop
	}
	leadersStepDownAndAttachAgain(t, liveness.AgentConfig{Pool: pool, NodeAgentSocket: socket, InstanceID: uuid.New(),
		ServiceName: "attached"}, stop, start, []time.Duration{time.Second, 5 * time.Second, time.Second, 2 * time.Second, 3 * time.Second})
}

// leadersStepDownAndAttachAgain runs an agent of cfg, attached to a node agent that runs
// (stop stops it), and leading; for each of aways, it stops the node agent, checks that
// the agent stops leading, lostNotAlive, within 2 s, and starts the node agent again
// (start, which notes when it listens) after that long away; then that the lock is held
// again within half a second of the node agent's return.
func leadersStepDownAndAttachAgain(t *testing.T, cfg liveness.AgentConfig, stop func(), start func(*time.Time) func(),
	aways []time.Duration) {
	t.Helper()
	ctx := testutil.Context(t, 3*time.Minute)
	agent := newAgent(t, cfg)
	runAgent(t, agent)
	type stint struct {
		began, ended time.Time
		reason       error
	}
	stints := make(chan stint, 16)
	electCtx, stopElect := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopElect()
	var current stint
	wg.Go(func() {
		_ = agent.Elect(electCtx, liveness.ElectorConfig{Lease: "job",
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				current = stint{began: time.Now()}
				<-ctx.Done()
				current.ended = time.Now()
			},
			OnStoppedLeading: func(reason error) {
				current.reason = reason
				stints <- current
			}})
	})
	leading := func() {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, "the process leading", func() bool {
			for _, l := range agent.Snapshot().Leases {
				if l.Name == "job" && l.Held {
					return true
				}
			}
			return false
		})
	}
	var worst time.Duration
	for trial, away := range aways {
		leading()
		gone := time.Now()
		stop()
		var s stint
		select {
		case s = <-stints:
		case <-time.After(10 * time.Second):
			t.Fatalf("trial %d: the process still leads 10 s after its node agent went away", trial)
		}
		var lost *liveness.LeaseLostError
		if !errors.As(s.reason, &lost) || lost.Reason != "not_alive" {
			t.Fatalf("trial %d: stopped leading because %v; want %s", trial, s.reason, "not_alive")
		}
		if took := s.ended.Sub(gone); took > 2*time.Second {
			t.Errorf("trial %d: the job ended %s after the node agent went away; want within its trust (0.75 s of its last proof)",
				trial, took)
		}
		time.Sleep(time.Until(gone.Add(away)))
		var back time.Time
		stop = start(&back)
		testutil.Eventually(t, 10*time.Second, "the lock held through the node agent again", func() bool {
			return agent.Snapshot().AliveLock.Held
		})
		took := time.Since(back)
		worst = max(worst, took)
		t.Logf("trial %d: away %s; the lock held again %s after the node agent listened", trial, away, took.Round(time.Millisecond))
	}
	if worst > 500*time.Millisecond {
		t.Errorf("the lock held again up to %s after the node agent was back; want within 0.5 s", worst)
	}
}

// startNodeAgentAt is startNodeAgent, noting in listening when the node agent listens.
func startNodeAgentAt(t *testing.T, db *pgtest.DB, socket string, listening *time.Time) (*liveness.NodeAgent, func()) {
	t.Helper()
	n, err := liveness.NewNodeAgent(liveness.NodeAgentConfig{DirectDSN: db.DSN, Socket: socket, ServiceName: "node"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	*listening = time.Now()
	go func() { done <- n.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("node agent: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return n, stop
}

// attachedProcess is a process of its own (the test binary, rawAttachEnv) attached to a
// node agent with one instance, attaching again whenever its connection ends.
type attachedProcess struct {
	cmd   *exec.Cmd
	out   *bufio.Reader
	stdin io.WriteCloser
}

type attachAnswer struct {
	Op    string `json:"op"`
	Held  bool   `json:"held"`
	Error string `json:"error"`
}

// attachProcess starts a process attached to the node agent at where (a socket's path, or
// tcp://host:port with a token).
func attachProcess(t *testing.T, where string, id uuid.UUID, database string, token ...string) *attachedProcess {
	t.Helper()
	p := &attachedProcess{cmd: exec.Command(os.Args[0])}
	spec := where + "," + id.String() + "," + database
	for _, tok := range token {
		spec += "," + tok
	}
	p.cmd.Env = append(os.Environ(), rawAttachEnv+"="+spec)
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.out = bufio.NewReader(out)
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() })
	return p
}

// next is the process's next answer to an attach.
func (p *attachedProcess) next(t *testing.T) attachAnswer {
	t.Helper()
	type result struct {
		line string
		err  error
	}
	ch := make(chan result, 1)
	go func() { line, err := p.out.ReadString('\n'); ch <- result{line, err} }()
	select {
	case r := <-ch:
		var a attachAnswer
		if r.err != nil || json.Unmarshal([]byte(r.line), &a) != nil {
			t.Fatalf("the attached process's answer %q: %v", r.line, r.err)
		}
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no answer from the attached process within 20 s")
		return attachAnswer{}
	}
}

// kill ends the process with SIGKILL, as a crash would.
func (p *attachedProcess) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
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
	node, stop := startNodeAgent(t, db, socket)
	var database string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&database); err != nil {
		t.Fatal(err)
	}

	id := uuid.New()
	owner := attachProcess(t, socket, id, database)
	if a := owner.next(t); a.Op != "state" || !a.Held {
		t.Fatalf("the owner's attach: %+v; want its lock held", a)
	}
	// Its row, as its heartbeat would write it: the lock held by the node agent's session.
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, lock_pid, lock_grace,
		stale_threshold, definitive_dead_cutoff)
		SELECT $1, 'owner', true, pid, interval '1 second', interval '90 seconds', interval '5 minutes'
		  FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'node:node-agent'`, id)

	impostor := attachProcess(t, socket, id, database)
	if a := impostor.next(t); a.Op != "error" || !strings.Contains(a.Error, "which still runs") {
		t.Fatalf("another process's attach of the owner's instance: %+v; want refused, its claimant running", a)
	}
	if n := node.Snapshot().Impostors; n == 0 {
		t.Error("no impostor counted")
	}
	impostor.kill(t)

	// Across a restart of the node agent: a process that comes first is refused; the
	// owner attaches again as its own.
	stop()
	first := attachProcess(t, socket, id, database) // dials until the node agent listens
	startNodeAgent(t, db, socket)                   // stopped at the test's end
	if a := first.next(t); a.Op != "error" || !strings.Contains(a.Error, "which still runs") {
		t.Fatalf("another process's attach first after the node agent's restart: %+v; want refused", a)
	}
	first.kill(t)
	// The stopping node agent's last word to the owner, a state without the lock, may
	// or may not have reached it before its connection closed; then its attach again.
	for i := 0; ; i++ {
		a := owner.next(t)
		if a.Op == "state" && a.Held {
			break
		}
		if a.Op != "state" || i > 0 {
			t.Fatalf("the owner's attach again after the node agent's restart: %+v; want its lock held", a)
		}
	}

	// The owner killed: its lock goes; until the fleet calls it dead, nobody else may
	// claim it, and then the id may begin a new life.
	owner.kill(t)
	heir := attachProcess(t, socket, id, database)
	var refusals int
	for {
		a := heir.next(t)
		if a.Op == "state" && a.Held {
			break
		}
		if a.Op != "error" || !strings.Contains(a.Error, "not dead yet") {
			t.Fatalf("another process's attach after the owner's kill: %+v; want refused until the instance is dead", a)
		}
		refusals++
	}
	// Held only once the fleet called the instance dead: it was refused meanwhile.
	if refusals == 0 {
		t.Error("the heir attached at once after the owner's kill: the instance was not dead yet (its lock grace)")
	}
	t.Logf("the heir was refused %d times until the instance was dead, then held its lock", refusals)
}
