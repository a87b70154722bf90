package collector

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// pg_locks and pg_stat_activity are cluster-wide: every read copies the server's whole
// lock table, whichever database holds the locks. An exporter watching many databases
// of one server (discovery within a server) reads them once per scrape for all of them
// (ReadServerLocks, on any database of the server) and hands each database's collectors
// its part (Config.Locks) instead of each reading pg_locks itself. The instances and
// advisory_locks collectors then send the variants of their statements that take the
// locks as parameters; their verdicts and counts are those of their own read at the
// moment of the snapshot.

// DatabaseLocks is one database's part of its server's advisory locks and client
// backends, as server_advisory_locks read them.
type DatabaseLocks struct {
	// Rows are the advisory-locks statement's rows that need no source: the client
	// backends ("backends") and the locks on two int4 keys, never alive locks ("locks").
	Rows []store.AdvisoryLocksRow
	// The locks on bigint keys, one element each: the key's halves, granted, whether in
	// ExclusiveLock mode, and the backend's pid.
	Classids, Objids   []uint32
	Granted, Exclusive []bool
	Pids               []int32
}

// exclusiveGranted are the key halves and holders of the granted exclusive bigint locks:
// the alive locks the verdict counts (when held by their claimants).
func (d *DatabaseLocks) exclusiveGranted() (classids, objids []uint32, pids []int32) {
	classids, objids, pids = []uint32{}, []uint32{}, []int32{}
	for i := range d.Classids {
		if d.Granted[i] && d.Exclusive[i] {
			classids, objids, pids = append(classids, d.Classids[i]), append(objids, d.Objids[i]), append(pids, d.Pids[i])
		}
	}
	return classids, objids, pids
}

// LocksSource gives one database's part of its server's advisory locks for the scrape
// ctx belongs to. An error makes the collectors read pg_locks themselves for that scrape.
type LocksSource func(ctx context.Context) (*DatabaseLocks, error)

// ReadServerLocks reads, in one statement on q (a session on any database of the
// server), the advisory locks and client backends of the server's databases named
// datnames, by database. A database with neither is absent.
func ReadServerLocks(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, datnames []string) (map[string]*DatabaseLocks, error) {
	query := store.ServerAdvisoryLocks.In("")
	rows, err := q.Query(ctx, query.SQL, query.Args(datnames)...)
	if err != nil {
		return nil, err
	}
	read, err := pgx.CollectRows(rows, pgx.RowToStructByName[store.ServerAdvisoryLocksRow])
	if err != nil {
		return nil, err
	}
	out := map[string]*DatabaseLocks{}
	for _, r := range read {
		d := out[r.Datname]
		if d == nil {
			d = &DatabaseLocks{}
			out[r.Datname] = d
		}
		if r.Kind == "keys" {
			if len(r.Objids) != len(r.Classids) || len(r.Granted) != len(r.Classids) || len(r.Exclusive) != len(r.Classids) ||
				len(r.Pids) != len(r.Classids) {
				return nil, errors.New("server_advisory_locks: a keys row's arrays differ in length")
			}
			d.Classids, d.Objids, d.Granted, d.Exclusive, d.Pids = r.Classids, r.Objids, r.Granted, r.Exclusive, r.Pids
			continue
		}
		d.Rows = append(d.Rows, r.AdvisoryLocksRow)
	}
	return out, nil
}

// scrapeMemo is one scrape's results that several exporters share (the snapshot of a
// server's locks), by key: HandlerOf puts one in each scrape's context.
type scrapeMemo struct {
	mu   sync.Mutex
	runs map[any]*memoRun
}

type memoRun struct {
	done chan struct{}
	val  any
	err  error
}

type scrapeMemoKey struct{}

func withScrapeMemo(ctx context.Context) context.Context {
	return context.WithValue(ctx, scrapeMemoKey{}, &scrapeMemo{runs: map[any]*memoRun{}})
}

// ScrapeOnce returns fn's result for key, fn run once per scrape whoever asks first (the
// others wait for it, or for ctx), under the scrape's deadline. Outside a scrape of
// HandlerOf's it runs fn every time.
func ScrapeOnce(ctx context.Context, key any, fn func(ctx context.Context) (any, error)) (any, error) {
	m, _ := ctx.Value(scrapeMemoKey{}).(*scrapeMemo)
	if m == nil {
		return fn(ctx)
	}
	m.mu.Lock()
	r := m.runs[key]
	first := r == nil
	if first {
		r = &memoRun{done: make(chan struct{})}
		m.runs[key] = r
	}
	m.mu.Unlock()
	if first {
		r.val, r.err = fn(ctx)
		close(r.done)
		return r.val, r.err
	}
	select {
	case <-r.done:
		return r.val, r.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// isUndefinedFunction tells a schema older than the function a statement calls.
func isUndefinedFunction(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42883"
}
