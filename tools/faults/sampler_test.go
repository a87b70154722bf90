package faults

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/sampler"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/wait"
)

// How often the verdicts are read: over SQL every 20 ms, so that a false-dead dip of a
// few tens of milliseconds is seen (one statement a sample, whatever the number of
// instances: tools/internal/sampler); the observer exporter's /metrics every 200 ms,
// since each scrape runs every collector, which at 20 ms would load the machine whose
// timing the suite measures.
const (
	sqlEvery = 20 * time.Millisecond
	expEvery = 200 * time.Millisecond
)

// stateAlive says which of the exporter's instance states call an instance alive.
var stateAlive = sampler.StateAlive

// sqlSample is one SQL sample: the watched instances' verdicts and every lease.
type sqlSample = sampler.SQL

// expSample is one scrape of the observer: each watched service's state, "" when the
// exporter shows no instance of it (the row is gone).
type expSample struct {
	At     time.Time
	States map[string]string
}

// verdictLog keeps every verdict read until the test ends (tools/internal/sampler):
// is_instance_alive, pg_locks, the instances row and the leases table over SQL every
// sqlEvery, and the observer's pg_liveness_instances every expEvery. Samples the database
// or the exporter could not answer are dropped: they carry no verdict. The samples only
// grow, in time order.
type verdictLog struct {
	obsURL string

	mu       sync.Mutex
	watched  map[uuid.UUID]string // id → service
	sql      []sqlSample
	exp      []expSample
	failures []string // unknown states and other sampler faults; the test fails on them
}

func startSampler(t *testing.T, dsn string, threshold time.Duration, obs *observer) *verdictLog {
	t.Helper()
	s := &verdictLog{watched: map[uuid.UUID]string{}}
	if obs != nil {
		s.obsURL = obs.url
	}
	ctx, cancel := context.WithCancel(context.Background())
	var done sync.WaitGroup
	done.Go(func() {
		sampler.SQLLoop{
			DSN: dsn, Reader: sampler.NewSQLReader(schema, threshold), Every: sqlEvery, Timeout: time.Second,
			IDs: s.ids,
			Got: func(smp sqlSample) { s.mu.Lock(); s.sql = append(s.sql, smp); s.mu.Unlock() },
		}.Run(ctx)
	})
	if s.obsURL != "" {
		done.Go(func() { s.expLoop(ctx) })
	}
	t.Cleanup(func() {
		cancel()
		done.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, f := range s.failures {
			t.Errorf("sampler: %s", f)
		}
	})
	return s
}

// Watch adds an agent's instances to every sample from now on.
func (s *verdictLog) Watch(a *agent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, id := range a.ids {
		s.watched[id] = a.services[i]
	}
}

func (s *verdictLog) fail(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failures) < 10 {
		s.failures = append(s.failures, fmt.Sprintf(format, args...))
	}
}

func (s *verdictLog) ids() []uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]uuid.UUID, 0, len(s.watched))
	for id := range s.watched {
		ids = append(ids, id)
	}
	return ids
}

func (s *verdictLog) services() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, svc := range s.watched {
		out = append(out, svc)
	}
	return out
}

func (s *verdictLog) expLoop(ctx context.Context) {
	client := &http.Client{Timeout: 2 * time.Second}
	wait.Every(ctx, expEvery, func() {
		e, err := sampler.Scrape(ctx, client, s.obsURL)
		if errors.Is(err, sampler.ErrMalformed) {
			s.fail("%v", err)
		}
		if err != nil || !e.Verdict {
			return
		}
		smp := expSample{At: e.At, States: map[string]string{}}
		for _, svc := range s.services() {
			state, err := e.State(svc)
			if err != nil {
				s.fail("%v", err)
			}
			smp.States[svc] = state
		}
		s.mu.Lock()
		s.exp = append(s.exp, smp)
		s.mu.Unlock()
	})
}

// sqlSamples is the SQL samples so far. They are only ever appended, so the slice is
// shared, not copied: at 50 samples a second, the scans of a long scenario would
// otherwise copy them again and again.
func (s *verdictLog) sqlSamples() []sqlSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sql[:len(s.sql):len(s.sql)]
}

func (s *verdictLog) expSamples() []expSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exp[:len(s.exp):len(s.exp)]
}

// sqlSince is the SQL samples taken after t0, found by bisection.
func (s *verdictLog) sqlSince(t0 time.Time) []sqlSample {
	smps := s.sqlSamples()
	return smps[sort.Search(len(smps), func(i int) bool { return smps[i].At.After(t0) }):]
}

// ---- reading the samples -------------------------------------------------------------

// firstSQL returns how long after t0 the first SQL sample taken after t0 met cond.
func (s *verdictLog) firstSQL(t0 time.Time, cond func(sqlSample) bool) (time.Duration, bool) {
	for _, smp := range s.sqlSince(t0) {
		if cond(smp) {
			return smp.At.Sub(t0), true
		}
	}
	return 0, false
}

// firstExp is firstSQL for the observer's scrapes.
func (s *verdictLog) firstExp(t0 time.Time, cond func(expSample) bool) (time.Duration, bool) {
	for _, smp := range s.expSamples() {
		if smp.At.After(t0) && cond(smp) {
			return smp.At.Sub(t0), true
		}
	}
	return 0, false
}

// instDead is a SQL sample's predicate: is_instance_alive calls id dead.
func instDead(id uuid.UUID) func(sqlSample) bool {
	return func(smp sqlSample) bool { v, ok := smp.Inst[id]; return ok && !v.Alive }
}

// rowGone is a SQL sample's predicate: id's instances row is gone (reaped).
func rowGone(id uuid.UUID) func(sqlSample) bool {
	return func(smp sqlSample) bool { v, ok := smp.Inst[id]; return ok && !v.Row }
}

// leaseHeldBy is a SQL sample's predicate: instance id holds the lease, unexpired.
func leaseHeldBy(name string, id uuid.UUID) func(sqlSample) bool {
	return func(smp sqlSample) bool {
		l, ok := smp.Leases[name]
		return ok && !l.Expired && l.HolderID == id.String()
	}
}

// expDead is a scrape's predicate: the observer does not call the service alive.
func expDead(service string) func(expSample) bool {
	return func(smp expSample) bool { st, ok := smp.States[service]; return ok && !stateAlive[st] }
}

func expState(service, state string) func(expSample) bool {
	return func(smp expSample) bool { return smp.States[service] == state }
}

// falseDead counts, between from and to, every sample in which is_instance_alive or the
// observer called one of the live instances dead.
func (s *verdictLog) falseDead(from, to time.Time, live []*agent) (n int, first string) {
	in := func(at time.Time) bool { return at.After(from) && !at.After(to) }
	for _, smp := range s.sqlSince(from) {
		if !in(smp.At) {
			break
		}
		for _, a := range live {
			for _, id := range a.ids {
				if v, ok := smp.Inst[id]; ok && !v.Alive {
					n++
					if first == "" {
						first = fmt.Sprintf("is_instance_alive(%s) false %s after the fault window opened (lock held: %v, row: %v)",
							id, smp.At.Sub(from).Round(time.Millisecond), v.Locked, v.Row)
					}
				}
			}
		}
	}
	for _, smp := range s.expSamples() {
		if !in(smp.At) {
			continue
		}
		for _, a := range live {
			for _, svc := range a.services {
				if st, ok := smp.States[svc]; ok && !stateAlive[st] {
					n++
					if first == "" {
						first = fmt.Sprintf("exporter state %q for %s %s after the fault window opened",
							st, svc, smp.At.Sub(from).Round(time.Millisecond))
					}
				}
			}
		}
	}
	return n, first
}
