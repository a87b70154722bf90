// Package collector exports pg_liveness_* metrics, collected from PostgreSQL and from the
// local agent at scrape time. Each collector is one file and one collector, listed once
// in the registry (registry.go) that the flags, the checks and New read; the Exporter
// runs the enabled ones concurrently under the scrape's deadline and serves them over
// HTTP together with the caller's own registry.
//
// Each database collector sends one statement per scrape (the statements collector two
// more, only when the set of pg_stat_statements entries changed: all of them, then the
// texts of queryids it has not classified yet), with bind parameters. The statements and
// their rows are the data layer's (package store), rendered once for Config.Source, the
// source the binary parsed for every reader; the schema and the leases table enter SQL
// only as quoted identifiers. Every age is computed by the database clock. A collector that fails or
// misses the deadline exports nothing but its pg_liveness_scrape_collector_success 0.
//
// The exporters of several databases of one server (discovery within a server) share one
// read of the cluster-wide pg_locks and pg_stat_activity per scrape (Config.Locks,
// ReadServerLocks, ScrapeOnce): the instances and advisory_locks collectors then send
// the variants of their statements that take the database's locks as parameters (two
// statements for advisory_locks when the database holds bigint advisory locks, one
// otherwise), and fall back to their own read when the shared one fails. A single
// database's exporter reads as it always did.
//
// pg_liveness_up is 1 when PostgreSQL answered some database collector in this scrape,
// with rows or with an ERROR (a FATAL one, such as a shutdown or a refused login, is no
// answer); with no database collector enabled, a ping decides. A collector that answered
// from the server's shared read alone, without a statement to its own database
// (answeredWithoutAsking), is no answer of that database: a database that was dropped,
// refuses connections or may not be connected to is down although its server answers.
// When no collector asked the database, a ping decides.
package collector

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

const namespace = "pg_liveness"

// collector produces one group of metrics. Update adds its samples to out and returns
// when it is done or ctx ends; it must not use out after it returns. Each series must be
// added once: nothing checks it after Update. It is unexported: its samples go to an
// internal builder, so only this package can implement it, and a new collector is a
// file here and a row in the registry. Users of the package build an Exporter (New) and
// serve it (Exporter.Handler).
type collector interface {
	Update(ctx context.Context, out *exposition.Builder) error
}

// AgentSource is what the agent collector reads; liveness's agent implements it.
type AgentSource interface {
	Snapshot() liveness.AgentSnapshot
}

var (
	upDesc = gauge("up",
		"1 when PostgreSQL answered during this scrape, 0 otherwise.")
	durationDesc = gauge("scrape_collector_duration_seconds",
		"Time a collector took in this scrape; the whole budget when it missed the deadline.",
		"collector")
	downReasonDesc = gauge("database_down_reason",
		"1 for why PostgreSQL did not answer this scrape (pg_liveness_up 0): auth (the login was refused: password, pg_hba.conf, role, "+
			"no CONNECT privilege on the database), unavailable (the server refused the session: starting, shutting down, too many connections, "+
			"the database dropped or not accepting connections), tls (the exporter's own TLS side failed: the server's certificate does not "+
			"verify against the exporter's CA, or the server refused the exporter's client certificate, expired or from an unknown CA), "+
			"connection (no connection: network, DNS, a server without TLS), timeout (no answer within the scrape deadline). "+
			"All 0 while it answers.",
		"reason")
	identityDesc = gauge("database_info",
		"The database the exporter reads, identified everywhere; always 1, absent until read. database_id is the server's system "+
			"identifier (pg_control_system(), which its physical standbys share) and the database's oid, as SYSID:OID; datname its name. "+
			"The lease alerts meet agents and lease rows by database_id, whatever namespace, release or cluster scraped them.",
		"database_id", "datname")
	successDesc = gauge("scrape_collector_success",
		"1 when a collector succeeded in this scrape, 0 when it failed or missed the deadline.",
		"collector")
)

// gauge and counter describe a family named namespace_name.
func gauge(name, help string, labels ...string) *exposition.Family {
	return exposition.NewFamily(namespace+"_"+name, help, exposition.Gauge, labels...)
}

func counter(name, help string, labels ...string) *exposition.Family {
	return exposition.NewFamily(namespace+"_"+name, help, exposition.Counter, labels...)
}

// Exporter runs the enabled collectors for each scrape.
type Exporter struct {
	cfg        Config
	pool       *pgxpool.Pool
	logger     *slog.Logger
	collectors []*entry  // sorted by name
	label      [2]string // the label every sample carries (name, value); none when the name is ""
	// turn is what each scrape waits for first (WithTurn); nil: scrapes start at once.
	turn func(context.Context) (context.Context, func(), error)
	// identity is the database's, read by the scrapes (shared by Labelled's and
	// WithTurn's copies, which read the same pool).
	identity *identity
}

// identityMaxAge is how long a database's identity is taken as read: a scrape that gets
// an answer from PostgreSQL (and has the time) reads it again after that, so that a DSN
// switched to another database by a reload is followed within minutes, and scrapes
// cost no round trip more but once in that while.
const identityMaxAge = 5 * time.Minute

// identity is a database's identity (pg_liveness_database_info's labels), as last read.
type identity struct {
	mu     sync.Mutex
	labels []string // database_id, datname; nil until read
	read   time.Time
}

// refresh reads the identity through pool when it is older than identityMaxAge (or was
// never read), within ctx; a failure keeps what was read before, and is the next
// scrape's to retry.
func (id *identity) refresh(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) {
	if !id.mu.TryLock() { // another scrape reads it now
		return
	}
	defer id.mu.Unlock()
	if id.labels != nil && time.Since(id.read) < identityMaxAge {
		return
	}
	var sysid, oid, datname string
	q := store.DatabaseIdentity.In("")
	if err := pool.QueryRow(ctx, q.SQL).Scan(&sysid, &oid, &datname); err != nil {
		logger.Debug("reading the database's identity", "err", err)
		return
	}
	id.labels, id.read = []string{sysid + ":" + oid, datname}, time.Now()
}

// get returns the identity's labels, nil until read (or without an identity: an
// Exporter not made by New).
func (id *identity) get() []string {
	if id == nil {
		return nil
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.labels
}

type entry struct {
	name string
	c    collector
	db   bool // talks to PostgreSQL, so its outcome tells whether the server answers

	failing logging.Repeats // the collector's failure, logged when it starts or changes

	mu    sync.Mutex
	spare *exposition.Builder // the builder of the last finished scrape, with its buffers
}

// builder returns the collector's builder, reset, or a new one while a straggler still
// holds it (or two scrapes overlap).
func (c *entry) builder() *exposition.Builder {
	c.mu.Lock()
	b := c.spare
	c.spare = nil
	c.mu.Unlock()
	if b == nil {
		return new(exposition.Builder)
	}
	b.Reset()
	return b
}

// keep hands a finished scrape's builder back for the next scrape.
func (c *entry) keep(b *exposition.Builder) {
	c.mu.Lock()
	c.spare = b
	c.mu.Unlock()
}

// New builds the enabled collectors. pool may be nil only when no database collector is
// enabled. agent may be nil (--no-agent): the agent collector is then not registered.
func New(cfg Config, pool *pgxpool.Pool, agent AgentSource, logger *slog.Logger) (*Exporter, error) {
	logger = logging.Wrap(logger)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Exporter{cfg: cfg, pool: pool, logger: logger, identity: &identity{}}
	for _, r := range registry {
		if !*r.settings(&cfg).enabled() {
			continue
		}
		if r.db && pool == nil {
			return nil, fmt.Errorf("collector %s needs a database pool", r.name)
		}
		c, err := r.build(deps{cfg: &cfg, pool: pool, agent: agent, logger: logger.With("collector", r.name)})
		if err != nil {
			return nil, err
		}
		if c != nil {
			e.collectors = append(e.collectors, &entry{name: r.name, c: c, db: r.db})
		}
	}
	sort.Slice(e.collectors, func(i, j int) bool { return e.collectors[i].name < e.collectors[j].name })
	return e, nil
}

// Enabled returns the names of the collectors that run on each scrape.
func (e *Exporter) Enabled() []string {
	names := make([]string, len(e.collectors))
	for i, c := range e.collectors {
		names[i] = c.name
	}
	return names
}

// Handler serves one scrape per request: it runs the enabled collectors concurrently
// under the request's deadline and answers in the text format (or in OpenMetrics or the
// protobuf format, when the scraper prefers it, as promhttp negotiates) with their
// metrics plus extra's (the caller's Go, process and build-info registry; may be nil),
// gzipped when the scraper accepts it. The collectors' samples are written straight from
// the buffers they were added to, which are reused by later scrapes.
func (e *Exporter) Handler(extra prometheus.Gatherer) http.Handler {
	return HandlerOf(e.cfg, extra, func() []*Exporter { return []*Exporter{e} }, e.logger)
}

// HandlerOf serves one scrape of every exporter that list returns at the request, as
// Handler does for one: all of them concurrently under the one deadline cfg takes from
// the request (cfg's scrape settings; the exporters' own are not read), so that a slow
// database costs the others nothing but the wait for the answer to be sent, and never
// past the deadline. Their families are merged by name: each exporter's samples carry
// its own label (Labelled) to tell them apart. logger logs what cannot be gathered or sent.
func HandlerOf(cfg Config, extra prometheus.Gatherer, list func() []*Exporter, logger *slog.Logger) http.Handler {
	return handlerOf(cfg, extra, list, nil, logger)
}

// HandlerOf is HandlerOf (the package function) under l: the labelled exporters' series
// beyond l are dropped, whole databases at a time, before the answer is written.
func (l *SeriesLimit) HandlerOf(cfg Config, extra prometheus.Gatherer, list func() []*Exporter, logger *slog.Logger) http.Handler {
	return handlerOf(cfg, extra, list, l, logger)
}

func handlerOf(cfg Config, extra prometheus.Gatherer, list func() []*Exporter, limit *SeriesLimit, logger *slog.Logger) http.Handler {
	logger = logging.Wrap(logger)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), cfg.scrapeTimeout(r.Header))
		ctx = withScrapeMemo(ctx) // what the exporters of one server share: its locks, read once
		exporters := list()
		scrapes := make([]*scraped, len(exporters))
		var wg sync.WaitGroup
		for i, e := range exporters {
			wg.Go(func() { scrapes[i] = e.scrape(ctx) }) // each returns by the deadline
		}
		wg.Wait()
		cancel() // ends stragglers
		if limit != nil {
			limit.apply(exporters, scrapes) // before extra is gathered: its gauges say what was dropped
		}
		var builders []*exposition.Builder
		for _, s := range scrapes {
			defer s.release()
			builders = append(builders, s.builders...)
		}

		var fams []*dto.MetricFamily
		if extra != nil {
			var err error
			if fams, err = extra.Gather(); err != nil { // what it gathered is still served
				logger.Error("gathering the process's own metrics", "err", err)
			}
		}
		h := w.Header()
		format, contentType := negotiate(r.Header)
		h.Set("Content-Type", string(contentType))
		var out io.Writer = w
		if acceptsGzip(r.Header) {
			h.Set("Content-Encoding", "gzip")
			h.Add("Vary", "Accept-Encoding")
			gz := getGzip(w)
			defer putGzip(gz)
			out = gz
		}
		var err error
		switch format {
		case expfmt.TypeProtoDelim:
			err = exposition.WriteProto(out, fams, builders...)
		case expfmt.TypeOpenMetrics:
			err = writeOpenMetrics(out, builders, fams, cfg.OpenMetricsCreated)
		default:
			err = exposition.Write(out, builders...)
			for _, mf := range fams {
				if err != nil {
					break
				}
				_, err = expfmt.MetricFamilyToText(out, mf)
			}
		}
		if gz, ok := out.(*gzip.Writer); ok && err == nil {
			err = gz.Close()
		}
		if err != nil {
			logger.Debug("writing the scrape's answer", "err", err) // the scraper went away
		}
	})
}

// Labelled returns an exporter like e whose every sample carries name="value" (the
// database label of a discovered database), sharing e's collectors. Use it in place of
// e, never beside it: their builders are the same. name must be no label of any family.
func (e *Exporter) Labelled(name, value string) *Exporter {
	o := *e
	o.label = [2]string{name, value}
	return &o
}

// WithTurn returns an exporter like e (use it in place of e, as Labelled's) whose every
// scrape first waits for a turn from turn, within the scrape's deadline, runs under the
// context turn returns (which may end before the deadline: the turn taken back), and
// ends the turn by calling the function it returns: the databases of one server take
// turns (package targets' Turn). A scrape that gets no turn, or loses it, answers as one
// that missed its deadline: its collectors fail, pg_liveness_up 0 for a timeout.
func (e *Exporter) WithTurn(turn func(context.Context) (context.Context, func(), error)) *Exporter {
	o := *e
	o.turn = turn
	return &o
}

// gzipWriters keeps the gzip writer of a past scrape: it holds over half a MiB of
// compressor state, too much to allocate per scrape. BestSpeed: the exposition repeats
// itself, so the fastest level compresses it nearly as well, at a fraction of the CPU.
// klauspost/compress's writer (the standard gzip format) compresses the exposition
// twice as fast as compress/gzip's at that level (0.29 against 0.64 ms at 1,000
// instances), a little smaller, and keeps 0.8 MiB of state where compress/gzip's
// keeps 1.1 MiB.
var gzipWriters = make(chan *gzip.Writer, 1)

func getGzip(w io.Writer) *gzip.Writer {
	select {
	case gz := <-gzipWriters:
		gz.Reset(w)
		return gz
	default:
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed) // a valid level: no error
		return gz
	}
}

func putGzip(gz *gzip.Writer) {
	gz.Reset(io.Discard) // holds no response writer
	select {
	case gzipWriters <- gz:
	default:
	}
}

// offered are the formats the handler writes, in promhttp's order of preference (with
// EnableOpenMetrics) for an Accept clause that several match.
var offered = []expfmt.Format{expfmt.FmtOpenMetrics_1_0_0, expfmt.FmtOpenMetrics_0_0_1, expfmt.FmtProtoDelim, expfmt.FmtText}

// negotiate returns the format of the answer and its Content-Type: OpenMetrics, or the
// delimited protobuf format (which Prometheus asks for first when it ingests native
// histograms), when the scraper's Accept header prefers it to the text format, as
// client_golang's promhttp negotiates with EnableOpenMetrics; the text format otherwise.
// An Accept header that mentions neither is not parsed: the text path costs what it did.
func negotiate(h http.Header) (expfmt.FormatType, expfmt.Format) {
	accept := h.Get("Accept")
	if !strings.Contains(accept, expfmt.OpenMetricsType) && !strings.Contains(accept, expfmt.ProtoType) {
		return expfmt.TypeTextPlain, expfmt.FmtText
	}
	f := expfmt.NegotiateAccept(h, offered...)
	switch t := f.FormatType(); {
	case t == expfmt.TypeProtoDelim:
		// Without the escaping NegotiateAccept appends: every name is a legacy one.
		return t, expfmt.FmtProtoDelim
	case t != expfmt.TypeOpenMetrics:
		return expfmt.TypeTextPlain, expfmt.FmtText
	case strings.Contains(string(f), "version="+expfmt.OpenMetricsVersion_0_0_1):
		return t, expfmt.FmtOpenMetrics_0_0_1
	default:
		return t, expfmt.FmtOpenMetrics_1_0_0
	}
}

// writeOpenMetrics writes the collectors' samples and the registry's families (with
// their _created samples where client_golang knows them) in OpenMetrics, and its # EOF.
func writeOpenMetrics(out io.Writer, builders []*exposition.Builder, fams []*dto.MetricFamily, created bool) error {
	if err := exposition.WriteOpenMetrics(out, created, builders...); err != nil {
		return err
	}
	var opts []expfmt.EncoderOption
	if created {
		opts = append(opts, expfmt.WithCreatedLines())
	}
	for _, mf := range fams {
		if _, err := expfmt.MetricFamilyToOpenMetrics(out, mf, opts...); err != nil {
			return err
		}
	}
	_, err := expfmt.FinalizeOpenMetrics(out)
	return err
}

// acceptsGzip reports whether the Accept-Encoding header lists gzip with a non-zero q.
func acceptsGzip(h http.Header) bool {
	for _, v := range h.Values("Accept-Encoding") {
		for part := range strings.SplitSeq(v, ",") {
			coding, params, _ := strings.Cut(part, ";")
			if !strings.EqualFold(strings.TrimSpace(coding), "gzip") {
				continue
			}
			q, ok := strings.CutPrefix(strings.ReplaceAll(params, " ", ""), "q=")
			if !ok {
				return true
			}
			f, err := strconv.ParseFloat(q, 64)
			return err == nil && f > 0
		}
	}
	return false
}

// maxScrapeTimeout bounds the scraper's timeout header; a larger value is treated as
// absent.
const maxScrapeTimeout = 24 * 3600 // seconds

// scrapeTimeout is the scraper's timeout less the offset, or the default without one. An
// offset that would leave nothing halves the scraper's timeout instead. A header that is
// no positive, finite number of seconds up to a day (NaN, Inf, negative, huge, hex) is
// treated as absent: it must never remove the deadline.
func (c *Config) scrapeTimeout(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("X-Prometheus-Scrape-Timeout-Seconds"))
	if v == "" || strings.ContainsAny(v, "xX_") {
		return c.ScrapeDefaultTimeout
	}
	secs, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(secs) || math.IsInf(secs, 0) || !(secs > 0) || secs > maxScrapeTimeout {
		return c.ScrapeDefaultTimeout
	}
	total := time.Duration(secs * float64(time.Second))
	if t := total - c.ScrapeTimeoutOffset; t > 0 {
		return t
	}
	return total / 2
}

type result struct {
	idx      int
	out      *exposition.Builder
	err      error
	duration time.Duration
	unasked  bool // succeeded without a statement to its database (answeredWithoutAsking)
}

// unaskedKey is the context key of a collector's unasked flag in a scrape.
type unaskedKey struct{}

// answeredWithoutAsking tells the scrape that the collector's Update (whose ctx this is)
// succeeds without having sent its database a statement: its samples came from the
// server's shared read, so its success says nothing about whether the database answers.
func answeredWithoutAsking(ctx context.Context) {
	if f, ok := ctx.Value(unaskedKey{}).(*atomic.Bool); ok {
		f.Store(true)
	}
}

// ownBuilders keeps the builder of the exporter's own metrics between scrapes.
var ownBuilders = sync.Pool{New: func() any { return new(exposition.Builder) }}

// scraped is one scrape's samples: the builders of the collectors that finished and the
// exporter's own.
type scraped struct {
	builders []*exposition.Builder // what is written
	finished []*entry              // the collectors whose builders go back to them
	results  []*exposition.Builder // their builders, in the same order
	own      *exposition.Builder
}

// release hands the builders back for later scrapes. A straggler's builder is never
// among them: it may still be written to.
func (s *scraped) release() {
	for i, c := range s.finished {
		c.keep(s.results[i])
	}
	ownBuilders.Put(s.own)
}

// scrape runs every collector in its own goroutine and returns what finished before ctx
// ended, plus the exporter's own metrics. It does not wait for stragglers: they end when
// the caller cancels ctx, and their results go to a buffered channel nobody reads.
func (e *Exporter) scrape(ctx context.Context) *scraped {
	start := time.Now()
	scrapeCtx := ctx      // the request's, beyond the turn
	giveBack := func() {} // ends the turn, once
	if e.turn != nil {
		if turnCtx, release, err := e.turn(ctx); err == nil {
			var once sync.Once
			giveBack = func() { once.Do(release) }
			defer giveBack()
			ctx = turnCtx
		} // else the deadline came first: every collector misses it, below
	}
	results := make(chan result, len(e.collectors))
	for i, c := range e.collectors {
		go func() {
			t0 := time.Now()
			b := c.builder()
			b.SetLabel(e.label[0], e.label[1])
			unasked := new(atomic.Bool)
			out, err := run(context.WithValue(ctx, unaskedKey{}, unasked), c.c, b)
			results <- result{idx: i, out: out, err: err, duration: time.Since(t0), unasked: err == nil && unasked.Load()}
		}()
	}

	done := make([]*result, len(e.collectors))
	pending := len(e.collectors)
wait:
	for pending > 0 {
		select {
		case r := <-results:
			done[r.idx] = &r
			pending--
		case <-ctx.Done():
			break wait
		}
	}
	for drained := false; !drained && pending > 0; { // results that raced the deadline
		select {
		case r := <-results:
			done[r.idx] = &r
			pending--
		default:
			drained = true
		}
	}

	own := ownBuilders.Get().(*exposition.Builder)
	own.Reset()
	own.SetLabel(e.label[0], e.label[1])
	s := &scraped{builders: make([]*exposition.Builder, 0, len(e.collectors)+1), own: own}
	answered, anyDB := false, false // anyDB: some database collector asked the database
	var downErr error               // the first database collector's failure
	for i, c := range e.collectors {
		r := done[i]
		if r == nil {
			r = &result{err: fmt.Errorf("missed the scrape deadline: %w", context.Cause(ctx)), duration: time.Since(start)}
		}
		asked := c.db && !r.unasked
		anyDB = anyDB || asked
		if asked && (r.err == nil || isServerError(r.err)) {
			answered = true
		}
		if c.db && r.err != nil && downErr == nil {
			downErr = r.err
		}
		success := 0.0
		if r.err == nil {
			success = 1
			s.builders = append(s.builders, r.out)
		}
		if r.out != nil { // finished
			s.finished, s.results = append(s.finished, c), append(s.results, r.out)
		}
		e.logOutcome(c, r.err)
		own.Add(durationDesc, r.duration.Seconds(), c.name)
		own.Add(successDesc, success, c.name)
	}
	if !anyDB && e.pool != nil {
		downErr = e.pool.Ping(ctx)
		answered = downErr == nil
	}
	if anyDB || e.pool != nil {
		reason := ""
		if !answered {
			reason = downReason(downErr)
		}
		for _, r := range downReasons {
			own.Add(downReasonDesc, boolFloat(r == reason), r)
		}
	}
	if e.cfg.Status != nil {
		statusMetrics(own, e.cfg.Status.Status())
	}
	// The identity is read by a scrape that has at least as much time left as it took
	// (one round trip more, every identityMaxAge), after it gave its turn back: never at
	// the cost of the answer, nor of the other databases of a server waiting for a turn.
	if dl, ok := scrapeCtx.Deadline(); answered && e.pool != nil && e.identity != nil && (!ok || time.Until(dl) > time.Since(start)) {
		giveBack()
		e.identity.refresh(scrapeCtx, e.pool, e.logger)
	}
	if labels := e.identity.get(); labels != nil {
		own.Add(identityDesc, 1, labels...)
	}
	own.Add(upDesc, boolFloat(answered))
	s.builders = append(s.builders, own)
	return s
}

// run collects one collector's samples. A panic becomes an error: the agent lives in
// this process, and a collector bug must not drop its alive lock.
func run(ctx context.Context, c collector, out *exposition.Builder) (_ *exposition.Builder, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return out, c.Update(ctx, out)
}

var downReasons = []string{"auth", "connection", "timeout", "tls", "unavailable"}

// DownReason is the reason pg_liveness_database_down_reason gives for err, a failure to
// get an answer from PostgreSQL: auth, connection, timeout, tls or unavailable.
func DownReason(err error) string { return downReason(err) }

// downReason classifies why PostgreSQL did not answer. A login refused for want of the
// CONNECT privilege on the database (42501, FATAL at start-up) is auth, as a refused
// password is; a database dropped (3D000) or not accepting connections (55000) is
// unavailable. A TLS handshake that failed on the exporter's side of it is tls: the
// server's certificate does not verify against the exporter's sslrootcert (a rotated CA,
// a wrong host name), or the server sent an alert refusing the exporter's client
// certificate (expired, from a CA it does not trust). The database's owner cannot act on
// those; whoever configures the exporter can.
func downReason(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "42501"):
		return "auth"
	case errors.As(err, &pgErr):
		return "unavailable"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return "timeout"
	case tlsFailure(err):
		return "tls"
	default:
		return "connection"
	}
}

// tlsFailure reports whether err is a TLS handshake's failure: a certificate the client
// could not verify, or an alert the server sent (crypto/tls reports a received alert as a
// net.OpError whose Op is "remote error").
func tlsFailure(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		hostname x509.HostnameError
		op       *net.OpError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &hostname) ||
		errors.As(err, &op) && op.Op == "remote error"
}

// isServerError reports whether PostgreSQL answered a statement with an error, which
// means it is up. A FATAL error is not an answer: it ends the session, as a server
// shutting down does to every connection (57P01), or refuses one (starting up, bad
// password).
func isServerError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	severity := pgErr.SeverityUnlocalized
	if severity == "" {
		severity = pgErr.Severity
	}
	return severity == "ERROR"
}

// logOutcome logs a collector's failure at warn level when it starts or changes, at debug
// level while it repeats, and its recovery once, so a database that stays down does not
// write a line per scrape.
func (e *Exporter) logOutcome(c *entry, err error) {
	if err == nil {
		c.failing.Clear(e.logger, "collector recovered", "collector", c.name)
		return
	}
	c.failing.Log(e.logger, slog.LevelWarn, err.Error(), "collector failed", "collector", c.name, "err", err)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Only returns an Exporter that runs only the named collectors of e (for /probe's
// collector parameter), sharing their state with e. An empty list is all of e's. A name
// that is no enabled collector is an error that names it.
func (e *Exporter) Only(names ...string) (*Exporter, error) {
	if len(names) == 0 {
		return e, nil
	}
	o := *e
	o.collectors = nil
	for _, c := range e.collectors {
		for _, n := range names {
			if n == c.name {
				o.collectors = append(o.collectors, c)
				break
			}
		}
	}
	for _, n := range names {
		found := false
		for _, c := range o.collectors {
			found = found || c.name == n
		}
		if !found {
			return nil, fmt.Errorf("collector %q is not enabled (enabled: %s)", n, strings.Join(e.Enabled(), ", "))
		}
	}
	return &o, nil
}
