// Package benchcompare runs pg_liveness_exporter and Debian's prometheus-postgres-exporter
// side by side over the same data set (internal/testkit/benchdata) and compares them: scrape
// median, exporter CPU per scrape, peak RSS and database backend CPU per scrape, after a
// check that both report the same values at the same instant. postgres_exporter runs
// with its default metrics and collectors off and answers the same gauges through the
// custom queries in queries.yaml, whose statement patterns are the exporter's own
// (Queries). `make bench-compare` runs it and writes the table into docs/performance.md;
// make test runs the value check at a small scale. It is for tests and benchmarks only.
package benchcompare

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// queriesTemplate is postgres_exporter's custom queries file, without the statement
// patterns (Queries).
//
//go:embed queries.yaml
var queriesTemplate string

// patternsPlaceholder is where Queries writes the statement patterns.
const patternsPlaceholder = "{{statement patterns}}"

// Queries is postgres_exporter's custom queries file, with the exporter's own default
// statement patterns in their order (the first match wins on both sides). They are
// taken from the collector rather than listed in queries.yaml, which went stale once
// already: every tag added later was exported by us only.
func Queries() ([]byte, error) {
	rows := make([]string, 0, len(collector.DefaultStatementPatterns))
	for i, p := range collector.DefaultStatementPatterns {
		name, re, err := PostgresPattern(p)
		if err != nil {
			return nil, err
		}
		rows = append(rows, fmt.Sprintf("(%d, '%s', '%s')", i+1, name, re))
	}
	if strings.Count(queriesTemplate, patternsPlaceholder) != 1 {
		return nil, fmt.Errorf("queries.yaml: want %s exactly once", patternsPlaceholder)
	}
	return []byte(strings.Replace(queriesTemplate, patternsPlaceholder, strings.Join(rows, ",\n        "), 1)), nil
}

// plainPattern is the form of the default patterns: a tag, then a word boundary.
var plainPattern = regexp.MustCompile(`^[A-Za-z0-9_:]+\\b$`)

// PostgresPattern turns a "name=regex" statement pattern of the collector (Go's RE2)
// into the name and a PostgreSQL regular expression that matches the same texts. Only
// the form of the defaults is translated (literal text, then \b, which is \y in
// PostgreSQL, where \b is a backspace); anything else is refused rather than guessed.
func PostgresPattern(p string) (name, re string, err error) {
	name, expr, _ := strings.Cut(p, "=")
	if !plainPattern.MatchString(expr) || strings.ContainsRune(name, '\'') {
		return "", "", fmt.Errorf("statement pattern %q: only literal text and a final \\b are translated for postgres_exporter", p)
	}
	return name, strings.TrimSuffix(expr, `\b`) + `\y`, nil
}

// TheirBinary is Debian's postgres_exporter.
const TheirBinary = "prometheus-postgres-exporter"

// InstallHint is the one line printed when postgres_exporter is missing.
const InstallHint = TheirBinary + " not found: run `scripts/install-deps.sh bench` as root " +
	"(apt-get install prometheus-postgres-exporter)"

// theirNames maps postgres_exporter's names (namespace_column) to the exporter's where
// its model cannot produce the same name.
var theirNames = map[string]string{
	"pg_liveness_app_backends":                "pg_liveness_backends",
	"pg_liveness_app_waiters":                 "pg_liveness_advisory_lock_waiters",
	"pg_liveness_app_idle_holder_max_seconds": "pg_liveness_advisory_lock_idle_holder_max_seconds",
}

// Compared lists the metrics both exporters answer, by the exporter's names. Values in
// seconds that grow with the clock are compared within a tolerance; the rest exactly.
var Compared = map[string]float64{ // name → tolerance
	"pg_liveness_database_in_recovery":                  0,
	"pg_liveness_instances":                             0,
	"pg_liveness_instance_oldest_heartbeat_age_seconds": 1,
	"pg_liveness_instance_heartbeat_age_seconds":        1,
	"pg_liveness_lease_expires_in_seconds":              1,
	"pg_liveness_lease_held":                            0,
	"pg_liveness_lease_epoch":                           0,
	"pg_liveness_lease_held_for_seconds":                1,
	"pg_liveness_lease_holder_info":                     0,
	"pg_liveness_advisory_locks":                        0,
	"pg_liveness_advisory_lock_holders":                 0,
	"pg_liveness_backends":                              0,
	"pg_liveness_advisory_lock_waiters":                 0,
	"pg_liveness_advisory_lock_idle_holder_max_seconds": 1,
	"pg_liveness_statement_calls_total":                 0,
	"pg_liveness_statement_rows_total":                  0,
	"pg_liveness_statement_seconds_total":               1e-6,
}

// ownApps are the application names of the exporters' own connections (ours names its
// pool; postgres_exporter and the harness name none). Whether such a backend is active
// or idle depends on which exporter is running a statement at that instant, so their
// advisory-lock holders by backend state are not compared (neither holds a lock).
var ownApps = map[string]bool{"pg_liveness_exporter:pool": true, "unknown": true}

// Samples parses a text exposition into "name{label="value",...}" → value for the
// compared metrics, under the exporter's names, without labels only one side adds.
func Samples(r io.Reader) (map[string]float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		if n, ok := theirNames[name]; ok {
			name = n
		}
		if _, ok := Compared[name]; !ok {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			own := false
			for _, l := range m.GetLabel() {
				own = own || l.GetName() == "application_name" && ownApps[l.GetValue()]
				if l.GetName() == "server" { // postgres_exporter's own
					continue
				}
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := value(m)
			if own && name == "pg_liveness_advisory_lock_holders" || math.IsNaN(v) { // NaN: a NULL in their model
				continue
			}
			sort.Strings(labels)
			out[name+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return math.NaN()
}

// Diff lists the differences between two sample sets: series only one side has, and
// values further apart than the metric's tolerance. It returns how many series agree.
func Diff(ours, theirs map[string]float64) (same int, diffs []string) {
	return DiffBetween(ours, theirs, ours)
}

// DiffBetween is Diff for values of ours that moved between two scrapes: theirs must lie
// between ours before and ours after, widened by the metric's tolerance. Series are
// those of before (after may lack none of them).
func DiffBetween(before, theirs, after map[string]float64) (same int, diffs []string) {
	for k, lo := range before {
		b, ok := theirs[k]
		if !ok {
			diffs = append(diffs, "only ours: "+k)
			continue
		}
		hi, ok := after[k]
		if !ok {
			hi = lo
		}
		tol := Compared[name(k)]
		if b < min(lo, hi)-tol || b > max(lo, hi)+tol {
			if lo == hi {
				diffs = append(diffs, fmt.Sprintf("%s: ours %v, theirs %v", k, lo, b))
			} else {
				diffs = append(diffs, fmt.Sprintf("%s: ours %v then %v, theirs %v", k, lo, hi, b))
			}
			continue
		}
		same++
	}
	for k := range theirs {
		if _, ok := before[k]; !ok {
			diffs = append(diffs, "only theirs: "+k)
		}
	}
	sort.Strings(diffs)
	return same, diffs
}

// Proc is an exporter process on 127.0.0.1.
type Proc struct {
	Name string
	Addr string
	cmd  *exec.Cmd
	logs bytes.Buffer
	done chan struct{}
}

// Start runs an exporter binary listening on a free port of 127.0.0.1 (the listen flag is
// added) and waits until it answers; it is stopped when the test ends.
func Start(t testing.TB, name, bin string, env []string, args ...string) *Proc {
	t.Helper()
	addr := testutil.FreeAddr(t)
	p := &Proc{Name: name, Addr: addr, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"--web.listen-address=" + addr}, args...)...)
	p.cmd.Env = append(os.Environ(), env...)
	// Killed if the test binary dies first (a closed pipe, a kill), as proctest's are.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	w := &lockedWriter{w: &p.logs} // one writer for both: exec.Cmd then writes from one goroutine at a time
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.Stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited: %s", name, p.Logs())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer on %s: %v", name, addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills the process and waits for it.
func (p *Proc) Stop() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// lockedWriter keeps the first MiB of a process's output.
type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() > 1<<20 {
		return len(b), nil
	}
	return l.w.Write(b)
}

// Logs is the process's output so far.
func (p *Proc) Logs() string {
	w := p.cmd.Stdout.(*lockedWriter)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.String()
}

// Scrape fetches /metrics as Prometheus does (gzip, with its timeout header).
func (p *Proc) Scrape(client *http.Client) ([]byte, time.Duration, error) {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+p.Addr+"/metrics", nil)
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "10")
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", p.Name, resp.Status)
	}
	return body, d, err
}

// CPU is a process's user plus system time from /proc/<pid>/stat.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields after it are fixed.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// PeakRSS is a process's VmHWM in MiB.
func PeakRSS(pid int) (float64, error) { return status(pid, "VmHWM") }

// AnonRSS is a process's resident anonymous memory (its heap, stacks and runtime) in MiB,
// now; the rest of its RSS is mostly its binary's pages.
func AnonRSS(pid int) (float64, error) { return status(pid, "RssAnon") }

// status reads a field in kB of /proc/<pid>/status, in MiB.
func status(pid int, field string) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no %s for pid %d", field, pid)
}

// backendCPU sums the CPU of the database backends of one role, as seen now.
type backendCPU struct {
	conn *pgx.Conn
	role string
	last map[int]time.Duration
}

// sample reads the role's backends and returns the CPU they used since the last sample
// (all of it for a new backend).
func (b *backendCPU) sample(ctx context.Context) (time.Duration, error) {
	rows, err := b.conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE usename = $1`, b.role)
	if err != nil {
		return 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	next := map[int]time.Duration{}
	for _, pid := range pids {
		c, err := CPU(int(pid))
		if err != nil {
			continue // gone meanwhile
		}
		sum += c - b.last[int(pid)]
		next[int(pid)] = c
	}
	b.last = next
	return sum, nil
}

// Measurement is one exporter's figures in one run.
type Measurement struct {
	Median, CPU, DBCPU time.Duration // CPU and DBCPU per scrape
	Exec               time.Duration // server planning and execution per scrape, from pg_stat_statements
	PeakRSS            float64       // MiB
	AnonRSS            float64       // MiB, the largest seen after a scrape
}

// execTime is the planning and execution time pg_stat_statements holds for role's
// statements: the database's own cost of what it sent.
func (b *backendCPU) execTime(ctx context.Context) (time.Duration, error) {
	var ms float64
	err := b.conn.QueryRow(ctx, `SELECT coalesce(sum(s.total_exec_time + s.total_plan_time), 0)::float8
	      FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname = $1`, b.role).Scan(&ms)
	return time.Duration(ms * float64(time.Millisecond)), err
}

// Side is an exporter under comparison.
type Side struct {
	Proc *Proc
	db   *backendCPU
}

// Run scrapes the sides interleaved, n times each, alternating which goes first, and
// returns each side's measurement.
func Run(ctx context.Context, sides []*Side, n int) ([]Measurement, error) {
	client := &http.Client{Timeout: 30 * time.Second}
	times := make([][]time.Duration, len(sides))
	db := make([]time.Duration, len(sides))
	cpu0 := make([]time.Duration, len(sides))
	anon := make([]float64, len(sides))
	exec0 := make([]time.Duration, len(sides))
	for i, s := range sides {
		if _, err := s.db.sample(ctx); err != nil {
			return nil, err
		}
		e, err := s.db.execTime(ctx)
		if err != nil {
			return nil, err
		}
		exec0[i] = e
		c, err := CPU(s.Proc.Pid())
		if err != nil {
			return nil, err
		}
		cpu0[i] = c
	}
	for k := range n {
		for j := range sides {
			i := (j + k) % len(sides)
			s := sides[i]
			if _, err := s.db.sample(ctx); err != nil {
				return nil, err
			}
			_, d, err := s.Proc.Scrape(client)
			if err != nil {
				return nil, err
			}
			used, err := s.db.sample(ctx)
			if err != nil {
				return nil, err
			}
			times[i] = append(times[i], d)
			db[i] += used
			a, err := AnonRSS(s.Proc.Pid())
			if err != nil {
				return nil, err
			}
			anon[i] = max(anon[i], a)
		}
	}
	out := make([]Measurement, len(sides))
	for i, s := range sides {
		c, err := CPU(s.Proc.Pid())
		if err != nil {
			return nil, err
		}
		rss, err := PeakRSS(s.Proc.Pid())
		if err != nil {
			return nil, err
		}
		e, err := s.db.execTime(ctx)
		if err != nil {
			return nil, err
		}
		slices.Sort(times[i])
		out[i] = Measurement{Median: times[i][len(times[i])/2], CPU: (c - cpu0[i]) / time.Duration(n),
			DBCPU: db[i] / time.Duration(n), Exec: (e - exec0[i]) / time.Duration(n), PeakRSS: rss, AnonRSS: anon[i]}
	}
	return out, nil
}

// Config is what Compare runs.
type Config struct {
	Scales  []int // numbers of instances
	Scrapes int   // per exporter and run
	Runs    int   // each with freshly started exporters
	OurBin  string
	// Revision is the commit the binary was built from (Revision), for the report.
	Revision string
}

// Revision is the root module's commit as git describes it, "-dirty" when the tree has
// changes; "unknown" without git.
func Revision(root string) string {
	cmd := exec.Command("git", "describe", "--always", "--dirty", "--abbrev=12", "--exclude=*")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// Result is one scale's measurements: Runs pairs of (ours, theirs).
type Result struct {
	Scale    benchdata.Scale
	Runs     [][2]Measurement
	Series   int // series compared and found equal
	Checked  time.Time
	Theirs   string // postgres_exporter's version line
	Warnings []string
}

// Compare builds each scale's data set, checks that both exporters report the same
// values at the same instant, and measures them side by side.
func Compare(t testing.TB, cfg Config) []Result {
	t.Helper()
	theirBin := TheirPath(t)
	version, _ := exec.Command(theirBin, "--version").CombinedOutput()
	queries := WriteQueries(t)
	var results []Result
	for _, n := range cfg.Scales {
		results = append(results, compareAt(t, cfg, n, theirBin, queries, firstLine(string(version))))
	}
	return results
}

// TheirPath is postgres_exporter's path; the test fails with InstallHint without it.
func TheirPath(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath(TheirBinary)
	if err != nil {
		t.Fatal(InstallHint)
	}
	return p
}

// WriteQueries writes Queries into the test's temporary folder and returns its path.
func WriteQueries(t testing.TB) string {
	t.Helper()
	config, err := Queries()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "queries.yaml")
	if err := os.WriteFile(p, config, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// BuildOurs builds the exporter from the root module (root, relative to the test's
// folder) into the test's temporary folder, as the Dockerfile builds what ships: static,
// without cgo. It returns the binary's path.
func BuildOurs(t testing.TB, root string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pg_liveness_exporter")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// Check starts both exporters on data and fails the test unless they report the same
// values (CheckValues); it returns how many series agree.
func Check(t testing.TB, data benchdata.Data, ourBin string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b := prepare(ctx, t, data, ourBin, TheirPath(t), WriteQueries(t))
	sides := b.start()
	if err := awayFromThresholds(ctx, b.admin); err != nil {
		t.Fatal(err)
	}
	return CheckValues(t, sides)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}

func compareAt(t testing.TB, cfg Config, n int, theirBin, queries, version string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	data := benchdata.BuildScale(t, benchdata.At(n))
	b := prepare(ctx, t, data, cfg.OurBin, theirBin, queries)
	res := Result{Scale: data.Scale, Theirs: version}
	sides := b.start()
	if err := awayFromThresholds(ctx, b.admin); err != nil {
		t.Fatal(err)
	}
	res.Series = CheckValues(t, sides)
	res.Checked = time.Now()
	t.Logf("%d instances: both report the same %d series", n, res.Series)

	client := &http.Client{Timeout: 30 * time.Second}
	for run := range cfg.Runs {
		if run > 0 {
			for _, s := range sides {
				s.Proc.Stop()
			}
			sides = b.start()
			warmUp(t, client, sides)
		}
		m, err := Run(ctx, sides, cfg.Scrapes)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d instances, run %d: ours %+v, theirs %+v", n, run+1, m[0], m[1])
		res.Runs = append(res.Runs, [2]Measurement{m[0], m[1]})
	}
	for _, s := range sides {
		s.Proc.Stop()
	}
	return res
}

// bench is one data set with what starts both exporters on it.
type bench struct {
	t                         testing.TB
	admin                     *pgx.Conn
	ourBin, theirBin, queries string
	oursDSN, theirsDSN        string
}

// prepare makes each exporter's role, moves heartbeats and expiries away from every
// threshold and runs one statement per tag (SeedStatements).
func prepare(ctx context.Context, t testing.TB, data benchdata.Data, ourBin, theirBin, queries string) *bench {
	t.Helper()
	admin, err := pgx.Connect(ctx, data.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	// Each exporter logs in as a role of its own, so that its backends can be told apart.
	// Superusers, so that neither is limited by privileges the other has.
	const pw = "bench-compare"
	for _, role := range []string{"bench_ours", "bench_theirs"} {
		if _, err := admin.Exec(ctx, `DO $$ BEGIN
		        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '`+role+`') THEN
		            CREATE ROLE `+role+` LOGIN SUPERUSER PASSWORD '`+pw+`';
		        END IF; END $$`); err != nil {
			t.Fatal(err)
		}
	}
	dsnFor := func(role string) string {
		c, err := pgx.ParseConfig(data.DSN)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("host=127.0.0.1 port=%d dbname=%s user=%s password=%s sslmode=disable",
			c.Port, c.Database, role, pw)
	}
	if err := awayFromThresholds(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `VACUUM ANALYZE`); err != nil {
		t.Fatal(err)
	}
	if err := SeedStatements(ctx, admin); err != nil {
		t.Fatal(err)
	}
	return &bench{t: t, admin: admin, ourBin: ourBin, theirBin: theirBin, queries: queries,
		oursDSN: dsnFor("bench_ours"), theirsDSN: dsnFor("bench_theirs")}
}

// awayFromThresholds sets heartbeats and expiries at least 30 s away from every
// threshold (stale at 90 s, dead at 300 s, a lease's expiry), so that nothing changes
// state while the two exporters scrape at the same time. It runs again right before the
// values are compared: starting and warming up both exporters may take several seconds on
// a loaded machine, and a margin of 4 s was once not enough in CI (two instances went
// stale between ours and theirs). 30 s is the scrapes' own timeout.
func awayFromThresholds(ctx context.Context, conn *pgx.Conn) error {
	for _, sql := range []string{
		`UPDATE liveness.instances SET last_heartbeat_at = now() - make_interval(secs =>
		     (CASE WHEN (process_id * 7919) % 900 BETWEEN 60 AND 89 OR (process_id * 7919) % 900 BETWEEN 270 AND 299
		           THEN (process_id * 7919) % 900 - 30 ELSE (process_id * 7919) % 900 END) + 0.5)`,
		`UPDATE liveness.leases SET expires_at = now() + make_interval(secs =>
		     (CASE WHEN abs(substr(name, 5)::int % 240 - 120) < 30 THEN 115 ELSE substr(name, 5)::int % 240 - 120 END) + 0.5)`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%.60s: %w", sql, err)
		}
	}
	return nil
}

// start runs both exporters, ours first, and warms them up.
func (b *bench) start() []*Side {
	b.t.Helper()
	ours := Start(b.t, "pg_liveness_exporter", b.ourBin, []string{"DATA_SOURCE_NAME=" + b.oursDSN},
		"--no-agent", "--no-migrations.apply", "--log.level=warn")
	theirs := Start(b.t, "postgres_exporter", b.theirBin, []string{"DATA_SOURCE_NAME=" + b.theirsDSN},
		"--no-collector.database", "--no-collector.bgwriter", "--disable-default-metrics",
		"--disable-settings-metrics", "--extend.query-path="+b.queries, "--log.level=warn")
	sides := []*Side{
		{Proc: ours, db: &backendCPU{conn: b.admin, role: "bench_ours"}},
		{Proc: theirs, db: &backendCPU{conn: b.admin, role: "bench_theirs"}},
	}
	warmUp(b.t, &http.Client{Timeout: 30 * time.Second}, sides)
	return sides
}

// warmUp scrapes each side three times: connections, prepared statements, statement
// classification.
func warmUp(t testing.TB, client *http.Client, sides []*Side) {
	t.Helper()
	for range 3 {
		for _, s := range sides {
			if _, _, err := s.Proc.Scrape(client); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// SeedStatements runs a statement carrying each of the exporter's tags, the k-th tag k
// times, so that every statement pattern has calls of its own to compare, whatever the
// data set ran (a pattern that matched nothing would agree at 0 on both sides even when
// one side's regex were wrong). The statements differ in their number of columns, so
// that each has a queryid of its own: pg_stat_statements ignores comments.
func SeedStatements(ctx context.Context, conn *pgx.Conn) error {
	for k, tag := range store.Tags() {
		sql := "SELECT /* " + store.TagPrefix + tag + " */ 1" + strings.Repeat(", 1", k+1)
		for range k + 1 {
			if _, err := conn.Exec(ctx, sql); err != nil {
				return fmt.Errorf("%s: %w", sql, err)
			}
		}
	}
	return nil
}

// CheckValues scrapes both exporters (sides: ours, theirs) and fails the test unless
// they report the same series with the same values; it returns how many series agree.
// Gauges are compared from two scrapes at the same instant. The statement counters
// move with every scrape of ours (its own statements carry tags), so theirs must lie
// between a scrape of ours finished before theirs began and one begun after it ended.
func CheckValues(t testing.TB, sides []*Side) int {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	scrape := func(s *Side) map[string]float64 {
		body, _, err := s.Proc.Scrape(client)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Samples(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", s.Proc.Name, err)
		}
		return m
	}
	before := scrape(sides[0])
	at := make([]map[string]float64, 2)
	var wg sync.WaitGroup
	for i, s := range sides {
		wg.Go(func() {
			body, _, err := s.Proc.Scrape(client)
			if err != nil {
				t.Error(err)
				return
			}
			if at[i], err = Samples(bytes.NewReader(body)); err != nil {
				t.Errorf("%s: %v", s.Proc.Name, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	after := scrape(sides[0])
	// A gauge that does not move with the clock is compared at the same instant; one in
	// seconds that does (an age, a time to expiry: a tolerance above 0) moves one way, so
	// theirs, read between ours before and ours after, lies between them, however far
	// apart a loaded machine ran the two exporters' statements.
	for k, v := range at[0] {
		if !strings.HasSuffix(name(k), "_total") && Compared[name(k)] == 0 {
			before[k], after[k] = v, v
		}
	}
	same, diffs := DiffBetween(before, at[1], after)
	if len(diffs) > 0 {
		t.Fatalf("the exporters disagree on %d of %d series:\n%s", len(diffs), same+len(diffs),
			strings.Join(diffs[:min(len(diffs), 40)], "\n"))
	}
	return same
}

func name(series string) string {
	n, _, _ := strings.Cut(series, "{")
	return n
}
