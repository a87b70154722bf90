package soak

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/sampler"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/wait"
)

// changes records a verdict, holder or alert only when it changes: with the times the
// sample that saw the new value was sent (From) and answered (T), and those of the last
// sample that had the old one (PrevFrom, Prev). After a gap (samples that failed), and
// after every heal, the next value is recorded even when unchanged, so that the history
// shows what was seen after, say, a restart, and the checker finds each instance's first
// verdict after a heal.
type changes struct {
	h    *History
	mu   sync.Mutex
	last map[string]seen
}

type seen struct {
	v         string
	from, at  int64
	dirtyFrom int64 // > 0: record the next sample sent at or after it, whatever its value
}

func newChanges(h *History) *changes { return &changes{h: h, last: map[string]seen{}} }

// gap marks every key with prefix: the sampler missed a sample of them.
func (c *changes) gap(prefix string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range c.last {
		if strings.HasPrefix(k, prefix) {
			v.dirtyFrom = max(v.dirtyFrom, 1)
			c.last[k] = v
		}
	}
}

// resample marks every key: the next sample of each sent at or after t is recorded.
func (c *changes) resample(t int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range c.last {
		v.dirtyFrom = max(v.dirtyFrom, t)
		c.last[k] = v
	}
}

// see records e (sent at from, answered at at) if value differs from the last one seen
// under key, or the key is marked.
func (c *changes) see(key, value string, from, at time.Time, e Event) {
	f, a := from.UnixNano(), at.UnixNano()
	c.mu.Lock()
	old, ok := c.last[key]
	record := !ok || old.v != value || (old.dirtyFrom > 0 && f >= old.dirtyFrom)
	next := seen{v: value, from: f, at: a, dirtyFrom: old.dirtyFrom}
	if record {
		next.dirtyFrom = 0
	}
	c.last[key] = next
	c.mu.Unlock()
	if !record {
		return
	}
	e.T, e.From = a, f
	if ok {
		e.Prev, e.PrevFrom = old.at, old.from
	}
	c.h.Add(e)
}

// gaps records a source's gaps: samples answered more than GapLimit apart.
type gaps struct {
	h      *History
	source string
	last   time.Time
}

func newGaps(h *History, source string) *gaps { return &gaps{h: h, source: source, last: time.Now()} }

// answered notes a sample answered at at.
func (g *gaps) answered(at time.Time) {
	if at.Sub(g.last) > GapLimit(g.source) {
		g.h.Add(Event{Kind: EvGap, Source: g.source, Prev: g.last.UnixNano(), T: at.UnixNano()})
	}
	g.last = at
}

// sampleSQL reads, every SQLSampleEvery until ctx ends, is_instance_alive and the alive
// lock of each instance ids returns, and the jobs' leases' holders, in one statement. A sample
// the database cannot answer has no verdict and is not recorded.
func sampleSQL(ctx context.Context, dsn, schema string, stale time.Duration, ids func() []string, c *changes, failed func(string)) {
	g := newGaps(c.h, SrcSQL)
	sampler.SQLLoop{
		DSN: dsn, Reader: sampler.NewSQLReader(schema, stale).Leases("soak-%"), Every: SQLSampleEvery, Timeout: 2 * time.Second,
		IDs: func() []uuid.UUID {
			var out []uuid.UUID
			for _, id := range ids() {
				if u, err := uuid.Parse(id); err == nil {
					out = append(out, u)
				}
			}
			return out
		},
		Got: func(smp sampler.SQL) {
			g.answered(smp.At)
			for u, v := range smp.Inst {
				id := u.String()
				// Every change of state, not only of alive: the false-dead check takes a proof
				// of life only from a state that stands on the process's own evidence.
				c.see("sql/"+id, strconv.FormatBool(v.Alive)+"/"+v.State, smp.From, smp.At, Event{Kind: EvVerdict, Source: SrcSQL, Inst: id, Alive: v.Alive, Note: v.State})
				c.see("lock/"+id, strconv.FormatBool(v.Locked), smp.From, smp.At, Event{Kind: EvVerdict, Source: SrcLock, Inst: id, Alive: v.Locked})
			}
			for name, l := range smp.Leases {
				c.see("holder/"+name, l.LiveHolder(), smp.From, smp.At, Event{Kind: EvHolder, Lease: name, Inst: l.LiveHolder(), Epoch: l.Epoch})
			}
		},
		Missed: func(err error) {
			c.gap("sql/")
			c.gap("lock/")
			if strings.Contains(err.Error(), "does not exist") {
				failed(err.Error())
			}
		},
	}.Run(ctx)
}

// sampleExporter reads the observer's verdict on each service every ExporterSampleEvery:
// alive when it shows an instance of it in a state that counts as alive.
func sampleExporter(ctx context.Context, url string, services []string, c *changes, failed func(string)) {
	client := &http.Client{Timeout: 2 * time.Second}
	g := newGaps(c.h, SrcExporter)
	wait.Every(ctx, ExporterSampleEvery, func() {
		from := time.Now()
		e, err := sampler.Scrape(ctx, client, url)
		if errors.Is(err, sampler.ErrMalformed) {
			failed(err.Error())
		}
		if err != nil || !e.Verdict {
			c.gap("exp/")
			return
		}
		g.answered(e.At)
		for _, svc := range services {
			alive, err := e.Alive(svc)
			if err != nil {
				failed(err.Error())
			}
			c.see("exp/"+svc, strconv.FormatBool(alive), from, e.At, Event{Kind: EvVerdict, Source: SrcExporter, Proc: svc, Alive: alive})
		}
	})
}

// sampleResources records the observer's goroutines, open fds and RSS from its own
// /metrics, and its sessions in pg_stat_activity, every resourceEvery.
func sampleResources(ctx context.Context, url, dsn, app string, h *History) {
	const resourceEvery = 2 * time.Second
	client := &http.Client{Timeout: 2 * time.Second}
	wait.Every(ctx, resourceEvery, func() {
		if e, err := sampler.Scrape(ctx, client, url); err == nil && e.Verdict {
			for name, src := range map[string]string{"go_goroutines": "goroutines", "process_open_fds": "fds", "process_resident_memory_bytes": "rss"} {
				if v, ok := e.Plain[name]; ok {
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
	})
}

// sampleAlerts records each alert's state in Prometheus (the most severe of its series:
// firing, pending or inactive) whenever it changes. A firing two-leaders alert also
// records its series (the lease, and the value: a count of processes, or the lowest
// epoch a process reports), so that the history says which lease it was about.
func sampleAlerts(ctx context.Context, promAddr string, c *changes) {
	client := &http.Client{Timeout: 2 * time.Second}
	seen := map[string]bool{TwoLeadersAlert: true}
	wait.Every(ctx, time.Second, func() {
		from := time.Now()
		alerts, err := sampler.ActiveAlerts(ctx, client, promAddr)
		if err != nil {
			return
		}
		state := sampler.AlertStates(alerts)
		var series []string
		for _, a := range alerts {
			name := a.Labels["alertname"]
			seen[name] = true
			if name == TwoLeadersAlert && a.State == "firing" {
				series = append(series, fmt.Sprintf("lease=%s value=%s", a.Labels["lease"], a.Value))
			}
		}
		sort.Strings(series)
		for name := range seen {
			e := Event{Kind: EvAlert, Name: name, State: state[name]}
			if name == TwoLeadersAlert {
				e.Note = strings.Join(series, "; ")
			}
			c.see("alert/"+name, state[name], from, time.Now(), e)
		}
	})
}

// sampleReader reads the Go readers' verdict (liveness.Reader, as a service reads its
// peers) on each instance ids returns, every ReaderSampleEvery: an instance it does not
// list is not alive.
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
	g := newGaps(c.h, SrcReader)
	wait.Every(ctx, ReaderSampleEvery, func() {
		watched := ids() // before the read: an instance started after it is not judged by it
		from := time.Now()
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		all, err := reader.Instances(qctx, "")
		cancel()
		at := time.Now()
		if err != nil {
			c.gap("reader/")
			return // no verdict
		}
		g.answered(at)
		alive := map[uuid.UUID]bool{}
		for _, st := range all {
			alive[st.InstanceID] = st.State.Alive()
		}
		for _, id := range watched {
			u, err := uuid.Parse(id)
			if err != nil {
				continue
			}
			a := alive[u]
			c.see("reader/"+id, strconv.FormatBool(a), from, at, Event{Kind: EvVerdict, Source: SrcReader, Inst: id, Alive: a})
		}
	})
}
