// Package status serves the exporter's status page, /status (HTML) and /status.json:
// who is alive and who holds what, right now, for a person at 3 a.m. whose Grafana may
// be the thing that is down.
//
// Everything comes from the data layer's statements (package store), which the rest of
// the exporter runs too, rendered for the one source the binary parsed: instance states
// and lease holders from read_fleet (the one verdict, evaluated once per page, as
// liveness.Reader.Fleet reads it), advisory-lock holders from the advisory-locks
// statement the collector sends, what happened over the last day from the history
// (history_recent: each lease's leaderships and the gaps between them, each instance's
// life; history.go), and the local agent from its snapshot. It imports no
// other view: of the liveness package only the agent's snapshot. At the budget's scale (10,000 instances, 1,000 leases)
// the page aggregates per service and shows one page of instances, problems first, one
// page of leases, and a bounded history (MaxHistoryEvents rows).
//
// Every value from the database (service, host and lease names, metadata, application
// names) is made valid UTF-8 and goes through html/template's contextual escaping, and a
// Content-Security-Policy allows only the page's own script and style; long values are
// shortened in the HTML with the whole value behind them. Nothing shows a DSN or a
// password; a database error is shown redacted. Query parameters are checked before any
// statement (a bad one is a 400 naming it).
//
// The page shares the exporter's pool with /metrics and must never cost a scrape its
// latency: load.go bounds what it reads and renders, and answers 429 beyond that (503
// when what it waits for is the database).
package status

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// Page sizes and caps. They bound the page's weight whatever the fleet's size.
const (
	InstancesPerPage = 100
	LeasesPerPage    = 100
	maxServicesShown = 50
	maxAppsShown     = 50
	maxMetadataShown = 160 // characters of an instance's metadata in the HTML table
	maxNameShown     = 80  // characters of a service, host, lease or application name there

	// DefaultRefresh is how often the page reloads itself; ?refresh=N overrides it
	// (0: never).
	DefaultRefresh = 5 * time.Second
	maxRefresh     = time.Hour
	queryTimeout   = 10 * time.Second
)

// Config is what the status page reads.
type Config struct {
	// DB runs the page's statements: read_fleet (instances and leases), the
	// advisory-locks statement and history_recent.
	DB store.Querier
	// Source is where instances are read from and alive locks matched, the one the
	// collectors read (nil: this project's schema with every default).
	Source *store.Source
	// Agent is the local agent; nil when the exporter runs as an observer only.
	Agent AgentSource
	// NodeAgent is the node agent (--node-agent.socket); nil without.
	NodeAgent NodeAgentSource
	// Status is the binary's view of the schema; nil leaves that line out.
	Status store.StatusSource
	Logger *slog.Logger
}

// AgentSource is the local agent, as the agent collector reads it.
type AgentSource interface {
	Snapshot() liveness.AgentSnapshot
}

// NodeAgentSource is the node agent, as its collector reads it.
type NodeAgentSource interface {
	Snapshot() nodeagent.Snapshot
}

// Handler serves /status and /status.json (the path's suffix decides).
type Handler struct {
	cfg     Config
	fleet   store.Query // read_fleet, for the source
	locks   store.Query // advisory_locks, for the source
	history store.Query // history_recent, in the source's schema
	log     *slog.Logger
	load    *limiter
}

// New returns the page's handler.
func New(cfg Config) (*Handler, error) {
	if cfg.DB == nil {
		return nil, errors.New("status: Config.DB must not be nil")
	}
	return &Handler{cfg: cfg, fleet: store.ReadFleet.For(cfg.Source), locks: store.AdvisoryLocks.For(cfg.Source),
		history: store.HistoryRecent.In(cfg.Source.Schema()),
		log:     cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)), load: newLimiter()}, nil
}

// Page is everything the page shows; /status.json is this, encoded.
type Page struct {
	GeneratedAt time.Time   `json:"generated_at"` // by the database clock; the local clock if it did not answer
	Database    string      `json:"database,omitempty"`
	InRecovery  bool        `json:"in_recovery"`
	Errors      []string    `json:"errors,omitempty"`
	Schema      *SchemaView `json:"schema,omitempty"`

	Services      []ServiceView  `json:"services"`
	Instances     InstancesView  `json:"instances"`
	Leases        LeasesView     `json:"leases"`
	AdvisoryLocks *LocksView     `json:"advisory_locks,omitempty"`
	History       *HistoryView   `json:"history,omitempty"` // nil when the instances could not be read
	Agent         *AgentView     `json:"agent,omitempty"`
	NodeAgent     *NodeAgentView `json:"node_agent,omitempty"`
}

// SchemaView is how the binary stands with the schema.
type SchemaView struct {
	Version       int  `json:"version"`
	BinaryVersion int  `json:"binary_version"`
	Compatible    bool `json:"compatible"`
	AgentStarted  bool `json:"agent_started"`
}

// ServiceView counts one service's instances by state.
type ServiceView struct {
	Name                      string         `json:"name"`
	Counts                    map[string]int `json:"counts"` // every state, zeros included
	Total                     int            `json:"total"`
	Dead                      int            `json:"dead"`     // stale + zombie
	Problems                  int            `json:"problems"` // dead + lock_lost + lock_only
	OldestHeartbeatAgeSeconds float64        `json:"oldest_heartbeat_age_seconds"`
}

// InstancesView is one page of instances.
type InstancesView struct {
	Service    string         `json:"service,omitempty"`     // the filter
	InstanceID string         `json:"instance_id,omitempty"` // the filter
	Page       int            `json:"page"`
	PageSize   int            `json:"page_size"`
	Total      int            `json:"total"`
	Rows       []InstanceView `json:"rows"`
}

// InstanceView is one instance.
type InstanceView struct {
	InstanceID          string          `json:"instance_id"`
	Service             string          `json:"service"`
	Host                string          `json:"host"`
	ProcessID           int             `json:"process_id"`
	State               string          `json:"state"`
	Alive               bool            `json:"alive"`
	Problem             bool            `json:"problem"`
	LockHeld            bool            `json:"alive_lock_held"`
	Mode                string          `json:"mode"`
	HeartbeatAgeSeconds float64         `json:"heartbeat_age_seconds"`
	LastHeartbeat       time.Time       `json:"last_heartbeat"`
	StartedAt           time.Time       `json:"started_at"`
	Timing              TimingView      `json:"timing"`
	Metadata            json.RawMessage `json:"metadata"`
}

// TimingView is an instance's recorded timing in seconds; null where it recorded none
// (the observers' defaults apply).
type TimingView struct {
	HeartbeatInterval     *float64 `json:"heartbeat_interval_seconds"`
	HeartbeatSlowInterval *float64 `json:"heartbeat_slow_interval_seconds"`
	StaleThreshold        *float64 `json:"stale_threshold_seconds"`
	DefinitiveDeadCutoff  *float64 `json:"definitive_dead_cutoff_seconds"`
	LockGrace             *float64 `json:"lock_grace_seconds"`
}

// LeasesView is one page of leases.
type LeasesView struct {
	Name     string      `json:"name,omitempty"` // the filter
	Page     int         `json:"page"`
	PageSize int         `json:"page_size"`
	Total    int         `json:"total"`
	Rows     []LeaseView `json:"rows"`
}

// LeaseView is one lease.
type LeaseView struct {
	Name             string    `json:"name"`
	Held             bool      `json:"held"`
	HolderInstanceID string    `json:"holder_instance_id,omitempty"`
	HolderHost       string    `json:"holder_host"`
	HolderService    string    `json:"holder_service,omitempty"`
	HolderState      string    `json:"holder_state,omitempty"` // empty: unknown or gone
	Epoch            int64     `json:"epoch"`
	TakenAt          time.Time `json:"taken_at"` // the last acquisition
	HeldForSeconds   float64   `json:"held_for_seconds"`
	ExpiresAt        time.Time `json:"expires_at"`
	ExpiresInSeconds float64   `json:"expires_in_seconds"` // negative once expired
}

// LocksView is the advisory-locks section.
type LocksView struct {
	AliveLocksGranted int       `json:"alive_locks_granted"`
	AliveLocksWaiting int       `json:"alive_locks_waiting"`
	OtherGranted      int       `json:"other_granted"`
	OtherWaiting      int       `json:"other_waiting"`
	Applications      []AppView `json:"applications"`
}

// AppView is one application's client backends.
type AppView struct {
	Name                     string         `json:"application_name"`
	Backends                 int            `json:"backends"`
	ByState                  map[string]int `json:"backends_by_state"`
	HoldersByState           map[string]int `json:"lock_holders_by_state"`
	IdleHolders              int            `json:"idle_holders"`
	Waiters                  int            `json:"waiters"`
	IdleHolderMaxSeconds     float64        `json:"idle_holder_max_seconds"`
	PoolStarvationSignature  bool           `json:"pool_starvation_signature"`
	AliveLockSessions        bool           `json:"alive_lock_sessions"` // "<service>:alive-lock": idle holders by design
	IdleHolderShareOfBackend float64        `json:"idle_holder_share"`
}

// AgentView is the exporter's own agent.
type AgentView struct {
	InstanceID               string           `json:"instance_id"`
	Service                  string           `json:"service"`
	Mode                     string           `json:"mode"`
	AliveLockHeld            bool             `json:"alive_lock_held"`
	DuplicateInstance        bool             `json:"duplicate_instance"`
	HeartbeatIntervalSeconds float64          `json:"heartbeat_interval_seconds"` // the cadence chosen on the last tick
	Heartbeats               uint64           `json:"heartbeats"`
	HeartbeatFailures        uint64           `json:"heartbeat_failures"`
	LastHeartbeat            *time.Time       `json:"last_heartbeat,omitempty"`
	AliveLockReconnects      uint64           `json:"alive_lock_reconnects"`
	InstancesReaped          uint64           `json:"instances_reaped"`
	Leases                   []AgentLeaseView `json:"leases"`
	Shards                   []ShardSetView   `json:"shard_sets"`
}

// ShardSetView is one shard set the agent takes part in (Agent.Shards).
type ShardSetView struct {
	Set      string `json:"set"`
	Members  int    `json:"members"`
	Shards   int    `json:"shards"`
	Owned    int    `json:"owned"`
	Acquired uint64 `json:"acquired"`
	Released uint64 `json:"released"`
	Lost     uint64 `json:"lost"`
}

// NodeAgentView is the node agent this exporter runs (--node-agent.socket,
// --node-agent.listen-address).
type NodeAgentView struct {
	Socket        string `json:"socket"`
	ListenAddress string `json:"listen_address"`
	SessionUp     bool   `json:"session_up"`
	Listening     bool   `json:"listening"`
	Attached      int    `json:"attached_processes"`
	LocksHeld     int    `json:"locks_held"`
	Reconnects    uint64 `json:"session_reconnects"`
	Refused       uint64 `json:"attaches_refused"`
}

// AgentLeaseView is one lease the agent uses.
type AgentLeaseView struct {
	Name  string            `json:"name"`
	Held  bool              `json:"held"`
	Epoch int64             `json:"epoch,omitempty"`
	Lost  map[string]uint64 `json:"lost"`
}

// query is the page's parameters.
type query struct {
	service, lease  string
	instance        uuid.UUID
	page, leasePage int
	refresh         time.Duration
	history         time.Duration // the history's window
	historyPage     int
}

// params are the parameters the page takes; any other is refused, so that a typo
// (?servce=x) does not silently show everything.
var params = []string{"service", "instance", "lease", "page", "lease_page", "refresh", "history", "history_page"}

// parseQuery reads the raw query string; an error is one line that names the parameter
// that is wrong. It runs before any statement: a value the database would refuse (a NUL
// byte, invalid UTF-8) must be a 400 naming the parameter, never a 503 that reads as a
// database outage. url.Values would silently drop a malformed escape (?service=%zz) and
// show every service instead.
func parseQuery(raw string) (query, error) {
	q := query{page: 1, leasePage: 1, refresh: DefaultRefresh, history: DefaultHistoryWindow, historyPage: 1}
	v := map[string]string{}
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" {
			continue
		}
		rawName, rawValue, _ := strings.Cut(pair, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil {
			return q, fmt.Errorf("parameter %.64q: malformed percent-encoding in its name", rawName)
		}
		if !slices.Contains(params, name) {
			return q, fmt.Errorf("parameter %.64q: unknown; the page takes %s", name, strings.Join(params, ", "))
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return q, fmt.Errorf("parameter %s: malformed percent-encoding (%%XX with two hex digits; %%25 for %%)", name)
		}
		if _, twice := v[name]; twice {
			return q, fmt.Errorf("parameter %s: given more than once", name)
		}
		v[name] = value
	}
	for _, p := range []struct {
		name string
		to   *string
	}{{"service", &q.service}, {"lease", &q.lease}} {
		s := v[p.name]
		switch {
		case !utf8.ValidString(s):
			return q, fmt.Errorf("parameter %s: not valid UTF-8", p.name)
		case strings.ContainsRune(s, 0):
			return q, fmt.Errorf("parameter %s: must not contain NUL (%%00)", p.name)
		}
		*p.to = s
	}
	if s := v["instance"]; s != "" {
		id, err := uuid.Parse(s)
		switch {
		case err != nil:
			return q, errors.New("parameter instance: not a uuid")
		case id == uuid.Nil:
			return q, errors.New("parameter instance: the nil uuid names no instance")
		}
		q.instance = id
	}
	for _, p := range []struct {
		name string
		to   *int
	}{{"page", &q.page}, {"lease_page", &q.leasePage}, {"history_page", &q.historyPage}} {
		if s := v[p.name]; s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > 1_000_000 {
				return q, fmt.Errorf("parameter %s: want a page number from 1 to 1000000", p.name)
			}
			*p.to = n
		}
	}
	if s := v["refresh"]; s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > int(maxRefresh/time.Second) { // not n*time.Second: it can wrap
			return q, fmt.Errorf("parameter refresh: want seconds from 0 (never) to %d", int(maxRefresh.Seconds()))
		}
		q.refresh = time.Duration(n) * time.Second
	}
	if s := v["history"]; s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < minHistoryWindow || d > maxHistoryWindow {
			return q, fmt.Errorf("parameter history: want a window from %s to %s, like 30m, 6h or 24h",
				windowText(minHistoryWindow), windowText(maxHistoryWindow))
		}
		q.history = d
	}
	return q, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	asJSON := strings.HasSuffix(r.URL.Path, ".json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	q, err := parseQuery(r.URL.RawQuery)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// notNow answers errBusy (429: the page's own limits) or errSlow (503: the database).
	notNow := func(err error) {
		code := http.StatusTooManyRequests
		if errors.Is(err, errSlow) {
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Retry-After", retryAfter)
		if asJSON {
			http.Error(w, err.Error(), code)
			return
		}
		// A screen that reloads the page by itself must not stop at this answer.
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'none'")
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, busyHTML, retryAfter, template.HTMLEscapeString(err.Error()))
	}
	if !h.load.admit() {
		notNow(errBusy)
		return
	}
	defer h.load.leave()
	// No deadline of the request's own: each wait is bounded where it waits (load.go).
	ctx := r.Context()
	e, err := h.load.evaluate(ctx, q, h.collect)
	switch {
	case errors.Is(err, errGone):
		return
	case err != nil:
		notNow(err)
		return
	}
	b, err := h.load.body(ctx, e, bodyKey{json: asJSON, refresh: q.refresh}, func() ([]byte, error) {
		if asJSON {
			b, err := json.MarshalIndent(e.page, "", " ")
			return append(b, '\n'), err
		}
		var b bytes.Buffer
		err := pageTemplate().Execute(&b, newView(e.page, q))
		return b.Bytes(), err
	})
	switch {
	case errors.Is(err, errGone):
		return
	case errors.Is(err, errBusy):
		notNow(err)
		return
	case err != nil:
		h.log.Error("status page: cannot render", "err", err)
		http.Error(w, "cannot render the status page", http.StatusInternalServerError)
		return
	}
	if asJSON {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", csp)
	}
	code := http.StatusOK
	if e.dbErr {
		code = http.StatusServiceUnavailable
	}
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// busyHTML is the HTML answer of a 429 or errSlow's 503: it reloads itself after
// Retry-After.
const busyHTML = `<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="%s">` +
	`<title>pg_liveness status: busy</title></head><body><p>%s</p></body></html>` + "\n"

// collect reads everything the page shows. dbErr is true when the instances and leases
// could not be read; the errors are in the page, redacted. The page it returns is shared
// by the requests its evaluation serves (for up to dataTTL): nothing may change it.
func (h *Handler) collect(ctx context.Context, q query) (p Page, dbErr bool) {
	p.GeneratedAt = time.Now()
	p.Services = []ServiceView{}
	p.Instances = InstancesView{Service: q.service, Page: q.page, PageSize: InstancesPerPage, Rows: []InstanceView{}}
	if q.instance != uuid.Nil {
		p.Instances.InstanceID = q.instance.String()
	}
	p.Leases = LeasesView{Name: q.lease, Page: q.leasePage, PageSize: LeasesPerPage, Rows: []LeaseView{}}
	fail := func(what string, err error) {
		msg := what + ": " + text(logging.Redact(err.Error()))
		p.Errors = append(p.Errors, msg)
		h.log.Debug("status page", "err", msg) // the page shows it; the collectors log database failures
	}

	fleet, err := h.readFleet(ctx, store.FleetQuery{
		Service: q.service, InstanceID: q.instance,
		Offset: (q.page - 1) * InstancesPerPage, Limit: InstancesPerPage,
		LeaseName: q.lease, LeaseOffset: (q.leasePage - 1) * LeasesPerPage, LeaseLimit: LeasesPerPage,
	})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("the database did not answer within %s (a lock on the instances table, or an overloaded server)", queryTimeout)
		}
		fail("cannot read instances and leases", err)
		dbErr = true
	} else {
		p.fill(fleet)
	}
	if !dbErr {
		locks, err := h.readLocks(ctx)
		if err != nil {
			fail("cannot read advisory locks", err)
		} else {
			p.AdvisoryLocks = locks
		}
		p.History = h.historySection(ctx, q, p, fail)
	}
	if h.cfg.Status != nil {
		s := h.cfg.Status.Status()
		if s.SchemaRead {
			p.Schema = &SchemaView{Version: s.SchemaVersion, BinaryVersion: s.BinaryVersion, Compatible: s.SchemaCompatible,
				AgentStarted: s.AgentStarted}
		}
	}
	if h.cfg.NodeAgent != nil {
		n := h.cfg.NodeAgent.Snapshot()
		p.NodeAgent = &NodeAgentView{Socket: n.Socket, ListenAddress: n.ListenAddress, SessionUp: n.SessionUp, Listening: n.Listening,
			Attached: n.Attached, LocksHeld: n.LocksHeld, Reconnects: n.Reconnects, Refused: n.Refused}
	}
	if h.cfg.Agent != nil {
		p.Agent = agentView(h.cfg.Agent.Snapshot())
	}
	return p, dbErr
}

// historySection reads the history for q's window; the page goes on without it when it
// cannot be read, with the error (fail) or a note when there is none to read.
func (h *Handler) historySection(ctx context.Context, q query, p Page, fail func(string, error)) *HistoryView {
	if !h.cfg.Source.HasLeases() {
		return noHistory(q, "the source is a Whizbang table: it keeps no history")
	}
	rows, err := h.readHistory(ctx, q.history)
	switch {
	case errors.Is(err, errNoHistory):
		return noHistory(q, "no history: the schema predates migration 0020, which records leaderships and deaths; "+
			"the exporter applies it on start, unless --no-migrations.apply")
	case err != nil:
		fail("cannot read the history", err)
		return nil
	}
	return newHistoryView(rows, q, p.GeneratedAt, p.Leases.Rows)
}

// windowText is a window as ?history= takes it: 30m, 6h, 168h.
func windowText(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	case d%time.Minute == 0:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	}
	return d.String()
}

// readFleet sends read_fleet for q.
func (h *Handler) readFleet(ctx context.Context, q store.FleetQuery) (store.Fleet, error) {
	args, err := q.Args()
	if err != nil {
		return store.Fleet{}, err
	}
	rows, err := h.cfg.DB.Query(ctx, h.fleet.SQL, h.fleet.Args(args...)...)
	if err != nil {
		return store.Fleet{}, err
	}
	return store.CollectFleet(rows)
}

// problem reports whether a state belongs at the top of the page: dead, or alive only
// by one signal that is failing.
func problem(state string) bool {
	switch state {
	case "zombie", "stale", "lock_lost", "lock_only":
		return true
	}
	return false
}

func (p *Page) fill(f store.Fleet) {
	p.GeneratedAt, p.Database, p.InRecovery = f.Meta.Now, text(f.Meta.Database), f.Meta.InRecovery
	for _, s := range f.Services {
		v := ServiceView{Name: text(s.Service), Counts: map[string]int{}, Dead: s.Dead, OldestHeartbeatAgeSeconds: s.OldestAge}
		for _, st := range store.InstanceStates() {
			n := s.Counts[st]
			v.Counts[st] = n
			v.Total += n
			if problem(st) {
				v.Problems += n
			}
		}
		p.Services = append(p.Services, v)
	}
	// Problems first, then the largest, then by name.
	slices.SortStableFunc(p.Services, func(a, b ServiceView) int {
		return cmp.Or(cmp.Compare(b.Dead, a.Dead), cmp.Compare(b.Problems, a.Problems), cmp.Compare(b.Total, a.Total),
			cmp.Compare(a.Name, b.Name))
	})
	p.Instances.Total = f.Meta.Instances
	for _, i := range f.Instances {
		p.Instances.Rows = append(p.Instances.Rows, InstanceView{
			InstanceID: i.InstanceID.String(), Service: text(i.ServiceName), Host: text(i.HostName), ProcessID: i.ProcessID,
			State: i.State, Alive: i.Alive, Problem: problem(i.State), LockHeld: i.LockHeld, Mode: text(i.LivenessMode),
			HeartbeatAgeSeconds: i.HeartbeatAge, LastHeartbeat: i.LastHeartbeatAt, StartedAt: i.StartedAt,
			Timing: TimingView{
				HeartbeatInterval: i.HeartbeatInterval, HeartbeatSlowInterval: i.HeartbeatSlowInterval,
				StaleThreshold: i.StaleThreshold, DefinitiveDeadCutoff: i.DefinitiveDeadCutoff, LockGrace: i.LockGrace,
			},
			Metadata: validJSON(i.Metadata),
		})
	}
	p.Leases.Total = f.Meta.Leases
	for _, l := range f.Leases {
		v := LeaseView{Name: text(l.Name), Held: l.Held, HolderHost: text(deref(l.HolderHost)), HolderService: text(deref(l.HolderService)),
			HolderState: l.HolderState, Epoch: l.Epoch, TakenAt: l.TakenAt, HeldForSeconds: l.HeldFor,
			ExpiresAt: l.ExpiresAt, ExpiresInSeconds: l.ExpiresIn}
		if l.HolderInstanceID != nil {
			v.HolderInstanceID = l.HolderInstanceID.String()
		}
		p.Leases.Rows = append(p.Leases.Rows, v)
	}
}

// deref is a NULL column's text: "".
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// text makes a value from the database valid UTF-8, replacing each invalid byte by
// U+FFFD: a SQL_ASCII database hands out whatever bytes were stored, and one such row
// must not make the whole page unreadable to a strict parser. encoding/json would replace
// them in strings anyway; html/template would not, nor would a json.RawMessage.
func text(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// validJSON keeps metadata that is a JSON value (it always is, from a jsonb column) and
// replaces anything else by null, so that the JSON form stays valid. Invalid UTF-8 (a
// SQL_ASCII database's jsonb keeps any bytes in its strings) is replaced first: outside
// strings JSON is ASCII, so only string contents change. json.Valid does not check UTF-8.
func validJSON(b json.RawMessage) json.RawMessage {
	if !utf8.Valid(b) {
		b = bytes.ToValidUTF8(b, []byte("\uFFFD"))
	}
	if len(b) == 0 || !json.Valid(b) {
		return json.RawMessage("null")
	}
	return b
}

// readLocks runs the advisory-locks collector's statement and groups its rows by
// application.
func (h *Handler) readLocks(ctx context.Context) (*LocksView, error) {
	rows, err := h.cfg.DB.Query(ctx, h.locks.SQL, h.locks.Args()...)
	if err != nil {
		return nil, err
	}
	read, err := pgx.CollectRows(rows, pgx.RowToStructByName[store.AdvisoryLocksRow])
	if err != nil {
		return nil, err
	}
	v := &LocksView{Applications: []AppView{}}
	apps := map[string]*AppView{}
	for _, r := range read {
		if r.Kind == "locks" {
			switch {
			case r.Name == "alive_lock" && r.State == "true":
				v.AliveLocksGranted += int(r.Count)
			case r.Name == "alive_lock":
				v.AliveLocksWaiting += int(r.Count)
			case r.State == "true":
				v.OtherGranted += int(r.Count)
			default:
				v.OtherWaiting += int(r.Count)
			}
			continue
		}
		app := apps[r.Name]
		if app == nil {
			app = &AppView{Name: text(r.Name), ByState: map[string]int{}, HoldersByState: map[string]int{},
				AliveLockSessions: strings.HasSuffix(r.Name, ":alive-lock")}
			apps[r.Name] = app
		}
		state := text(cmp.Or(r.State, "unknown"))
		app.Backends += int(r.Count)
		app.ByState[state] += int(r.Count)
		if r.Holders > 0 {
			app.HoldersByState[state] += int(r.Holders)
		}
		if strings.HasPrefix(state, "idle") {
			app.IdleHolders += int(r.Holders)
		}
		app.Waiters += int(r.Waiters)
		app.IdleHolderMaxSeconds = max(app.IdleHolderMaxSeconds, r.IdleHolderMaxSeconds)
	}
	for _, a := range apps {
		if a.Backends > 0 {
			a.IdleHolderShareOfBackend = float64(a.IdleHolders) / float64(a.Backends)
		}
		// The pool-starvation signature, as the PgLivenessAdvisoryLockPoolStarvation alert
		// reads it: at least three quarters of an application's backends (two or more)
		// sit idle holding advisory locks, so its pool is about to have no connection
		// left that its own locks do not pin. Alive-lock sessions are idle holders by
		// design.
		a.PoolStarvationSignature = !a.AliveLockSessions && a.Backends >= 2 && a.IdleHolderShareOfBackend >= 0.75
		v.Applications = append(v.Applications, *a)
	}
	slices.SortFunc(v.Applications, func(a, b AppView) int {
		return cmp.Or(boolOrder(a.PoolStarvationSignature, b.PoolStarvationSignature), cmp.Compare(b.Waiters, a.Waiters),
			cmp.Compare(b.Backends, a.Backends), cmp.Compare(a.Name, b.Name))
	})
	return v, nil
}

// boolOrder sorts true before false.
func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

func agentView(s liveness.AgentSnapshot) *AgentView {
	v := &AgentView{
		InstanceID: s.InstanceID.String(), Service: s.ServiceName, Mode: string(s.Mode),
		AliveLockHeld: s.AliveLock.Held, DuplicateInstance: s.AliveLock.Duplicate,
		HeartbeatIntervalSeconds: s.Heartbeat.Interval.Seconds(), Heartbeats: s.Heartbeat.Beats,
		HeartbeatFailures: s.Heartbeat.Failures, AliveLockReconnects: s.AliveLock.Reconnects, InstancesReaped: s.Reaped,
		Leases: []AgentLeaseView{}, Shards: []ShardSetView{},
	}
	for _, st := range s.Shards {
		v.Shards = append(v.Shards, ShardSetView{Set: st.Set, Members: st.Members, Shards: st.Shards, Owned: st.Owned,
			Acquired: st.Acquired, Released: st.Released, Lost: st.Lost})
	}
	if !s.Heartbeat.LastBeat.IsZero() {
		t := s.Heartbeat.LastBeat
		v.LastHeartbeat = &t
	}
	for _, l := range s.Leases {
		lv := AgentLeaseView{Name: l.Name, Held: l.Held, Epoch: l.Epoch, Lost: map[string]uint64{}}
		for r, n := range l.Lost {
			lv.Lost[string(r)] = n
		}
		v.Leases = append(v.Leases, lv)
	}
	return v
}

//go:embed page.html
var pageHTML string

//go:embed page.css
var pageCSS string

//go:embed page.js
var pageJS string

// csp allows the page's own style and script, by their hashes, and nothing else: a
// value that escaped its escaping still could not run.
var csp = fmt.Sprintf("default-src 'none'; script-src '%s'; style-src '%s'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
	hashOf(pageJS), hashOf(pageCSS))

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}

// pageTemplate is parsed at the page's first request: an exporter whose page nobody opens
// does not keep its parse tree (about 90 KB) in memory.
var pageTemplate = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("page").Funcs(template.FuncMap{
		"dur":    formatSeconds,
		"durp":   formatSecondsPtr,
		"ts":     func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		"pct":    func(f float64) string { return strconv.Itoa(int(f*100+0.5)) + "%" },
		"window": func(s float64) string { return windowText(time.Duration(s * float64(time.Second))) },
		"cut":    func(s string) shortened { return shorten(s, maxNameShown) },
		"meta": func(m json.RawMessage) shortened {
			if s := string(m); s != "{}" && s != "null" {
				return shorten(s, maxMetadataShown)
			}
			return shortened{}
		},
	}).Parse(pageHTML))
})

// shortened is a value for the HTML tables: Full, or when it is longer than fits, Short
// (its start) with Full behind it, in a details element. A 10 KB name would otherwise
// push the tables off the screen; the JSON form always has it whole.
type shortened struct{ Short, Full string }

func shorten(s string, n int) shortened {
	if utf8.RuneCountInString(s) <= n {
		return shortened{Full: s}
	}
	i := 0
	for range n {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return shortened{Short: s[:i], Full: s}
}

// formatSeconds prints a duration the way the page's script does: 1h02m, 3m05s, 12s,
// 0.4s; negative values with a minus sign.
func formatSeconds(s float64) string {
	sign := ""
	if s < 0 {
		sign, s = "-", -s
	}
	switch {
	case s < 10:
		return fmt.Sprintf("%s%.1fs", sign, s)
	case s < 60:
		return fmt.Sprintf("%s%ds", sign, int(s))
	case s < 3600:
		return fmt.Sprintf("%s%dm%02ds", sign, int(s)/60, int(s)%60)
	case s < 86400:
		return fmt.Sprintf("%s%dh%02dm", sign, int(s)/3600, int(s)%3600/60)
	}
	return fmt.Sprintf("%s%dd%02dh", sign, int(s)/86400, int(s)%86400/3600)
}

func formatSecondsPtr(s *float64) string {
	if s == nil {
		return "default"
	}
	return formatSeconds(*s)
}
