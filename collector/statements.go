package collector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// StatementsConfig configures the statements collector.
type StatementsConfig struct {
	Enabled bool
	// Patterns are "name=regex" pairs, merged over DefaultStatementPatterns by name; an
	// empty regex removes a default. The first pattern that matches a query text wins.
	Patterns []string
	// CacheSize bounds the queryid classification cache.
	CacheSize int
}

// DefaultStatementPatterns match the tags (store.Tags) that every statement the library,
// the collectors and the status page send carries after its first keyword: one pattern
// per tag, named after it, "name=pg_liveness:name\b". They match on every major from 14
// to 18, since pg_stat_statements keeps a statement's text from its first keyword on.
var DefaultStatementPatterns = defaultStatementPatterns()

func defaultStatementPatterns() []string {
	tags := store.Tags()
	out := make([]string, 0, len(tags))
	for _, name := range tags {
		out = append(out, name+"="+regexp.QuoteMeta(store.TagPrefix+name)+`\b`)
	}
	return out
}

func (s *StatementsConfig) enabled() *bool { return &s.Enabled }

// defaultStatementsCacheSize is StatementsConfig.CacheSize's default.
const defaultStatementsCacheSize = 10000

func (s *StatementsConfig) defaults() { s.CacheSize = defaultStatementsCacheSize }

func (s *StatementsConfig) cacheSize() limit {
	return limit{"Config.Statements.CacheSize", &s.CacheSize, 1}
}

func (s *StatementsConfig) check(*Config) error {
	if err := s.cacheSize().check(); err != nil {
		return err
	}
	if _, err := parsePatterns(s.Patterns); err != nil {
		return fmt.Errorf("Config.Statements.Patterns: %w", err)
	}
	return nil
}

// statementPattern is one parsed pattern of StatementsConfig.Patterns.
type statementPattern struct {
	name string
	re   *regexp.Regexp
}

// parsePatterns merges the given name=regex pairs over the defaults.
func parsePatterns(given []string) ([]statementPattern, error) {
	var out []statementPattern
	index := map[string]int{}
	for _, s := range append(append([]string(nil), DefaultStatementPatterns...), given...) {
		name, expr, ok := strings.Cut(s, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want name=regex", s)
		}
		var re *regexp.Regexp // nil removes the name
		if expr != "" {
			var err error
			if re, err = regexp.Compile(expr); err != nil {
				return nil, fmt.Errorf("%q: %w", s, err)
			}
		}
		if j, seen := index[name]; seen {
			out[j].re = re
			continue
		}
		index[name] = len(out)
		out = append(out, statementPattern{name: name, re: re})
	}
	kept := out[:0]
	for _, p := range out {
		if p.re != nil {
			kept = append(kept, p)
		}
	}
	return kept, nil
}

// SQLSTATEs that mean pg_stat_statements cannot be read here, rather than a failure. The
// first three mean the extension was dropped or moved: look it up again. The others
// (not in shared_preload_libraries, not granted to this role) keep the schema.
var unavailableCodes = map[string]bool{
	"42883": true,  // undefined_function
	"42P01": true,  // undefined_table
	"3F000": true,  // invalid_schema_name
	"55000": false, // object_not_in_prerequisite_state
	"42501": false, // insufficient_privilege
}

// stmtKey identifies one pg_stat_statements entry within this database.
type stmtKey struct {
	userid   uint32
	queryid  int64
	toplevel bool
}

type stmtCounts struct {
	calls, seconds, rows float64
}

// statementsCollector sums the counters of the entries each pattern matches. Exported
// counters are accumulated from per-entry increments, so they never go down within one
// exporter run: not when an entry is evicted (pg_stat_statements.max) and not when
// pg_stat_statements is reset. When the extension is missing, every scrape makes the
// one cheap catalog lookup instead, so CREATE EXTENSION is seen at the next scrape and
// the lookup still tells the exporter that the server answers.
type statementsCollector struct {
	pool      *pgxpool.Pool
	patterns  []statementPattern
	cacheSize int
	logger    *slog.Logger

	calls, seconds, rows, available *exposition.Family

	// sem serializes scrapes: the state below is read-modify-write, and two scrapes
	// interleaving their increments would count twice.
	sem          chan struct{}
	stats, texts string                 // stat_statements and its texts, for the extension's schema; "" when unknown
	problem      logging.Repeats        // why pg_stat_statements cannot be read
	cacheFull    logging.Repeats        // that the cache is too small
	class        classCache             // queryid → pattern index, -1 for none
	matching     []int64                // the queryids in class that match a pattern
	summary      [3]int64               // stat_statements' summary of the entries when all were last read
	complete     bool                   // every entry was classified when all were last read
	last         map[stmtKey]stmtCounts // last seen counters of classified entries
	totals       []stmtCounts           // by pattern index
}

func newStatementsCollector(d deps) (collector, error) {
	const stmt = "statement"
	patterns, err := parsePatterns(d.cfg.Statements.Patterns)
	if err != nil {
		return nil, fmt.Errorf("Config.Statements.Patterns: %w", err)
	}
	return &statementsCollector{
		pool:      d.pool,
		patterns:  patterns,
		cacheSize: d.cfg.Statements.CacheSize,
		logger:    d.logger,
		calls: counter("statement_calls_total",
			"Calls of the statements whose query text matches the named --collector.statements.pattern, from pg_stat_statements.", stmt),
		seconds: counter("statement_seconds_total",
			"Planning plus execution time of the statements matching the named pattern, from pg_stat_statements.", stmt),
		rows: counter("statement_rows_total",
			"Rows retrieved or affected by the statements matching the named pattern, from pg_stat_statements.", stmt),
		available: gauge("stat_statements_available",
			"1 when pg_stat_statements can be read in this database, else 0."),
		sem:    make(chan struct{}, 1),
		last:   map[stmtKey]stmtCounts{},
		totals: make([]stmtCounts, len(patterns)),
	}, nil
}

type stmtRow struct {
	key stmtKey
	stmtCounts
}

// Update runs one scrape in named steps, one scrape at a time: read the counters (or say
// why they cannot be read), classify new entries, add each entry's increments to its
// pattern's totals, and add the totals to out.
func (c *statementsCollector) Update(ctx context.Context, out *exposition.Builder) error {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.sem }()

	entries, problem, err := c.read(ctx)
	if err != nil {
		return err
	}
	if problem != "" {
		c.unavailable(out, problem)
		return nil
	}
	uncached, err := c.classify(ctx, entries)
	if err != nil {
		return err
	}
	c.rememberMatching(uncached)
	c.problem.Clear(c.logger, "pg_stat_statements is available again")
	c.account(entries, uncached)
	c.emit(out)
	return nil
}

// read reads the counters, after looking the extension up when its schema is not known,
// and once more when it was dropped or moved since. A problem says why
// pg_stat_statements cannot be read in this database, which is no failure of the scrape.
func (c *statementsCollector) read(ctx context.Context) (entries []stmtRow, problem string, err error) {
	for attempt := 1; ; attempt++ {
		if c.stats == "" {
			found, err := c.lookup(ctx)
			if err != nil {
				return nil, "", err
			}
			if !found {
				return nil, "the pg_stat_statements extension is not installed in this database (CREATE EXTENSION pg_stat_statements)", nil
			}
		}
		entries, err := c.readStats(ctx)
		if err == nil {
			return entries, "", nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			return nil, "", err
		}
		lookAgain, ok := unavailableCodes[pgErr.Code]
		if !ok {
			return nil, "", err
		}
		if lookAgain {
			c.stats, c.texts, c.complete = "", "", false
			if attempt == 1 {
				continue // dropped or moved since the lookup: look it up now
			}
		}
		return nil, "pg_stat_statements cannot be read: " + pgErr.Message, nil
	}
}

// rememberMatching keeps the queryids that match a pattern after the entries were read
// in full, for the next scrapes' reads of only those; uncached is what classify could
// not keep in the cache.
func (c *statementsCollector) rememberMatching(uncached map[int64]int) {
	if c.complete && uncached == nil {
		return
	}
	c.complete = uncached == nil
	c.matching = c.matching[:0]
	for i, idx := range c.class.idx {
		if idx >= 0 {
			c.matching = append(c.matching, c.class.ids[i])
		}
	}
}

// account adds each classified entry's increment since the last scrape to its pattern's
// totals, and remembers the entries' counters for the next scrape, forgetting evicted
// ones.
func (c *statementsCollector) account(entries []stmtRow, uncached map[int64]int) {
	next := make(map[stmtKey]stmtCounts, len(c.last))
	for _, e := range entries {
		idx, ok := c.class.get(e.key.queryid)
		if !ok {
			idx, ok = uncached[e.key.queryid]
		}
		if !ok || idx < 0 { // matches nothing, or its text vanished before we read it
			continue
		}
		inc := e.stmtCounts
		if prev, ok := c.last[e.key]; ok && e.calls >= prev.calls {
			inc = stmtCounts{calls: e.calls - prev.calls, seconds: max(e.seconds-prev.seconds, 0), rows: max(e.rows-prev.rows, 0)}
		} // else a new entry, or one reset since: all of it is new
		c.totals[idx].calls += inc.calls
		c.totals[idx].seconds += inc.seconds
		c.totals[idx].rows += inc.rows
		next[e.key] = e.stmtCounts
	}
	c.last = next
}

// emit adds every pattern's totals to out.
func (c *statementsCollector) emit(out *exposition.Builder) {
	for i, p := range c.patterns {
		out.Add(c.calls, c.totals[i].calls, p.name)
		out.Add(c.seconds, c.totals[i].seconds, p.name)
		out.Add(c.rows, c.totals[i].rows, p.name)
	}
	out.Add(c.available, 1)
}

// lookup finds the extension's schema and renders the statements for it.
func (c *statementsCollector) lookup(ctx context.Context) (found bool, err error) {
	var schema string
	err = c.pool.QueryRow(ctx, store.StatStatementsSchema.In("").SQL).Scan(&schema)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	c.stats = store.StatStatements.In(schema).SQL
	c.texts = store.StatStatementsTexts.In(schema).SQL
	return true, nil
}

// readStats reads the counters of the entries that match a pattern. When the set of
// entries changed since all were last read (or the last read could not classify them
// all), it reads them all, in a second statement.
func (c *statementsCollector) readStats(ctx context.Context) ([]stmtRow, error) {
	if c.complete {
		out, summary, err := c.queryStats(ctx, false)
		if err != nil || summary == c.summary {
			return out, err
		}
	}
	out, summary, err := c.queryStats(ctx, true)
	if err != nil {
		return nil, err
	}
	c.summary, c.complete = summary, false // classify decides whether it is complete
	return out, nil
}

func (c *statementsCollector) queryStats(ctx context.Context, all bool) ([]stmtRow, [3]int64, error) {
	var summary [3]int64
	rows, err := c.pool.Query(ctx, c.stats, c.matching, all)
	if err != nil {
		return nil, summary, err
	}
	defer rows.Close()
	var out []stmtRow
	if all {
		out = make([]stmtRow, 0, len(c.class.ids))
	}
	var sc rowScanner[store.StatStatementsRow]
	for rows.Next() {
		r, err := sc.scan(rows)
		if err != nil {
			return nil, summary, err
		}
		if r.Entries != nil {
			summary = [3]int64{*r.Entries, *r.Hash1, *r.Hash2}
			continue
		}
		out = append(out, stmtRow{key: stmtKey{userid: *r.UserID, queryid: *r.QueryID, toplevel: *r.TopLevel},
			stmtCounts: stmtCounts{calls: float64(*r.Calls), seconds: *r.Seconds, rows: float64(*r.Rows)}})
	}
	return out, summary, rows.Err()
}

// classify fetches the texts of queryids not seen before, in one round trip, and
// remembers which pattern each matches (-1 for none). The cache keeps at most cacheSize
// ids: when it would overflow, ids absent from this scrape are dropped first; what still
// does not fit is returned for this scrape only and read again on the next one.
func (c *statementsCollector) classify(ctx context.Context, entries []stmtRow) (uncached map[int64]int, err error) {
	var unseen []int64
	seen := make(map[int64]bool, len(entries))
	for _, e := range entries {
		id := e.key.queryid
		if _, ok := c.class.get(id); !ok && !seen[id] {
			unseen = append(unseen, id)
		}
		seen[id] = true
	}
	if len(unseen) == 0 {
		return nil, nil
	}
	rows, err := c.pool.Query(ctx, c.texts, unseen)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	found := make(map[int64]int, len(unseen))
	for rows.Next() {
		r, err := pgx.RowToStructByName[store.StatStatementsTextRow](rows)
		if err != nil {
			return nil, err
		}
		found[r.QueryID] = c.match(r.Query)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}

	if len(c.class.ids)+len(found) > c.cacheSize {
		c.class.retain(seen)
	}
	add := make(map[int64]int, min(len(found), c.cacheSize-len(c.class.ids)))
	for id, idx := range found {
		if len(c.class.ids)+len(add) < c.cacheSize {
			add[id] = idx
			continue
		}
		if uncached == nil {
			uncached = map[int64]int{}
			c.cacheFull.Log(c.logger, slog.LevelWarn, "full",
				"more pg_stat_statements entries than --collector.statements.cache-size; raise it to avoid reading query texts on every scrape",
				"cache_size", c.cacheSize)
		}
		uncached[id] = idx
	}
	c.class.add(add)
	return uncached, nil
}

// classCache is the classification cache: queryids sorted, each with the index of the
// pattern its text matches (-1 for none). At pg_stat_statements' default of 5,000
// entries it holds 60 KB, where a map held 145 KB; its lookups are binary searches, a
// few hundred a scrape once every entry is classified.
type classCache struct {
	ids []int64
	idx []int32 // by position in ids
}

func (c *classCache) get(id int64) (int, bool) {
	i, ok := slices.BinarySearch(c.ids, id)
	if !ok {
		return 0, false
	}
	return int(c.idx[i]), true
}

// retain keeps the ids in keep.
func (c *classCache) retain(keep map[int64]bool) {
	n := 0
	for i, id := range c.ids {
		if keep[id] {
			c.ids[n], c.idx[n] = id, c.idx[i]
			n++
		}
	}
	c.ids, c.idx = c.ids[:n], c.idx[:n]
}

// add merges in ids that are not in the cache, into slices of the exact size.
func (c *classCache) add(found map[int64]int) {
	if len(found) == 0 {
		return
	}
	ids := make([]int64, 0, len(c.ids)+len(found))
	idx := make([]int32, 0, cap(ids))
	i := 0
	for _, id := range slices.Sorted(maps.Keys(found)) {
		for ; i < len(c.ids) && c.ids[i] < id; i++ {
			ids, idx = append(ids, c.ids[i]), append(idx, c.idx[i])
		}
		ids, idx = append(ids, id), append(idx, int32(found[id]))
	}
	c.ids, c.idx = append(ids, c.ids[i:]...), append(idx, c.idx[i:]...)
}

func (c *statementsCollector) match(text string) int {
	for i, p := range c.patterns {
		if p.re.MatchString(text) {
			return i
		}
	}
	return -1
}

func (c *statementsCollector) unavailable(out *exposition.Builder, problem string) {
	c.problem.Log(c.logger, slog.LevelWarn, problem, "statement metrics are off: "+problem)
	out.Add(c.available, 0)
}
