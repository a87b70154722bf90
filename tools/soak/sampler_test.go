package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// stateAlive says which of the exporter's instance states call an instance alive, as the
// fault suite's does. A state not listed is recorded as a failure of the run.
var stateAlive = map[string]bool{
	"alive": true, "lock_only": true, "heartbeat_only": true, "lock_lost": true,
	"stale": false, "zombie": false,
}

// changes records a verdict, holder or alert only when it changes, with the time of the
// last sample that had the old value.
// After a gap (samples that failed), the next value is recorded even when unchanged, so
// that the history shows what was seen after, say, a restart.
type changes struct {
	h    *History
	mu   sync.Mutex
	last map[string]seen
}

type seen struct {
	v     string
	at    int64
	dirty bool // a gap since: record the next value whatever it is
}

func newChanges(h *History) *changes { return &changes{h: h, last: map[string]seen{}} }

// gap marks every key with prefix: the sampler missed a sample of them.
func (c *changes) gap(prefix string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range c.last {
		if strings.HasPrefix(k, prefix) {
			v.dirty = true
			c.last[k] = v
		}
	}
}

// see records e (at now) if value differs from the last one seen under key.
func (c *changes) see(key, value string, e Event) {
	now := time.Now().UnixNano()
	c.mu.Lock()
	old, ok := c.last[key]
	c.last[key] = seen{v: value, at: now}
	c.mu.Unlock()
	if ok && old.v == value && !old.dirty {
		return
	}
	e.T = now
	if ok {
		e.Prev = old.at
	}
	c.h.Add(e)
}

const instancesSQL = `
SELECT id::text,
       {s}.is_instance_alive(id, $2),
       EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
                  AND l.classid = ((({s}.instance_lock_key(id)) >> 32) & 4294967295)::oid
                  AND l.objid = ({s}.instance_lock_key(id) & 4294967295)::oid)
  FROM unnest($1::uuid[]) AS id`

const leasesSQL = `SELECT name, CASE WHEN expires_at < now() THEN '' ELSE holder::text END, epoch FROM {s}.leases`

// sampleSQL reads, every SampleEvery until ctx ends, is_instance_alive and the alive lock
// of each instance ids returns, and the leases' holders. A sample the database cannot
// answer has no verdict and is not recorded.
func sampleSQL(ctx context.Context, dsn, schema string, stale time.Duration, ids func() []string, c *changes, failed func(string)) {
	s := pgx.Identifier{schema}.Sanitize()
	instQ, leaseQ := strings.ReplaceAll(instancesSQL, "{s}", s), strings.ReplaceAll(leasesSQL, "{s}", s)
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(SampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if conn == nil || conn.IsClosed() {
			var err error
			if conn, err = pgx.Connect(qctx, dsn); err != nil {
				conn = nil
				cancel()
				c.gap("sql/")
				c.gap("lock/")
				continue
			}
		}
		err := sampleOnce(qctx, conn, instQ, leaseQ, int(stale.Seconds()), ids(), c)
		cancel()
		if err != nil {
			c.gap("sql/")
			c.gap("lock/")
			conn.Close(context.Background())
			conn = nil
			if strings.Contains(err.Error(), "does not exist") {
				failed(err.Error())
			}
		}
	}
}

func sampleOnce(ctx context.Context, conn *pgx.Conn, instQ, leaseQ string, stale int, ids []string, c *changes) error {
	type row struct {
		id            string
		alive, locked bool
	}
	var got []row
	rows, err := conn.Query(ctx, instQ, ids, stale)
	if err != nil {
		return err
	}
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.alive, &r.locked); err != nil {
			return err
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	type lease struct {
		name, holder string
		epoch        int64
	}
	var ls []lease
	rows, err = conn.Query(ctx, leaseQ)
	if err != nil {
		return err
	}
	for rows.Next() {
		var l lease
		if err := rows.Scan(&l.name, &l.holder, &l.epoch); err != nil {
			return err
		}
		ls = append(ls, l)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	// Recorded only once both reads answered: one sample, one moment.
	for _, r := range got {
		c.see("sql/"+r.id, strconv.FormatBool(r.alive), Event{Kind: EvVerdict, Source: SrcSQL, Inst: r.id, Alive: r.alive})
		c.see("lock/"+r.id, strconv.FormatBool(r.locked), Event{Kind: EvVerdict, Source: SrcLock, Inst: r.id, Alive: r.locked})
	}
	for _, l := range ls {
		if strings.HasPrefix(l.name, "soak-") {
			c.see("holder/"+l.name, l.holder, Event{Kind: EvHolder, Lease: l.name, Inst: l.holder, Epoch: l.epoch})
		}
	}
	return nil
}

var instancesLine = regexp.MustCompile(`^pg_liveness_instances\{([^}]*)\} (\S+)`)
var labelPair = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// scrape reads one exposition into its unlabelled samples and pg_liveness_instances by
// service and state; ok false when the exporter could not read the instances.
func scrape(ctx context.Context, client *http.Client, url string) (plain map[string]float64, inst map[string]map[string]float64, ok bool) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, false
	}
	defer resp.Body.Close()
	plain, inst = map[string]float64{}, map[string]map[string]float64{}
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
			v, _ := strconv.ParseFloat(m[2], 64)
			if inst[labels["service"]] == nil {
				inst[labels["service"]] = map[string]float64{}
			}
			inst[labels["service"]][labels["state"]] += v
			continue
		}
		if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(line, "#") && !strings.Contains(f[0], "{") {
			v, err := strconv.ParseFloat(f[1], 64)
			if err == nil {
				plain[f[0]] = v
			}
		}
	}
	return plain, inst, sc.Err() == nil && plain["pg_liveness_up"] == 1 && instancesOK
}

// sampleExporter reads the observer's verdict on each service every SampleEvery: alive
// when it shows an instance of it in a state that counts as alive.
func sampleExporter(ctx context.Context, url string, services []string, c *changes, failed func(string)) {
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(SampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		_, inst, ok := scrape(ctx, client, url)
		if !ok {
			continue
		}
		for _, svc := range services {
			alive := false
			for st, n := range inst[svc] {
				isAlive, known := stateAlive[st]
				if !known {
					failed(fmt.Sprintf("the exporter reports state %q, which the soak does not know", st))
				}
				if n > 0 && isAlive {
					alive = true
				}
			}
			c.see("exp/"+svc, strconv.FormatBool(alive), Event{Kind: EvVerdict, Source: SrcExporter, Proc: svc, Alive: alive})
		}
	}
}

// sampleResources records the observer's goroutines, open fds and RSS from its own
// /metrics, and its sessions in pg_stat_activity, every resourceEvery.
func sampleResources(ctx context.Context, url, dsn, app string, h *History) {
	const resourceEvery = 2 * time.Second
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(resourceEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if plain, _, ok := scrape(ctx, client, url); ok {
			for name, src := range map[string]string{"go_goroutines": "goroutines", "process_open_fds": "fds", "process_resident_memory_bytes": "rss"} {
				if v, ok := plain[name]; ok {
					h.Add(Event{Kind: EvResource, Source: src, Value: v})
				}
			}
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if conn, err := pgx.Connect(qctx, dsn); err == nil {
			var n int
			if conn.QueryRow(qctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n) == nil {
				h.Add(Event{Kind: EvResource, Source: "conns", Value: float64(n)})
			}
			conn.Close(context.Background())
		}
		cancel()
	}
}

// sampleAlerts records each alert's state in Prometheus (the most severe of its series:
// firing, pending or inactive) whenever it changes.
func sampleAlerts(ctx context.Context, promAddr string, c *changes) {
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	rank := map[string]int{"": 0, "pending": 1, "firing": 2}
	seen := map[string]bool{TwoLeadersAlert: true}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+promAddr+"/api/v1/alerts", nil)
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		var body struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil {
			continue
		}
		state := map[string]string{}
		for _, a := range body.Data.Alerts {
			name := a.Labels["alertname"]
			seen[name] = true
			if rank[a.State] > rank[state[name]] {
				state[name] = a.State
			}
		}
		for name := range seen {
			c.see("alert/"+name, state[name], Event{Kind: EvAlert, Name: name, State: state[name]})
		}
	}
}

// sampleReader reads the Go readers' verdict (liveness.Reader, as a service reads its
// peers) on each instance ids returns, every SampleEvery: an instance it does not list
// is not alive.
func sampleReader(ctx context.Context, dsn string, ids func() []string, c *changes, failed func(string)) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		failed("reader pool: " + err.Error())
		return
	}
	defer pool.Close()
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		failed("reader: " + err.Error())
		return
	}
	tick := time.NewTicker(SampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		all, err := reader.Instances(qctx, "")
		cancel()
		if err != nil {
			continue // no verdict
		}
		alive := map[uuid.UUID]bool{}
		for _, st := range all {
			alive[st.InstanceID] = st.Alive()
		}
		for _, id := range ids() {
			u, err := uuid.Parse(id)
			if err != nil {
				continue
			}
			a := alive[u]
			c.see("reader/"+id, strconv.FormatBool(a), Event{Kind: EvVerdict, Source: SrcReader, Inst: id, Alive: a})
		}
	}
}
