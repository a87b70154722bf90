// Command billing-worker is a small service built on the liveness package the way a
// service embeds it. Run several instances against one PostgreSQL: each one joins the
// fleet (liveness.Agent), campaigns for the singleton invoice run (Agent.Elect), fences
// the run's ledger writes (Lease.Exec), reads its peers (liveness.Reader), and
// stops on SIGTERM.
//
// The invoice run works until its context is cancelled and then needs --wind-down to
// finish the batch it started, as a run that sends mails or calls a payment provider
// cannot stop halfway. The library keeps the run's lease renewed meanwhile, and the
// instance alive, so no other instance starts a run before this one has ended: the
// lease is released only once the run has returned.
//
// Each run appends its begin and end, and any write the fence refused, to --runs as JSON
// lines: what a run does outside the database, where no fence can help. The example's
// test reads those records to check that no two runs ever overlapped.
//
//	DATABASE_URL=postgres://… billing-worker --runs=/var/lib/billing/runs.jsonl
//
// DATABASE_URL is the pool's DSN (it may go through PgBouncer); DIRECT_DATABASE_URL, when
// set, is the alive lock's, which must reach PostgreSQL itself. The program imports
// nothing internal to this repository, so it can be copied as it is.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// invoiceRunLease is the lease that makes the invoice run a singleton.
const invoiceRunLease = "billing.invoice-run"

type config struct {
	dsn, directDSN string
	name           string        // this instance, in the records and the logs
	runs           string        // the runs' records, JSON lines
	windDown       time.Duration // how long a run needs to finish once cancelled
	every          time.Duration // a ledger write every
	peersEvery     time.Duration // how often to log the peers
}

func main() {
	host, _ := os.Hostname()
	var c config
	flag.StringVar(&c.name, "name", fmt.Sprintf("%s:%d", host, os.Getpid()), "this instance's name in the records and the logs")
	flag.StringVar(&c.runs, "runs", "billing-runs.jsonl", "file the invoice runs append their records to")
	flag.DurationVar(&c.windDown, "wind-down", 3*time.Second, "how long a cancelled invoice run needs to finish its batch")
	flag.DurationVar(&c.every, "write-every", 100*time.Millisecond, "pause between two ledger writes of a run")
	flag.DurationVar(&c.peersEvery, "peers-every", 5*time.Second, "how often to log the peers")
	flag.Parse()
	c.dsn = os.Getenv("DATABASE_URL")
	c.directDSN = cmp.Or(os.Getenv("DIRECT_DATABASE_URL"), c.dsn)
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("instance", c.name)
	if c.dsn == "" {
		log.Error("DATABASE_URL is not set")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, c, log); err != nil {
		log.Error("stopped", "err", err)
		os.Exit(1)
	}
	log.Info("stopped")
}

func run(ctx context.Context, c config, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, c.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Apply(ctx, pool, migrations.DefaultSchema); err != nil {
		return err
	}
	if err := createLedger(ctx, pool); err != nil {
		return err
	}
	records, err := openRecords(c.runs, c.name)
	if err != nil {
		return err
	}
	defer records.close()

	agent, err := liveness.NewAgent(liveness.AgentConfig{
		Pool: pool, DirectDSN: c.directDSN, InstanceID: uuid.New(), ServiceName: "billing",
		Metadata: map[string]any{"name": c.name}, Logger: log,
	})
	if err != nil {
		return err
	}
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		return err
	}

	// One context, ctx, ends everything on SIGTERM. Run keeps the instance alive and the
	// run's lease renewed until the run has returned; it leaves the fleet only then.
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = agent.Run(ctx) })
	wg.Go(func() {
		err := agent.Elect(ctx, liveness.ElectorConfig{
			Lease: invoiceRunLease,
			OnStartedLeading: func(ctx context.Context, self *liveness.Lease) {
				invoiceRun(ctx, c, pool, self, records, log)
			},
			OnStoppedLeading: func(reason error) { log.Info("no longer runs invoices", "reason", reason) },
			OnNewLeader: func(l liveness.Leader) {
				if l.InstanceID == uuid.Nil {
					log.Info("nobody runs invoices")
					return
				}
				log.Info("invoices run by", "instance_id", l.InstanceID, "host", l.Host, "epoch", l.Epoch)
			},
		})
		if err != nil {
			log.Error("campaign ended", "err", err)
		}
	})
	wg.Go(func() { logPeers(ctx, reader, c.peersEvery, log) })
	wg.Wait()
	return runErr
}

// invoiceRun is the singleton job. Until ctx ends it claims a batch of invoices every
// --write-every, with a fenced ledger write, and mails it. Once ctx ends, the batch it
// claimed last is still being mailed: that takes --wind-down and cannot stop halfway
// (the mails go out, outside the database, where no fence can stop them), and then the
// batch is marked mailed, fenced again. Its records bracket everything it does.
func invoiceRun(ctx context.Context, c config, pool *pgxpool.Pool, self *liveness.Lease, records *records, log *slog.Logger) {
	records.write("begin", self.Epoch)
	defer records.write("end", self.Epoch)
	log.Info("invoice run started", "epoch", self.Epoch)
	for ctx.Err() == nil {
		if !writeLedger(ctx, c, pool, self, records, log) {
			return // the lease is lost: another instance may run now; stop at once
		}
		select {
		case <-ctx.Done():
		case <-time.After(c.every):
		}
	}
	// Asked to stop (SIGTERM): the library keeps the lease renewed while the batch in
	// flight is mailed, so no other instance starts a run, and the final write still
	// passes the fence. Had the lease been lost instead, the fence would refuse it.
	log.Info("invoice run winding down", "epoch", self.Epoch, "for", c.windDown, "cause", context.Cause(ctx))
	time.Sleep(c.windDown) // mailing the last batch
	writeLedger(context.WithoutCancel(ctx), c, pool, self, records, log)
}

// writeLedger writes one ledger row under the fence and reports whether the run may go
// on: false once the fence refused, that is once another instance may run. A refusal is
// recorded: it is what the fence is for, and the example's test counts them.
func writeLedger(ctx context.Context, c config, pool *pgxpool.Pool, self *liveness.Lease, records *records, log *slog.Logger) bool {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Refused at the fence or at COMMIT once this run may have been told it lost its
	// lease; a *liveness.FencedError whose Held is true only came too late (a slow
	// network) while the lease is still held, and is not errors.Is ErrLeaseLost.
	_, err := self.Exec(wctx, pool, `INSERT INTO billing_ledger (epoch, instance) VALUES ($1, $2)`, self.Epoch, c.name)
	switch {
	case errors.Is(err, liveness.ErrLeaseLost):
		records.write("rejected", self.Epoch)
		log.Warn("the fence refused a write: this run no longer holds its lease", "epoch", self.Epoch, "err", err)
		return false
	case err != nil && ctx.Err() == nil:
		log.Warn("ledger write failed", "epoch", self.Epoch, "err", err)
	}
	return true
}

// createLedger creates the ledger once, whichever instance starts first.
func createLedger(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('billing-worker:ledger', 0))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS billing_ledger (
			id         bigserial   PRIMARY KEY,
			epoch      bigint      NOT NULL,
			instance   text        NOT NULL,
			written_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
		return err
	})
}

// logPeers logs the billing instances the fleet sees, by the one verdict, until ctx ends.
func logPeers(ctx context.Context, reader *liveness.Reader, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, every)
		peers, err := reader.Instances(qctx, "billing")
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("cannot read the peers", "err", err)
			}
			continue
		}
		alive := 0
		for _, p := range peers {
			if p.State.Alive() {
				alive++
			}
		}
		log.Info("peers", "alive", alive, "rows", len(peers))
	}
}

// records appends one JSON line per event of this instance's runs.
type records struct {
	mu   sync.Mutex
	f    *os.File
	name string
}

// record is one line of the runs' file.
type record struct {
	Event    string `json:"ev"` // begin, end, rejected
	Instance string `json:"instance"`
	Epoch    int64  `json:"epoch"`
	At       int64  `json:"t"` // Unix nanoseconds
}

func openRecords(path, name string) (*records, error) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return &records{f: f, name: name}, nil
}

// write appends the event with the time now. One write call per line, O_APPEND: lines of
// several processes never interleave, and a line written is kept when the process is
// killed.
func (r *records) write(event string, epoch int64) {
	line, _ := json.Marshal(record{Event: event, Instance: r.name, Epoch: epoch, At: time.Now().UnixNano()})
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(append(line, '\n')); err != nil {
		fmt.Fprintln(os.Stderr, "billing-worker: cannot write the runs' record:", err)
	}
}

func (r *records) close() { _ = r.f.Close() }
