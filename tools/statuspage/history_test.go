package statuspage

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
	"github.com/pg-liveness/pg_liveness_exporter/tools/browser"
)

// The history's timeline as chromium renders it, served by the real binary (an observer)
// under the page's own Content-Security-Policy: lease "job" was taken for a second by node-a and left to
// expire, taken over by node-b, let go, and taken again by node-a, which holds it. Its
// bar has two gaps, each as wide as at least a pixel, red by the page's stylesheet (which
// the policy let in), with its length in its title; node-a's leadership is labelled with
// its host; the row says who leads it now.
func TestHistoryTimelineInBrowser(t *testing.T) {
	tab := browser.New(t)
	db := pgtest.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := db.Pool(t, 2)
	if _, err := migrations.Apply(ctx, pool, migrations.DefaultSchema); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%.60s: %v", sql, err)
		}
	}
	take := func(holder string, ttl float64, id uuid.UUID) (epoch int64, expires time.Time) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT epoch, expires_at FROM liveness.lease_take('job', $1, $2, $3, $1)`, holder, ttl, id).
			Scan(&epoch, &expires); err != nil {
			t.Fatalf("%s takes job: %v", holder, err)
		}
		return epoch, expires
	}
	a, b := uuid.New(), uuid.New()
	for host, id := range map[string]uuid.UUID{"node-a": a, "node-b": b} {
		exec(`INSERT INTO liveness.instances (instance_id, service_name, host_name) VALUES ($1, 'checkout', $2)`, id, host)
	}
	_, expires := take("node-a", 1, a)
	time.Sleep(time.Until(expires.Add(500 * time.Millisecond)))
	epoch, _ := take("node-b", 60, b)
	exec(`SELECT liveness.lease_let_go('job', 'node-b', $1)`, epoch)
	take("node-a", 60, a)

	addr := testutil.FreeAddr(t)
	proctest.Start(t, "exporter", proctest.Options{Env: []string{"DATA_SOURCE_NAME=" + db.DSN}}, proctest.BuildExporter(t, "-race"),
		"--web.listen-address="+addr, "--no-agent")
	base := "http://" + addr
	testutil.Eventually(t, 60*time.Second, "the exporter's /status.json", func() bool {
		res, err := http.Get(base + "/status.json")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	res, err := chromedp.Run(tab, chromedp.NavigateResponse(base+"/status?refresh=0"))
	if err != nil || res.Status != http.StatusOK {
		t.Fatalf("/status: %v, %v", res, err)
	}
	var gaps []struct {
		Title, Seconds, Fill string
		Width                float64
	}
	js := `JSON.stringify(Array.from(document.querySelectorAll('#history-leases tr[data-lease="job"] svg.gap'), g => ({
		Title: g.querySelector("title").textContent, Seconds: g.getAttribute("data-seconds"),
		Fill: getComputedStyle(g.querySelector("rect")).fill, Width: g.getBoundingClientRect().width})))`
	out, err := chromedp.Run(tab, chromedp.Evaluate[string](js))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &gaps); err != nil {
		t.Fatal(err)
	}
	if len(gaps) != 2 {
		t.Fatalf("job's bar has %d gaps, want 2: %s", len(gaps), out)
	}
	for i, after := range []string{"expired", "released"} {
		g := gaps[i]
		seconds, err := strconv.ParseFloat(g.Seconds, 64)
		if err != nil || seconds <= 0 || (after == "expired" && seconds < 0.5) {
			t.Errorf("gap %d: data-seconds %q", i+1, g.Seconds)
		}
		if want := fmt.Sprintf("no leader for %.1fs, after %s", seconds, after); !strings.HasPrefix(g.Title, want) {
			t.Errorf("gap %d's title %q, want it to start %q", i+1, g.Title, want)
		}
		if g.Width < 1 || g.Fill != "rgb(214, 39, 40)" {
			t.Errorf("gap %d is %.1f px wide, filled %q: want at least a pixel, red", i+1, g.Width, g.Fill)
		}
	}
	for js, want := range map[string]string{
		`Array.from(document.querySelectorAll('#history-leases tr[data-lease="job"] svg.seg text'), e => e.textContent).join("|")`: "node-a",
		`document.querySelector('#history-leases tr[data-lease="job"] td:nth-child(3)').textContent`:                               "led by node-a",
	} {
		got, err := chromedp.Run(tab, chromedp.Evaluate[string](js))
		if err != nil || !strings.Contains(got, want) {
			t.Errorf("%s: %q, %v; want %q in it", js, got, err, want)
		}
	}
}
