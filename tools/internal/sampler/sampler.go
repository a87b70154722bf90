// Package sampler reads the verdicts that the fault suite (tools/faults) and the soak
// (tools/soak) check, the way each consumer reads them: over SQL is_instance_alive, the
// alive lock in pg_locks, the instances row and the leases table; the observer
// exporter's pg_liveness_instances on its /metrics; Prometheus' active alerts. Each source
// is read every so often by a loop that hands what it read to a callback: what is kept of
// a sample (every sample, or only a change) is the caller's concern.
//
// A read the source could not answer (the server restarting, the exporter unable to read
// the instances) carries no verdict: the loops report it as missed, never as a sample.
package sampler

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/wait"
)

// StateAlive is the one place that says which of the exporter's instance states call an
// instance alive. A state not listed here is an error of the scrape: a new state must be
// placed on one side deliberately.
var StateAlive = map[string]bool{
	"alive":          true,
	"lock_only":      true,
	"heartbeat_only": true,
	"lock_lost":      true, // the lock vanished, still within the grace for proof of life
	"stale":          false,
	"zombie":         false,
}

// ---- SQL -----------------------------------------------------------------------------

// Instance is one instance's verdicts in one SQL sample.
type Instance struct {
	Alive   bool   // is_instance_alive(id, stale threshold)
	State   string // its state by the same rule ("" without a row)
	Locked  bool   // its alive lock is granted in pg_locks
	LockPID int32  // the backend holding it, 0 when none
	Row     bool   // its instances row exists
}

// Lease is one row of the leases table.
type Lease struct {
	Holder   string
	HolderID string // the holder's instance id; "" when it recorded none
	Epoch    int64
	Expired  bool // expires_at is past
}

// LiveHolder is the lease's holder, "" when the lease has expired.
func (l Lease) LiveHolder() string {
	if l.Expired {
		return ""
	}
	return l.Holder
}

// SQL is one sample over SQL: the watched instances and every lease, read in one
// statement, sent at From and answered at At.
type SQL struct {
	From, At time.Time
	Inst     map[uuid.UUID]Instance
	Leases   map[string]Lease
}

// sampleSQL is one sample in one statement, whatever the number of instances: the
// verdicts of every instance through instance_states(stale threshold), which is what
// is_instance_alive(id, stale threshold) reads for one (it stamps the vanished locks
// first, as any participating caller's read does), each watched instance's granted
// alive lock in one read of pg_locks, whether its row exists, and every lease. Rows of
// kind 'i' are instances, 'l' leases.
const sampleSQL = `
WITH v AS MATERIALIZED (
       SELECT s.instance_id, s.alive, s.state FROM {s}.instance_states(make_interval(secs => $2)) s),
     k AS MATERIALIZED (
       SELECT l.classid, l.objid, l.pid FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()))
SELECT 'i', id::text, coalesce(v.alive, false), coalesce(v.state, ''),
       coalesce((SELECT k.pid FROM k
                  WHERE k.classid = ((({s}.instance_lock_key(id)) >> 32) & 4294967295)::oid
                    AND k.objid = ({s}.instance_lock_key(id) & 4294967295)::oid
                  LIMIT 1), 0),
       EXISTS (SELECT 1 FROM {s}.instances i WHERE i.instance_id = id),
       '', '', 0::bigint, false
  FROM unnest($1::uuid[]) AS id LEFT JOIN v ON v.instance_id = id
UNION ALL
SELECT 'l', name, false, '', 0, false, holder, coalesce(holder_instance_id::text, ''), epoch, expires_at < now()
  FROM {s}.leases WHERE name LIKE $3`

// SQLReader reads SQL samples of the liveness objects in one schema.
type SQLReader struct {
	q         string
	stale     int    // seconds, for is_instance_alive
	leaseLike string // the leases read: a LIKE pattern of their names
}

// NewSQLReader reads the objects in schema, with is_instance_alive at the stale threshold
// (whole seconds), and every lease.
func NewSQLReader(schema string, stale time.Duration) *SQLReader {
	return &SQLReader{q: strings.ReplaceAll(sampleSQL, "{s}", pgx.Identifier{schema}.Sanitize()), stale: int(stale / time.Second), leaseLike: "%"}
}

// Leases reads only the leases whose names match the LIKE pattern like.
func (r *SQLReader) Leases(like string) *SQLReader {
	r.leaseLike = like
	return r
}

// Read takes one sample of the instances ids and of every lease on conn, in one
// statement.
func (r *SQLReader) Read(ctx context.Context, conn *pgx.Conn, ids []uuid.UUID) (SQL, error) {
	smp := SQL{From: time.Now(), Inst: map[uuid.UUID]Instance{}, Leases: map[string]Lease{}}
	rows, err := conn.Query(ctx, r.q, ids, r.stale, r.leaseLike)
	if err != nil {
		return smp, err
	}
	for rows.Next() {
		var kind, key string
		var v Instance
		var l Lease
		if err := rows.Scan(&kind, &key, &v.Alive, &v.State, &v.LockPID, &v.Row, &l.Holder, &l.HolderID, &l.Epoch, &l.Expired); err != nil {
			return smp, err
		}
		if kind == "l" {
			smp.Leases[key] = l
			continue
		}
		id, err := uuid.Parse(key)
		if err != nil {
			return smp, err
		}
		v.Locked = v.LockPID != 0
		smp.Inst[id] = v
	}
	if err := rows.Err(); err != nil {
		return smp, err
	}
	smp.At = time.Now()
	return smp, nil
}

// SQLLoop samples every Every until the context ends, on a connection of its own to DSN
// that it opens again after a failure.
type SQLLoop struct {
	DSN     string
	Reader  *SQLReader
	Every   time.Duration
	Timeout time.Duration      // of one sample, connecting included
	IDs     func() []uuid.UUID // the instances to read, asked before each sample
	Got     func(SQL)          // a sample
	Missed  func(error)        // a sample the database did not answer; may be nil
}

// Run samples until ctx ends, then closes its connection.
func (l SQLLoop) Run(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	// A read cut short because the loop itself is ending missed nothing.
	missed := func(err error) {
		if l.Missed != nil && ctx.Err() == nil {
			l.Missed(err)
		}
	}
	wait.Every(ctx, l.Every, func() {
		qctx, cancel := context.WithTimeout(ctx, l.Timeout)
		defer cancel()
		if conn == nil || conn.IsClosed() {
			var err error
			if conn, err = pgx.Connect(qctx, l.DSN); err != nil {
				conn = nil
				missed(err)
				return
			}
		}
		smp, err := l.Reader.Read(qctx, conn, l.IDs())
		if err != nil {
			_ = conn.Close(context.Background())
			conn = nil
			missed(err)
			return
		}
		l.Got(smp)
	})
}

// ---- the exporter's /metrics ---------------------------------------------------------

// Exposition is one scrape of an exporter's /metrics.
type Exposition struct {
	At time.Time
	// Plain holds the samples without labels, by metric name.
	Plain map[string]float64
	// Instances is pg_liveness_instances summed by service and state.
	Instances map[string]map[string]float64
	// Verdict is false when the exporter could not read the instances (pg_liveness_up 0,
	// or the instances collector failed): such a scrape says nothing of them.
	Verdict bool
}

var (
	instancesLine = regexp.MustCompile(`^pg_liveness_instances\{([^}]*)\} (\S+)`)
	labelPair     = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)
)

// ErrMalformed is the error of a sample of pg_liveness_instances that does not parse.
var ErrMalformed = errors.New("unparsable sample")

// Scrape reads one exposition from url. An error is a scrape that failed, or one with a
// sample of pg_liveness_instances that does not parse (ErrMalformed).
func Scrape(ctx context.Context, client *http.Client, url string) (Exposition, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Exposition{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return Exposition{}, err
	}
	defer resp.Body.Close()
	e := Exposition{Plain: map[string]float64{}, Instances: map[string]map[string]float64{}}
	instancesOK := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == `pg_liveness_scrape_collector_success{collector="instances"} 1` {
			instancesOK = true
		}
		if m := instancesLine.FindStringSubmatch(line); m != nil {
			labels := map[string]string{}
			for _, lp := range labelPair.FindAllStringSubmatch(m[1], -1) {
				labels[lp[1]] = lp[2]
			}
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				return Exposition{}, fmt.Errorf("%w: %q", ErrMalformed, line)
			}
			svc := labels["service"]
			if e.Instances[svc] == nil {
				e.Instances[svc] = map[string]float64{}
			}
			e.Instances[svc][labels["state"]] += v
			continue
		}
		if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(line, "#") && !strings.Contains(f[0], "{") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				e.Plain[f[0]] = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Exposition{}, err
	}
	e.At = time.Now()
	e.Verdict = e.Plain["pg_liveness_up"] == 1 && instancesOK
	return e, nil
}

// ErrUnknownState is the error of a state that StateAlive does not list.
var ErrUnknownState = errors.New("the exporter reports a state that StateAlive does not list")

// Alive says whether the exposition shows an instance of service in a state that counts
// as alive.
func (e Exposition) Alive(service string) (bool, error) {
	alive := false
	for st, n := range e.Instances[service] {
		isAlive, known := StateAlive[st]
		if !known {
			return false, fmt.Errorf("%w: %q", ErrUnknownState, st)
		}
		if n > 0 && isAlive {
			alive = true
		}
	}
	return alive, nil
}

// State is the state of service's one instance, "" when the exposition shows none; an
// error when it shows more than one or a state StateAlive does not list.
func (e Exposition) State(service string) (string, error) {
	state := ""
	for st, n := range e.Instances[service] {
		if _, known := StateAlive[st]; !known {
			return "", fmt.Errorf("%w: %q", ErrUnknownState, st)
		}
		if n == 0 {
			continue
		}
		if state != "" || n != 1 {
			return "", fmt.Errorf("service %s has more than one instance in the exporter: %v", service, e.Instances[service])
		}
		state = st
	}
	return state, nil
}

// ---- Prometheus' alerts --------------------------------------------------------------

// Alert is one active series of an alert rule in Prometheus.
type Alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"` // "pending" or "firing"
	Value  string            `json:"value"` // the expression's value when it was last evaluated
}

// ActiveAlerts reads Prometheus' active alerts, a series each (GET /api/v1/alerts on
// addr).
func ActiveAlerts(ctx context.Context, client *http.Client, addr string) ([]Alert, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api/v1/alerts", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []Alert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("GET /api/v1/alerts: status %q", body.Status)
	}
	return body.Data.Alerts, nil
}

// Alerts is ActiveAlerts by alert name: the most advanced state among its series,
// "firing" over "pending". An alert not active is absent.
func Alerts(ctx context.Context, client *http.Client, addr string) (map[string]string, error) {
	alerts, err := ActiveAlerts(ctx, client, addr)
	if err != nil {
		return nil, err
	}
	return AlertStates(alerts), nil
}

// AlertStates is each alert's most severe state among its series (firing over pending).
func AlertStates(alerts []Alert) map[string]string {
	rank := map[string]int{"pending": 1, "firing": 2}
	state := map[string]string{}
	for _, a := range alerts {
		name := a.Labels["alertname"]
		if rank[a.State] > rank[state[name]] {
			state[name] = a.State
		}
	}
	return state
}
