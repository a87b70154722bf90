package faults

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// sampleEvery is how often every verdict is read.
const sampleEvery = 200 * time.Millisecond

// instSample is one instance's verdicts in one SQL sample.
type instSample struct {
	Alive   bool  // is_instance_alive(id, threshold)
	Locked  bool  // its alive lock is granted in pg_locks
	LockPID int32 // the backend holding it, 0 when none
	Row     bool  // its instances row exists
}

type leaseRow struct {
	Holder   string
	HolderID string // the holder's instance id; "" when it recorded none
	Epoch    int64
	Expired  bool
}

type sqlSample struct {
	At     time.Time
	Inst   map[uuid.UUID]instSample
	Leases map[string]leaseRow
}

// expSample is one scrape of the observer: each watched service's state, "" when the
// exporter shows no instance of it (the row is gone).
type expSample struct {
	At     time.Time
	States map[string]string
}

// sampler reads the verdicts every 200 ms until the test ends: is_instance_alive, pg_locks,
// the instances row and the leases table over SQL, and the observer's
// pg_liveness_instances. Samples the database or the exporter could not answer are
// dropped: they carry no verdict.
type sampler struct {
	t         *testing.T
	dsn       string
	threshold int // seconds, for is_instance_alive
	obsURL    string

	mu       sync.Mutex
	watched  map[uuid.UUID]string // id → service
	sql      []sqlSample
	exp      []expSample
	failures []string // unknown states and other sampler faults; the test fails on them
	stop     context.CancelFunc
	done     sync.WaitGroup
}

func startSampler(t *testing.T, dsn string, threshold time.Duration, obs *observer) *sampler {
	t.Helper()
	s := &sampler{t: t, dsn: dsn, threshold: int(threshold / time.Second), watched: map[uuid.UUID]string{}}
	if obs != nil {
		s.obsURL = obs.url
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	s.done.Go(func() { s.sqlLoop(ctx) })
	if s.obsURL != "" {
		s.done.Go(func() { s.expLoop(ctx) })
	}
	t.Cleanup(func() {
		s.stop()
		s.done.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, f := range s.failures {
			t.Errorf("sampler: %s", f)
		}
	})
	return s
}

// Watch adds an agent's instances to every sample from now on.
func (s *sampler) Watch(a *agent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, id := range a.ids {
		s.watched[id] = a.services[i]
	}
}

func (s *sampler) fail(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failures) < 10 {
		s.failures = append(s.failures, fmt.Sprintf(format, args...))
	}
}

func (s *sampler) ids() []uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]uuid.UUID, 0, len(s.watched))
	for id := range s.watched {
		ids = append(ids, id)
	}
	return ids
}

func (s *sampler) services() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, svc := range s.watched {
		out = append(out, svc)
	}
	return out
}

const instancesSQL = `
SELECT id,
       {s}.is_instance_alive(id, $2),
       coalesce((SELECT l.pid FROM pg_catalog.pg_locks l
                  WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                    AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
                    AND l.classid = ((({s}.instance_lock_key(id)) >> 32) & 4294967295)::oid
                    AND l.objid = ({s}.instance_lock_key(id) & 4294967295)::oid
                  LIMIT 1), 0),
       EXISTS (SELECT 1 FROM {s}.instances i WHERE i.instance_id = id)
  FROM unnest($1::uuid[]) AS id`

const leasesSQL = `SELECT name, holder, coalesce(holder_instance_id::text, ''), epoch, expires_at < now() FROM {s}.leases`

func (s *sampler) sqlLoop(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	instQ := strings.ReplaceAll(instancesSQL, "{s}", pgx.Identifier{schema}.Sanitize())
	leaseQ := strings.ReplaceAll(leasesSQL, "{s}", pgx.Identifier{schema}.Sanitize())
	every(ctx, sampleEvery, func() {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if conn == nil || conn.IsClosed() {
			var err error
			if conn, err = pgx.Connect(qctx, s.dsn); err != nil {
				conn = nil
				return
			}
		}
		smp, err := s.sampleSQL(qctx, conn, instQ, leaseQ)
		if err != nil {
			_ = conn.Close(context.Background())
			conn = nil
			return
		}
		s.mu.Lock()
		s.sql = append(s.sql, smp)
		s.mu.Unlock()
	})
}

// every calls f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		f()
	}
}

func (s *sampler) sampleSQL(ctx context.Context, conn *pgx.Conn, instQ, leaseQ string) (sqlSample, error) {
	smp := sqlSample{Inst: map[uuid.UUID]instSample{}, Leases: map[string]leaseRow{}}
	rows, err := conn.Query(ctx, instQ, s.ids(), s.threshold)
	if err != nil {
		return smp, err
	}
	for rows.Next() {
		var id uuid.UUID
		var v instSample
		if err := rows.Scan(&id, &v.Alive, &v.LockPID, &v.Row); err != nil {
			return smp, err
		}
		v.Locked = v.LockPID != 0
		smp.Inst[id] = v
	}
	if err := rows.Err(); err != nil {
		return smp, err
	}
	rows, err = conn.Query(ctx, leaseQ)
	if err != nil {
		return smp, err
	}
	for rows.Next() {
		var name string
		var r leaseRow
		if err := rows.Scan(&name, &r.Holder, &r.HolderID, &r.Epoch, &r.Expired); err != nil {
			return smp, err
		}
		smp.Leases[name] = r
	}
	smp.At = time.Now()
	return smp, rows.Err()
}

var instancesLine = regexp.MustCompile(`^pg_liveness_instances\{([^}]*)\} (\S+)`)
var labelPair = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

func (s *sampler) expLoop(ctx context.Context) {
	client := &http.Client{Timeout: 2 * time.Second}
	every(ctx, sampleEvery, func() {
		if smp, ok := s.scrape(ctx, client); ok {
			s.mu.Lock()
			s.exp = append(s.exp, smp)
			s.mu.Unlock()
		}
	})
}

// scrape reads one exposition; false when the exporter could not read the instances
// (pg_liveness_up 0 or the instances collector failed): such a scrape has no verdict.
func (s *sampler) scrape(ctx context.Context, client *http.Client) (expSample, bool) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.obsURL, nil)
	resp, err := client.Do(req)
	if err != nil {
		return expSample{}, false
	}
	defer resp.Body.Close()
	counts := map[string]map[string]float64{}
	up, instancesOK := false, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "pg_liveness_up 1":
			up = true
		case line == `pg_liveness_scrape_collector_success{collector="instances"} 1`:
			instancesOK = true
		}
		m := instancesLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, lp := range labelPair.FindAllStringSubmatch(m[1], -1) {
			labels[lp[1]] = lp[2]
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			s.fail("unparsable sample %q", line)
			continue
		}
		if counts[labels["service"]] == nil {
			counts[labels["service"]] = map[string]float64{}
		}
		counts[labels["service"]][labels["state"]] += v
	}
	if sc.Err() != nil || !up || !instancesOK {
		return expSample{}, false
	}
	smp := expSample{At: time.Now(), States: map[string]string{}}
	for _, svc := range s.services() {
		state := ""
		for st, n := range counts[svc] {
			if _, known := stateAlive[st]; !known {
				s.fail("the exporter reports state %q, which the suite does not know: add it to stateAlive", st)
			}
			if n == 0 {
				continue
			}
			if state != "" || n != 1 {
				s.fail("service %s has more than one instance in the exporter: %v", svc, counts[svc])
			}
			state = st
		}
		smp.States[svc] = state
	}
	return smp, true
}

func (s *sampler) sqlSamples() []sqlSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sqlSample(nil), s.sql...)
}

func (s *sampler) expSamples() []expSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]expSample(nil), s.exp...)
}

// ---- reading the samples -------------------------------------------------------------

// firstSQL returns how long after t0 the first SQL sample taken after t0 met cond.
func (s *sampler) firstSQL(t0 time.Time, cond func(sqlSample) bool) (time.Duration, bool) {
	for _, smp := range s.sqlSamples() {
		if smp.At.After(t0) && cond(smp) {
			return smp.At.Sub(t0), true
		}
	}
	return 0, false
}

// firstExp is firstSQL for the observer's scrapes.
func (s *sampler) firstExp(t0 time.Time, cond func(expSample) bool) (time.Duration, bool) {
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

// expDead is a scrape's predicate: the observer does not call the service alive.
func expDead(service string) func(expSample) bool {
	return func(smp expSample) bool { st, ok := smp.States[service]; return ok && !stateAlive[st] }
}

func expState(service, state string) func(expSample) bool {
	return func(smp expSample) bool { return smp.States[service] == state }
}

// falseDead counts, between from and to, every sample in which is_instance_alive or the
// observer called one of the live instances dead.
func (s *sampler) falseDead(from, to time.Time, live []*agent) (n int, first string) {
	in := func(at time.Time) bool { return at.After(from) && !at.After(to) }
	for _, smp := range s.sqlSamples() {
		if !in(smp.At) {
			continue
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
