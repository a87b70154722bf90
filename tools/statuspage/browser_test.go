package statuspage

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/tlstest"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
	"github.com/pg-liveness/pg_liveness_exporter/tools/browser"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Values a database may hold that must show as text and run nothing.
const (
	hostileLease = `cleanup</td><script>window.pwned=1</script><img src=x onerror="window.pwned=2"><i>and more</i>`
	hostileApp   = `worker<img src=x onerror="window.pwned=3">`
	hostileMeta  = `{"note": "</td><script>window.pwned=4</script>"}`
	// A lease whose name and holder host are 10 KB each: held and named to come last.
	// No space or hyphen: nothing to break a line at.
	longLease  = "zzlongleasename"
	statusUser = "operator"
	statusPass = "correct horse battery staple"
)

// writeWebConfig writes an exporter-toolkit web configuration with a self-signed
// certificate for 127.0.0.1 and one basic-auth user.
func writeWebConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM, _ := tlstest.SelfSigned(t)
	hash := tlstest.BcryptHash(t, statusPass)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key := write("tls.crt", certPEM), write("tls.key", keyPEM)
	return write("web.yml", fmt.Appendf(nil, "tls_server_config:\n  cert_file: %s\n  key_file: %s\nbasic_auth_users:\n  %s: %s\n",
		cert, key, statusUser, hash))
}

// statusFixture writes an instance in every state, fixed by its own timing (stale after
// 10 minutes, dead after 30, an hour of grace) and by sessions holding alive locks; a
// lease with a hostile name held by the alive one; and two idle sessions of a hostile
// application, each holding an advisory lock.
func statusFixture(t *testing.T, ctx context.Context, db *pgtest.DB) map[liveness.InstanceState]uuid.UUID {
	t.Helper()
	admin := db.Conn(t)
	if _, err := migrations.Apply(ctx, admin, migrations.DefaultSchema); err != nil {
		t.Fatal(err)
	}
	ids := map[liveness.InstanceState]uuid.UUID{}
	rows := []struct {
		state liveness.InstanceState
		age   string
		holds bool
	}{
		{liveness.StateAlive, "0 s", true}, {liveness.StateLockOnly, "15 min", true}, {liveness.StateLockLost, "0 s", true},
		{liveness.StateHeartbeatOnly, "0 s", false}, {liveness.StateStale, "20 min", false}, {liveness.StateZombie, "1 hour", true},
	}
	for _, r := range rows {
		id := uuid.New()
		ids[r.state] = id
		if _, err := admin.Exec(ctx, `INSERT INTO liveness.instances (instance_id, service_name, host_name, process_id,
		        last_heartbeat_at, heartbeat_interval, heartbeat_slow_interval, stale_threshold, definitive_dead_cutoff,
		        lock_grace, holds_alive_lock, metadata)
		      VALUES ($1, 'checkout', 'node-' || $2, 4242, now() - $3::interval, '30 s', '60 s', '10 min', '30 min', '1 hour', $4, $5)`,
			id, string(r.state), r.age, r.holds, hostileMeta); err != nil {
			t.Fatal(err)
		}
		if r.holds && r.state != liveness.StateLockLost {
			if _, err := db.ConnAs(t, "checkout:alive-lock").Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := admin.Exec(ctx, `INSERT INTO liveness.leases (name, holder, holder_instance_id, holder_host, expires_at)
	      VALUES ($1, 'node-alive:4242:00ff', $2, 'node-alive', now() + interval '10 minutes')`, hostileLease, ids[liveness.StateAlive]); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `INSERT INTO liveness.leases (name, holder, holder_host, expires_at)
	      VALUES (repeat($1, 700), 'x', repeat('node', 2700), now() + interval '20 minutes')`, longLease); err != nil {
		t.Fatal(err)
	}
	for k := range 2 {
		if _, err := db.ConnAs(t, hostileApp).Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(7000+k)); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// The status page as chromium renders it, served by the real binary under a web
// configuration with TLS and basic auth: without the password there is no page; with it
// the states are the database's, hostile names are text and run nothing, the lease's
// countdown moves without a reload, the page reloads itself, and the landing page links
// to it.
func TestStatusPageInBrowser(t *testing.T) {
	tab := browser.New(t)
	db := pgtest.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ids := statusFixture(t, ctx, db)
	addr := testutil.FreeAddr(t)
	proctest.Start(t, "exporter", proctest.Options{Env: []string{"DATA_SOURCE_NAME=" + db.DSN}}, proctest.BuildExporter(t, "-race"),
		"--web.listen-address="+addr, "--log.level=debug", "--web.config.file="+writeWebConfig(t),
		"--agent.service-name=exporter", "--no-agent.reaper")
	base := "https://" + addr

	// Wait for the agent's own row, through the JSON form.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	var agentID string
	testutil.Eventually(t, 60*time.Second, "the agent's instance in /status.json", func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/status.json?service=exporter", nil)
		req.SetBasicAuth(statusUser, statusPass)
		res, err := client.Do(req)
		if err != nil {
			return false
		}
		defer res.Body.Close()
		var page struct {
			Instances struct {
				Rows []struct {
					InstanceID string `json:"instance_id"`
				}
			}
		}
		if json.NewDecoder(res.Body).Decode(&page) != nil || res.StatusCode != http.StatusOK || len(page.Instances.Rows) != 1 {
			return false
		}
		agentID = page.Instances.Rows[0].InstanceID
		return true
	})

	tab, cancelTab := context.WithTimeout(tab, 2*time.Minute)
	defer cancelTab()
	eval := func(js string) string {
		t.Helper()
		s, err := chromedp.Run(tab, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return s
	}

	// No credentials, then a wrong password: the browser gets no page.
	for _, pass := range []string{"", "wrong"} {
		if err := chromedp.Do(tab, browser.BasicAuth(statusUser, pass)); pass != "" && err != nil {
			t.Fatal(err)
		}
		if pass == "" {
			if err := chromedp.Do(tab, browser.Header("Authorization", "")); err != nil {
				t.Fatal(err)
			}
		}
		res, err := chromedp.Run(tab, chromedp.NavigateResponse(base+"/status"))
		switch {
		case err != nil && strings.Contains(err.Error(), "ERR_INVALID_AUTH_CREDENTIALS"):
		case err == nil && res.Status == http.StatusUnauthorized:
		default:
			t.Fatalf("password %q: the browser got %v, %v; want a refusal", pass, res, err)
		}
		if got := eval(`String(!!document.getElementById("instances-table"))`); got != "false" {
			t.Fatalf("password %q: the page rendered", pass)
		}
	}

	if err := chromedp.Do(tab, browser.BasicAuth(statusUser, statusPass)); err != nil {
		t.Fatal(err)
	}
	res, err := chromedp.Run(tab, chromedp.NavigateResponse(base+"/status?refresh=0"))
	if err != nil || res.Status != http.StatusOK {
		t.Fatalf("with the password: %v, %v", res, err)
	}

	// States: the rendered rows against instance_states, problems first.
	var shown [][2]string
	if err := json.Unmarshal([]byte(eval(`JSON.stringify(Array.from(document.querySelectorAll("#instances-table tr[data-instance]"),
		r => [r.querySelector("td.id").textContent, r.querySelector(".st").textContent]))`)), &shown); err != nil {
		t.Fatal(err)
	}
	rows, _ := db.Conn(t).Query(ctx, `SELECT instance_id::text, state FROM liveness.instance_states()`)
	states, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ ID, State string }])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, s := range states {
		want[s.ID] = s.State
	}
	if len(shown) != len(want) || len(want) != len(ids)+1 {
		t.Fatalf("the page shows %d instances, the database has %d: %v", len(shown), len(want), shown)
	}
	for i, r := range shown {
		if want[r[0]] != r[1] {
			t.Errorf("instance %s shown %q; the database says %q", r[0], r[1], want[r[0]])
		}
		if i < 4 && r[1] != []string{"zombie", "stale", "lock_lost", "lock_only"}[i] {
			t.Errorf("row %d is %s: problems do not come first", i, r[1])
		}
	}
	if want[agentID] != "alive" {
		t.Errorf("the agent %s is %q", agentID, want[agentID])
	}

	// Hostile values are text, and nothing ran. The hostile lease name is longer than
	// the tables show: its start is the summary, the whole name is behind it.
	if got := eval(`document.querySelector("#leases-table td.lease-name .full").textContent`); got != hostileLease {
		t.Errorf("lease name shown as %q", got)
	}
	if got := eval(`document.querySelector("#leases-table td.lease-name summary").textContent`); got != string([]rune(hostileLease)[:80])+"…" {
		t.Errorf("lease name summarised as %q", got)
	}
	// 10 KB names do not push the tables off the screen, shown or opened; the whole
	// name is there.
	if got := eval(`String(document.querySelector("#leases-table tr:last-child td.lease-name .full").textContent.length)`); got != strconv.Itoa(700*len(longLease)) {
		t.Errorf("the long lease name has %s characters in the page, want %d", got, 700*len(longLease))
	}
	for _, step := range []string{"closed", "opened"} {
		if step == "opened" {
			eval(`document.querySelectorAll("#leases-table details").forEach(d => { d.open = true }); "ok"`)
		}
		width, _ := strconv.Atoi(eval(`String(Math.max(document.getElementById("leases-table").scrollWidth, document.documentElement.scrollWidth))`))
		if width > 2500 || width == 0 {
			t.Errorf("with the long names %s, the page is %d px wide", step, width)
		}
	}
	if got := eval(`Array.from(document.querySelectorAll("#locks-table tr.starving"), r => r.getAttribute("data-app")).join("|")`); got != hostileApp {
		t.Errorf("pool-starvation signature on %q, want the hostile application only", got)
	}
	if got := eval(`document.querySelector("#i-` + ids[liveness.StateZombie].String() + ` td.meta").textContent`); !strings.Contains(got, "window.pwned=4") {
		t.Errorf("metadata shown as %q", got)
	}
	if got := eval(`typeof window.pwned`); got != "undefined" {
		t.Fatalf("a hostile value ran: window.pwned is %s", got)
	}

	// The holder links to its instance's row on this page.
	href := eval(`document.querySelector("#leases-table td.id a").getAttribute("href")`)
	if href != "#i-"+ids[liveness.StateAlive].String() {
		t.Errorf("holder link %q", href)
	}
	if got := eval(`document.getElementById(` + fmt.Sprintf("%q", strings.TrimPrefix(href, "#")) + `).getAttribute("data-state")`); got != "alive" {
		t.Errorf("the holder's row says %q", got)
	}
	if got := eval(`document.getElementById("agent-lock").textContent`); !strings.HasPrefix(got, "held") {
		t.Errorf("agent's alive lock: %q", got)
	}

	// The countdown moves without a reload.
	countdown := func() time.Duration {
		s := eval(`document.querySelector("#leases-table td.countdown").textContent`)
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("countdown %q: %v", s, err)
		}
		return d
	}
	origin := func() (string, bool) {
		s, err := chromedp.Run(tab, chromedp.Evaluate[string](`String(window.performance.timeOrigin)`))
		return s, err == nil
	}
	marker, _ := origin()
	first := countdown()
	testutil.Never(t, 2500*time.Millisecond, "the page reloaded with ?refresh=0", func() bool { s, ok := origin(); return !ok || s != marker })
	second := countdown()
	if first < 9*time.Minute || second > first-time.Second {
		t.Errorf("countdown went from %s to %s in 2.5 s", first, second)
	}

	// The page reloads itself.
	if err := chromedp.Do(tab, chromedp.Navigate(base+"/status?refresh=1")); err != nil {
		t.Fatal(err)
	}
	marker, _ = origin()
	if !testutil.Poll(20*time.Second, func() bool { s, ok := origin(); return ok && s != marker }) {
		t.Error("the page did not reload itself within 20 s at ?refresh=1")
	}

	// The landing page links to it.
	if err := chromedp.Do(tab, chromedp.Navigate(base+"/")); err != nil {
		t.Fatal(err)
	}
	if got := eval(`String(!!document.querySelector('a[href="/status"]'))`); got != "true" {
		t.Error("the landing page has no link to /status")
	}

	// The HTML and JSON forms carry no password.
	for _, path := range []string{"/status", "/status.json"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		req.SetBasicAuth(statusUser, statusPass)
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(b), db.Server.Password) || strings.Contains(string(b), db.DSN) {
			t.Errorf("%s shows the database password", path)
		}
	}
}
