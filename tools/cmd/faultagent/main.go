// Command faultagent is the fault suite's victim and competitor: one or more live
// instances built from the liveness package (alive lock, heartbeat, optional reaper),
// each campaigning for a named lease (Agent.Elect; with --agent=false, Leases.Run in a
// loop) and, while it holds the lease, writing to a fencing log under
// lease_is_held(name, epoch).
//
// It reports what it does as JSON lines on stderr, one object per event, with "ev" naming
// the event and "t" the wall-clock time in Unix nanoseconds:
//
//	ready     the instances are built and running
//	acquired  an instance took the lease (epoch)
//	lost      its lease context ended while it meant to keep it (cause)
//	released  it gave the lease back after --lease.hold
//	rejected  a fenced write found the lease not held under its epoch, or a fenced
//	          transaction (--lease.tx-every) was refused at the fence or at COMMIT
//	lock      the instance's own view of its alive lock changed (held)
//	ignoring  with --lease.ignore-loss: it lost the lease and goes on believing it leads
//	job_end   the lease's job (the callback that began with acquired) has returned
//
// With --shards.set, each shard it comes to own (lease "<set>/<shard>", epoch) is told as:
//
//	shard_owned      its callback began
//	shard_cancelled  its callback's context ended (cause; lost: the cause is the loss of
//	                 the shard's own lease, not a move, the member lease or a shutdown)
//	fence_refused    a write under the shard's fence was refused (lost: the lease is lost,
//	                 and the callback returns; else the write came past its deadline)
//	shard_released   its callback has returned
//
// Each event also carries "mono", CLOCK_MONOTONIC in nanoseconds, which every process of
// the host shares and no clock step moves.
//
// The library's own log lines go to stderr as JSON too; they carry "msg", not "ev".
//
// With --web.listen-address it serves the exporter's agent metrics on /metrics (the
// collector package's agent collector, as pg_liveness_exporter serves them), so that a
// real Prometheus can evaluate the alert rules against it.
//
// --lease.ignore-loss makes a stale leader, the failure fencing exists for, which the
// library itself never produces: when its lease ends, the instance goes on believing it
// leads under the old epoch. It keeps attempting its fenced writes (lease_is_held refuses
// them) and reports the lease as held under that epoch on /metrics, until shut down.
//
// SIGUSR1 holds every connection of each instance's pool busy for --busy-for, as a
// service whose pool is exhausted by long transactions. SIGTERM and SIGINT shut down
// cleanly.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

type config struct {
	dsn, directDSN, schema string
	nodeAgentSocket        string
	service                string
	instances              int
	maxConns               int
	agent                  bool
	timing                 timing

	lease      string
	leaseTTL   time.Duration
	hold       time.Duration // 0: hold until lost or shut down
	retry      time.Duration
	writeEvery time.Duration
	txEvery    int // every txEvery-th write is a transaction of two inserts (BeginFunc); 0: none
	fenceTable string
	busyFor    time.Duration
	ignoreLoss bool
	listen     string
	shardSet   string // --shards.set: take part in it; empty: none
	shardCount int
	// shardWriteEvery is each owned shard's write cadence; 0: writeEvery.
	shardWriteEvery time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.dsn, "dsn", "", "DSN of the pool (heartbeat, leases, fenced writes)")
	flag.StringVar(&c.directDSN, "direct-dsn", "", "DSN of the alive lock's connection; default: --dsn")
	flag.StringVar(&c.schema, "schema", "liveness", "schema of the liveness objects")
	flag.StringVar(&c.nodeAgentSocket, "node-agent.socket", "", "hold the alive lock through the node agent on this socket "+
		"(AgentConfig.NodeAgentSocket) instead of a session of its own")
	flag.StringVar(&c.service, "service", "faultagent", "service name; with --instances above 1, instance i gets <service>-<i>")
	flag.IntVar(&c.instances, "instances", 1, "instances run by this process")
	flag.IntVar(&c.maxConns, "max-conns", 2, "pool size of each instance")
	flag.BoolVar(&c.agent, "agent", true, "run the alive lock, heartbeat and reaper; --agent=false competes for the lease only")
	c.timing.addFlags()
	flag.StringVar(&c.lease, "lease", "", "lease to compete for; empty: none")
	flag.DurationVar(&c.leaseTTL, "lease.ttl", defaultLeaseTTL, "lease ttl; the library's default")
	flag.DurationVar(&c.hold, "lease.hold", 0, "give the lease back after holding it this long; 0 keeps it")
	flag.DurationVar(&c.retry, "lease.retry", defaultLeaseRetry, "pause between attempts to take the lease; the library's default")
	flag.DurationVar(&c.writeEvery, "lease.write-every", 50*time.Millisecond, "fenced write cadence while holding the lease")
	flag.IntVar(&c.txEvery, "lease.tx-every", 0, "every n-th fenced write (of the lease, and of each owned shard) is a transaction of "+
		"two inserts (Lease.BeginFunc); 0: none")
	flag.StringVar(&c.fenceTable, "fence-table", "public.fence_log", "fencing log table (lease, epoch, writer)")
	flag.StringVar(&c.shardSet, "shards.set", "", "take part in this shard set (Agent.Shards); empty: none. Each owned shard writes "+
		"to the fencing log every --shards.write-every, fenced by its lease (lease <set>/<shard>)")
	flag.IntVar(&c.shardCount, "shards.count", 64, "the shard set's shards")
	flag.DurationVar(&c.shardWriteEvery, "shards.write-every", 0, "fenced write cadence of each owned shard; 0: --lease.write-every")
	flag.DurationVar(&c.busyFor, "busy-for", 10*time.Second, "how long SIGUSR1 keeps the pool busy")
	flag.BoolVar(&c.ignoreLoss, "lease.ignore-loss", false, "a stale leader: go on believing in a lost lease (fault injection)")
	flag.StringVar(&c.listen, "web.listen-address", "", "serve the agent metrics on /metrics at this address; needs --instances=1 and --agent")
	flag.Parse()
	if c.dsn == "" {
		fmt.Fprintln(os.Stderr, "faultagent: --dsn is required")
		os.Exit(2)
	}
	if c.directDSN == "" {
		c.directDSN = c.dsn
	}
	if c.listen != "" && (c.instances != 1 || !c.agent) {
		fmt.Fprintln(os.Stderr, "faultagent: --web.listen-address needs --instances=1 and --agent")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "faultagent:", err)
		os.Exit(1)
	}
}

// events writes the JSON event lines; one mutex keeps lines whole.
var events = struct {
	sync.Mutex
	enc *json.Encoder
}{enc: json.NewEncoder(os.Stderr)}

func emit(ev string, inst uuid.UUID, kv ...any) {
	m := map[string]any{"t": time.Now().UnixNano(), "mono": monotonicNow(), "ev": ev, "inst": inst.String()}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	events.Lock()
	defer events.Unlock()
	_ = events.enc.Encode(m)
}

// monotonicNow is CLOCK_MONOTONIC in nanoseconds, 0 if it cannot be read.
func monotonicNow() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
		return 0
	}
	return ts.Nano()
}

// newLogger builds the agent's one logger: JSON lines at info level, passwords removed.
func newLogger(w io.Writer) *slog.Logger {
	return logging.Wrap(slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})))
}

func run(ctx context.Context, c config) error {
	logger := newLogger(os.Stderr)
	busy := make(chan os.Signal, 1)
	signal.Notify(busy, syscall.SIGUSR1)
	defer signal.Stop(busy)

	var insts []*instance
	for i := 0; i < c.instances; i++ {
		service := c.service
		if c.instances > 1 {
			service = fmt.Sprintf("%s-%d", c.service, i)
		}
		in, err := newInstance(ctx, c, service, logger)
		if err != nil {
			for _, in := range insts {
				in.pool.Close()
			}
			return err
		}
		insts = append(insts, in)
	}
	var wg sync.WaitGroup
	for _, in := range insts {
		wg.Go(func() { in.run(ctx) })
	}
	if c.listen != "" {
		stopServing, err := serveMetrics(c.listen, insts[0], logger)
		if err != nil {
			return err
		}
		defer stopServing()
	}
	for _, in := range insts {
		emit("ready", in.id, "service", in.service)
	}
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			for _, in := range insts {
				in.pool.Close()
			}
			return nil
		case <-busy:
			for _, in := range insts {
				go in.exhaustPool(ctx, c.maxConns, c.busyFor)
			}
		}
	}
}

type instance struct {
	c       config
	id      uuid.UUID
	service string
	pool    *pgxpool.Pool
	parts   *participant
	fence   string
	// txInsert is one insert of a fenced transaction (--lease.tx-every).
	txInsert string

	mu       sync.Mutex
	believed map[string]int64 // with --lease.ignore-loss: lost leases it goes on leading, by name
}

func newInstance(ctx context.Context, c config, service string, logger *slog.Logger) (*instance, error) {
	pcfg, err := pgxpool.ParseConfig(c.dsn)
	if err != nil {
		return nil, fmt.Errorf("--dsn: %w", err)
	}
	pcfg.MaxConns = int32(c.maxConns)
	// As docs/library.md advises: a short TCP handshake, so that after a cut heals the
	// next beat dials afresh instead of waiting for a lost SYN's retransmission.
	pcfg.ConnConfig.DialFunc = (&net.Dialer{Timeout: 500 * time.Millisecond, KeepAlive: 15 * time.Second}).DialContext
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	in := &instance{c: c, id: uuid.New(), service: service, pool: pool}
	// The library's documented fence for a write in one statement: the lease held under
	// its epoch, and the server's clock before the holder's fence deadline.
	in.fence = "INSERT INTO " + c.fenceTable + " (lease, epoch, writer) SELECT $1, $2, $3 WHERE " +
		pgx.Identifier{c.schema}.Sanitize() + ".lease_is_held($1, $2) AND clock_timestamp() < $4"
	in.txInsert = "INSERT INTO " + c.fenceTable + " (lease, epoch, writer) VALUES ($1, $2, $3)"
	in.parts, err = newParticipant(c, in.id, service, pool, logger.With("instance_id", in.id.String()))
	if err != nil {
		pool.Close()
		return nil, err
	}
	return in, nil
}

func (in *instance) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { in.parts.run(ctx) })
	wg.Go(func() { in.watchLock(ctx) })
	if in.c.shardSet != "" && in.parts.agent != nil {
		wg.Go(func() { in.ownShards(ctx) })
	}
	if in.c.lease != "" {
		wg.Go(func() { in.compete(ctx) })
	}
	wg.Wait()
}

// believe records, for a stale leader, the lease it goes on leading.
func (in *instance) believe(name string, epoch int64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.believed == nil {
		in.believed = map[string]int64{}
	}
	in.believed[name] = epoch
}

func (in *instance) beliefs() map[string]int64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	return maps.Clone(in.believed)
}

// watchLock reports the instance's own view of its alive lock whenever it changes.
func (in *instance) watchLock(ctx context.Context) {
	if !in.c.agent {
		return
	}
	last := false
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if held := in.parts.lockHeld(); held != last {
			last = held
			emit("lock", in.id, "held", held)
		}
	}
}

// compete tries to take the lease every --lease.retry and, while it holds it, writes to
// the fencing log every --lease.write-every.
func (in *instance) compete(ctx context.Context) {
	in.parts.compete(ctx, in.c.lease, in.c.leaseTTL, in.c.retry, in.hold, func(err error) {
		emit("acquire_error", in.id, "err", err.Error())
	})
}

// hold writes under the lease while ctx, the lease's context, lasts; a stale leader
// (--lease.ignore-loss) goes on under procCtx, the process's.
func (in *instance) hold(procCtx, ctx context.Context, lease leaseHandle) error {
	emit("acquired", in.id, "lease", lease.Name, "epoch", lease.Epoch)
	defer emit("job_end", in.id, "lease", lease.Name, "epoch", lease.Epoch)
	var until <-chan time.Time
	if in.c.hold > 0 {
		until = time.After(in.c.hold)
	}
	t := time.NewTicker(in.c.writeEvery)
	defer t.Stop()
	stale := false // --lease.ignore-loss, after the loss
	writes := 0
	for {
		select {
		case <-ctx.Done():
			emit("lost", in.id, "lease", lease.Name, "epoch", lease.Epoch, "cause", fmt.Sprint(context.Cause(ctx)))
			if in.c.ignoreLoss && procCtx.Err() == nil {
				emit("ignoring", in.id, "lease", lease.Name, "epoch", lease.Epoch)
				in.believe(lease.Name, lease.Epoch)
				ctx, until, stale = procCtx, nil, true
				continue
			}
			return nil
		case <-until:
			emit("released", in.id, "lease", lease.Name, "epoch", lease.Epoch)
			return nil
		case <-t.C:
		}
		if ctx.Err() != nil {
			continue // report the loss above, write nothing
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if writes++; in.c.txEvery > 0 && writes%in.c.txEvery == 0 && !stale {
			// Two inserts in one transaction, fenced by the library and refused at the fence
			// or at COMMIT: the ledger stamps rows when they commit, so a COMMIT that lands
			// after its writer was told counts as such.
			err := lease.BeginFunc(wctx, in.pool, func(tx pgx.Tx) error {
				for range 2 {
					if _, err := tx.Exec(wctx, in.txInsert, lease.Name, lease.Epoch, in.id.String()); err != nil {
						return err
					}
				}
				return nil
			})
			cancel()
			switch {
			case errors.Is(err, liveness.ErrFenced):
				emit("rejected", in.id, "lease", lease.Name, "epoch", lease.Epoch, "tx", true)
			case err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded):
				emit("write_error", in.id, "lease", lease.Name, "epoch", lease.Epoch, "err", err.Error())
			}
			continue
		}
		// A stale leader ignores the deadline as it ignores the loss: only the epoch then
		// refuses its writes, which is what the fault suite measures for it.
		deadline := lease.FenceDeadline()
		if stale {
			deadline = time.Date(9999, time.January, 1, 0, 0, 0, 0, time.UTC)
		}
		tag, err := in.pool.Exec(wctx, in.fence, lease.Name, lease.Epoch, in.id.String(), deadline)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded):
			emit("write_error", in.id, "lease", lease.Name, "epoch", lease.Epoch, "err", err.Error())
		case err == nil && tag.RowsAffected() == 0:
			emit("rejected", in.id, "lease", lease.Name, "epoch", lease.Epoch)
		}
	}
}

// exhaustPool holds every connection of the pool in a transaction for d.
func (in *instance) exhaustPool(ctx context.Context, n int, d time.Duration) {
	emit("busy", in.id, "conns", n, "for_ms", d.Milliseconds())
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Go(func() {
			bctx, cancel := context.WithTimeout(ctx, d+5*time.Second)
			defer cancel()
			tx, err := in.pool.Begin(bctx)
			if err != nil {
				emit("busy_error", in.id, "err", err.Error())
				return
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(bctx)) }()
			if _, err := tx.Exec(bctx, "SELECT pg_sleep($1)", d.Seconds()); err != nil {
				emit("busy_error", in.id, "err", err.Error())
			}
		})
	}
	wg.Wait()
	emit("idle", in.id)
}
