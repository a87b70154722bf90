package soak

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/netns"
)

// Fleet shape: three faultagents per lease (a service built on the library, campaigning
// with Agent.Elect, its job appending fenced rows to the ledger and printing its begin
// and end) and four exporter binaries as agents: sixteen agents. One competitor of two of
// the leases and one exporter agent run in network namespaces, for the link faults. The
// first two competitors of each lease also share a shard set (Agent.Shards): eight
// members, among them both faultagents in namespaces, each shard's owner appending
// fenced rows to the same ledger. The last exporter agent is the node's agent too
// (--node-agent.socket), and the faultagents of attachedNames hold their alive locks
// through it; every other faultagent outside a namespace holds its lock on a session
// through a proxy of the soak's (late_close).
const (
	leases            = 4
	competitorsPerJob = 3
	exporterAgents    = 4
	ledgerTable       = "public.fence_log"
	writeEvery        = 200 * time.Millisecond
	// txEvery: every third write is a transaction of two inserts (Lease.BeginFunc),
	// fenced at COMMIT; the others are single statements with the hand-written fence.
	txEvery = 3

	shardSetName       = "shards" // its leases, "shards/<n>", are apart from the soak-<n> ones the sampler follows
	shardCount         = 32
	shardMembersPerJob = 2 // competitors of each lease that are members too
	// shardWriteEvery: each owned shard's write cadence (one write in txEvery a
	// transaction of two rows, Shard.BeginFunc): 32 writes a second across the set,
	// beside the lease holders' 20.
	shardWriteEvery = time.Second
)

// nodeAgentName is the exporter agent that is also the node agent; attachedNames are the
// faultagents attached to it: a competitor of two leases (one of them a shard member),
// and two of one lease, so that a node agent's fault leaves that lease one competitor
// of its own.
const nodeAgentName = "ex-3"

var attachedNames = []string{"fa-2-2", "fa-3-1", "fa-3-2"}

// soakFleet is the fleet's shape as the schedule sees it, from the names alone: TestSoak
// checks that the fleet it starts has it, and the schedule's tests draw from it.
func soakFleet() Fleet {
	f := Fleet{Failover: true, Competitors: map[string][]string{}, NodeAgent: nodeAgentName, Attached: attachedNames}
	for l := range leases {
		for k := range competitorsPerJob {
			name := fmt.Sprintf("fa-%d-%d", l, k)
			f.Procs = append(f.Procs, name)
			f.Pools = append(f.Pools, name)
			f.Competitors[fmt.Sprintf("soak-%d", l)] = append(f.Competitors[fmt.Sprintf("soak-%d", l)], name)
			switch {
			case k == 0 && l < 2:
				f.Netns = append(f.Netns, name)
			case !slices.Contains(attachedNames, name):
				f.Proxied = append(f.Proxied, name)
			}
		}
	}
	for k := range exporterAgents {
		f.Procs = append(f.Procs, fmt.Sprintf("ex-%d", k))
	}
	f.Netns = append(f.Netns, "ex-0")
	sort.Strings(f.Procs)
	sort.Strings(f.Netns)
	return f
}

// member is one process of the fleet, restarted as a new instance after a kill.
type member struct {
	name  string
	lease string // the lease it competes for; "" for the exporter agents
	set   string // the shard set it takes part in, or ""
	ns    *netns.Namespace
	addr  string // its /metrics, host:port
	argv  func(inst uuid.UUID) []string
	exp   bool       // the exporter binary (else the faultagent)
	node  string     // the node agent it is attached to, or ""
	proxy *lockProxy // its alive lock's session's proxy, or nil

	h *History
	t *testing.T

	mu      sync.Mutex
	proc    *proctest.Process
	inst    string
	holding bool // inside its lease's job, by its own events
	killing bool // the nemesis is killing it: its exit is expected
	ended   bool // the run is over: exits are the cleanup's
}

// endRun stops recording the member's exits: from now on they are the cleanup's.
func (m *member) endRun() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ended = true
}

// watchExit records an exit the nemesis did not cause: a fleet process must not end on
// its own.
func (m *member) watchExit(p *proctest.Process, inst string) {
	<-p.Exited()
	m.mu.Lock()
	unexpected := !m.killing && !m.ended && m.proc == p
	if unexpected {
		m.proc = nil
	}
	m.mu.Unlock()
	if unexpected {
		m.h.Add(Event{Kind: EvExit, Proc: m.name, Inst: inst, Note: fmt.Sprint(p.Err())})
	}
}

func (m *member) inJob() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.holding && m.proc != nil
}

func (m *member) current() (*proctest.Process, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc, m.inst
}

// start runs a new instance and records its start: for the faultagent when it says it is
// ready, for the exporter once the process runs (it makes no announcement; the settling
// time after a start covers its joining).
func (m *member) start() error {
	id := uuid.New()
	argv := m.argv(id)
	if m.ns != nil {
		argv = m.ns.Command(argv...)
	}
	ready := make(chan string, 1)
	p := proctest.Start(m.t, m.name, proctest.Options{OnLine: func(line string) { m.onLine(line, ready) }}, argv[0], argv[1:]...)
	inst := id.String()
	if !m.exp {
		select {
		case inst = <-ready:
		case <-p.Exited():
			return fmt.Errorf("%s exited at start: %v", m.name, p.Err())
		case <-time.After(60 * time.Second):
			return fmt.Errorf("%s not ready within 60 s", m.name)
		}
	}
	// The start is recorded before the samplers read the instance: every sample of it
	// was sent after its start.
	start := Event{Kind: EvStart, Proc: m.name, Inst: inst, Lease: m.lease, Node: m.node}
	if m.set != "" {
		start.Set, start.Shards = m.set, shardCount
	}
	m.h.Add(start)
	m.mu.Lock()
	m.proc, m.inst, m.killing = p, inst, false
	m.mu.Unlock()
	go m.watchExit(p, inst) // ends with the process, which the test's cleanup ends
	return nil
}

// onLine turns the faultagent's event lines into the history.
func (m *member) onLine(line string, ready chan string) {
	if m.exp {
		m.h.Log(m.name, line)
		return
	}
	var e struct {
		T     int64  `json:"t"`
		Ev    string `json:"ev"`
		Inst  string `json:"inst"`
		Lease string `json:"lease"`
		Epoch int64  `json:"epoch"`
		Cause string `json:"cause"`
		Err   string `json:"err"`
		Lost  bool   `json:"lost"`
	}
	if json.Unmarshal([]byte(line), &e) != nil || e.Ev == "" {
		m.h.Log(m.name, line) // its log; its events are in the history
		return
	}
	kind := map[string]string{"acquired": EvJobBegin, "job_end": EvJobEnd, "lost": EvLost, "rejected": EvRejected,
		"shard_owned": EvShardOwned, "shard_released": EvShardReleased, "shard_cancelled": EvShardStop, "fence_refused": EvShardRefused}[e.Ev]
	switch {
	case e.Ev == "shard_cancelled" && e.Lost:
		kind = EvShardLost
	case e.Ev == "fence_refused":
		e.Cause = map[bool]string{true: "lost", false: "late"}[e.Lost]
	}
	switch {
	case e.Ev == "ready":
		select {
		case ready <- e.Inst:
		default:
		}
	case kind != "":
		if kind == EvJobBegin || kind == EvJobEnd {
			m.mu.Lock()
			m.holding = kind == EvJobBegin
			m.mu.Unlock()
		}
		m.h.Add(Event{T: e.T, Kind: kind, Proc: m.name, Inst: e.Inst, Lease: e.Lease, Epoch: e.Epoch, Note: e.Cause})
	}
}

// signal sends sig to the running process; false when none runs.
func (m *member) signal(sig syscall.Signal) bool {
	p, _ := m.current()
	if p == nil || !p.Running() {
		return false
	}
	return syscall.Kill(p.Pid(), sig) == nil
}

// stop ends the process as a supervisor does (SIGTERM), and waits for it to exit.
func (m *member) stop() bool {
	m.mu.Lock()
	p := m.proc
	m.killing = true
	m.mu.Unlock()
	if p == nil || !p.Running() {
		return false
	}
	_ = syscall.Kill(p.Pid(), syscall.SIGTERM)
	select {
	case <-p.Exited():
	case <-time.After(30 * time.Second):
		m.t.Errorf("%s still running 30 s after SIGTERM; killed", m.name)
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
		<-p.Exited()
	}
	m.mu.Lock()
	m.proc, m.holding = nil, false
	m.mu.Unlock()
	return true
}

// kill is kill -9 of the process group; it returns once the process is gone.
func (m *member) kill() bool {
	m.mu.Lock()
	p := m.proc
	m.killing = true
	m.mu.Unlock()
	if p == nil || !p.Running() {
		return false
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	select {
	case <-p.Exited():
	case <-time.After(10 * time.Second):
		m.t.Errorf("%s survived SIGKILL for 10 s", m.name)
	}
	m.mu.Lock()
	m.proc, m.holding = nil, false
	m.mu.Unlock()
	return true
}

// metricsAddr picks the /metrics address of a member: a free port on 127.0.0.1, or on the
// namespace's address (nothing listens inside a fresh namespace). The members start one
// after another, their connections taking local ports meanwhile: the port is one that no
// connection takes (testutil.FreePort).
func metricsAddr(t *testing.T, ns *netns.Namespace) string {
	port, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	host := "127.0.0.1"
	if ns != nil {
		host = ns.NSIP
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}
