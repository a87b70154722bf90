// Command dashboardplots renders the queries of every panel of the Grafana dashboards
// (dashboards/*.json) on Prometheus' own graph page, in headless Chromium, and saves one
// PNG per panel: the plots of docs/dashboards.md, so that a reader sees what each panel
// shows before installing Grafana. Run it against `make run`'s Prometheus once the demo
// fleet has run for about ten minutes (docs/dashboards.md says how):
//
//	cd tools && go run ./cmd/dashboardplots -prometheus http://127.0.0.1:9090 -out ../docs/dashboards
//
// State timelines are drawn stacked. A panel's targets are drawn together on one graph, each labelled target="<legend>"; the
// dashboards' variables match every value ("All"), and $__rate_interval is
// -rate-interval. The graph spans the whole of Prometheus' data, up to -max-range. It
// needs Prometheus' classic web UI (/classic/graph, in Prometheus 2), which Debian ships.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/color/palette"
	"image/draw"
	"image/png"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pg-liveness/pg_liveness_exporter/tools/browser"
)

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
		RefID        string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// defaultMaxRange is -max-range's default.
const defaultMaxRange = 30 * time.Minute

func main() {
	prom := flag.String("prometheus", "http://127.0.0.1:9090", "Prometheus to query (loopback only)")
	dir := flag.String("dashboards", "../dashboards", "folder of the dashboard JSON files")
	out := flag.String("out", "../docs/dashboards", "folder to write <dashboard>-<panel id>.png to")
	rateInterval := flag.Duration("rate-interval", time.Minute, "stands in for Grafana's $__rate_interval")
	maxRange := flag.Duration("max-range", defaultMaxRange, "longest time range to plot, ending now")
	flag.Parse()
	if err := run(*prom, *dir, *out, *rateInterval, *maxRange); err != nil {
		fmt.Fprintln(os.Stderr, "dashboardplots:", err)
		os.Exit(1)
	}
}

func run(prom, dir, out string, rateInterval, maxRange time.Duration) error {
	prom = strings.TrimSuffix(prom, "/")
	graphURL := prom + "/classic/graph"
	if status, err := httpStatus(graphURL); err != nil {
		return err
	} else if status != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: this needs Prometheus' classic web UI (Prometheus 2)", graphURL, status)
	}
	start, err := firstSample(prom)
	if err != nil {
		return err
	}
	end := time.Now().UTC()
	// Whole minutes, rounded up so that the first samples are in the graph.
	span := min((end.Sub(start) + time.Minute - 1).Truncate(time.Minute), maxRange)
	if span < time.Minute {
		span = time.Minute
	}
	fmt.Printf("plotting %s up to %s\n", span, end.Format(time.DateTime))

	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no dashboards in %s (%v)", dir, err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	ctx, cancel, err := browser.Start(context.Background())
	if err != nil {
		return err
	}
	defer cancel()

	var empty []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var d struct {
			Panels []panel `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		for _, p := range flatten(d.Panels) {
			if len(p.Targets) == 0 {
				continue
			}
			expr := combined(p, rateInterval)
			q := url.Values{}
			q.Set("g0.expr", expr)
			q.Set("g0.tab", "0")
			if p.Type == "state-timeline" {
				// Stacked, each series that is 1 while its state holds is a band of its
				// own colour, as the state timeline's rows are.
				q.Set("g0.stacked", "1")
			}
			q.Set("g0.range_input", fmt.Sprintf("%dm", int(span.Minutes())))
			q.Set("g0.end_input", end.Format("2006-01-02 15:04"))
			q.Set("g0.moment_input", end.Format("2006-01-02 15:04:05"))
			q.Set("g0.step_input", fmt.Sprint(max(1, int(span.Seconds())/300)))
			file := filepath.Join(out, fmt.Sprintf("%s-%d.png", name, p.ID))
			caption := ""
			if len(p.Targets) > 1 {
				caption = fmt.Sprintf("The panel's %d queries on one graph, each labelled target; the queries are in dashboards/%s.json, panel %d.", len(p.Targets), name, p.ID)
			}
			hasData, err := shoot(ctx, graphURL+"?"+q.Encode(), p.Title, caption, file)
			if err != nil {
				return fmt.Errorf("%s panel %d %q: %w", name, p.ID, p.Title, err)
			}
			fmt.Printf("%s  %s\n", file, p.Title)
			if !hasData {
				empty = append(empty, fmt.Sprintf("%s panel %d %q", name, p.ID, p.Title))
			}
		}
	}
	for _, e := range empty {
		fmt.Printf("no data: %s\n", e)
	}
	return nil
}

var variableRE = regexp.MustCompile(`\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?`)

// combined returns one expression that draws all of a panel's targets, each labelled
// target="<legend or refId>", as Grafana draws them on one panel.
func combined(p panel, rateInterval time.Duration) string {
	var parts []string
	for _, t := range p.Targets {
		expr := strings.ReplaceAll(t.Expr, "$__rate_interval", promDuration(rateInterval))
		// "All" databases, clusters and namespaces is ".*": it matches the series of an
		// exporter that watches one database, which have no database label, and those of
		// a Prometheus that labels no cluster or namespace (make run's).
		for _, v := range []string{"database", "cluster", "namespace"} {
			expr = strings.ReplaceAll(expr, `"$`+v+`"`, `".*"`)
		}
		expr = variableRE.ReplaceAllString(expr, ".+")
		if len(p.Targets) == 1 {
			return expr
		}
		name := t.LegendFormat
		if name == "" || name == "__auto" || strings.Contains(name, "{{") {
			name = t.RefID
			if t.LegendFormat != "" && t.LegendFormat != "__auto" {
				name = strings.TrimSpace(regexp.MustCompile(`\{\{[^}]*\}\}`).ReplaceAllString(t.LegendFormat, ""))
			}
		}
		parts = append(parts, fmt.Sprintf(`label_replace(%s, "target", %q, "", "")`, expr, name))
	}
	return strings.Join(parts, "\nor\n")
}

func promDuration(d time.Duration) string {
	return fmt.Sprintf("%ds", int(d.Seconds()))
}

func flatten(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		if p.Type != "row" {
			out = append(out, p)
		}
		out = append(out, flatten(p.Panels)...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// pageCSS trims the graph page to the panel's title, its expression, the graph and its
// legend.
const pageCSS = `
nav, .query-history, #add_graph, .form-inline, .eval_stats, .spinner, a[name=remove],
.nav-tabs, .prometheus_input_group, .graph_container > .clearfix { display: none !important; }
body { padding-top: 0 !important; }
textarea.expression_input { font-size: 11px; font-family: monospace; resize: none; overflow: hidden; }
.panel_title { font: bold 16px sans-serif; margin: 6px 0; }
`

// shoot renders one graph page and saves the graph's wrapper as a PNG; it reports whether
// the query returned data.
// A long combined expression stands in for several queries and would dwarf the graph; a
// caption replaces it.
func shoot(ctx context.Context, pageURL, title, caption, file string) (bool, error) {
	tctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	const ready = `(() => {
		const w = document.querySelector('#graph_wrapper0');
		if (!w) return '';
		const err = w.querySelector('.error');
		if (err && err.offsetParent !== null && err.innerText.trim() !== '') return 'error:' + err.innerText.trim();
		if (w.querySelector('.graph svg path')) return 'data';
		return '';
	})()`
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(900, 700), chromedp.Navigate(pageURL)); err != nil {
		return false, err
	}
	state, err := chromedp.Run(tctx, chromedp.Poll[string](ready, chromedp.WithPollingInterval(200*time.Millisecond)))
	if err != nil {
		return false, err
	}
	// The legend and the axes are drawn after the lines.
	if err := chromedp.Do(tctx, chromedp.Sleep(500*time.Millisecond)); err != nil {
		return false, err
	}
	hasData := state == "data"
	if !hasData && !strings.Contains(state, "No datapoints") {
		return false, errors.New(strings.TrimPrefix(state, "error:"))
	}
	script := fmt.Sprintf(`(() => {
		const s = document.createElement('style'); s.textContent = %q; document.head.appendChild(s);
		const w = document.querySelector('#graph_wrapper0');
		const h = document.createElement('div'); h.className = 'panel_title'; h.textContent = %q;
		w.prepend(h);
		const ta = w.querySelector('textarea'); ta.style.height = '0'; ta.style.height = ta.scrollHeight + 'px';
		if (%q !== '') {
			ta.style.display = 'none';
			const c = document.createElement('div'); c.style.font = '12px sans-serif'; c.textContent = %q;
			h.after(c);
		}
		return true;
	})()`, pageCSS, title, caption, caption)
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](script)); err != nil {
		return false, err
	}
	if err := chromedp.Do(tctx, chromedp.Sleep(200*time.Millisecond)); err != nil {
		return false, err
	}
	shot, err := chromedp.Run(tctx, chromedp.ScreenshotScale("#graph_wrapper0", 0.75))
	if err != nil {
		return false, err
	}
	small, err := shrink(shot)
	if err != nil {
		return false, err
	}
	return hasData, os.WriteFile(file, small, 0o644)
}

// shrink re-encodes a screenshot with a 256-colour palette and the best compression:
// the plots are lines and text on white, which lose nothing visible.
func shrink(shot []byte) ([]byte, error) {
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		return nil, err
	}
	pal := image.NewPaletted(img.Bounds(), palette.Plan9)
	draw.Draw(pal, img.Bounds(), img, img.Bounds().Min, draw.Src)
	var b bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(&b, pal); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

var client = &http.Client{Timeout: 10 * time.Second}

func httpStatus(u string) (int, error) {
	resp, err := client.Get(u)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// firstSample returns the time of the oldest sample in Prometheus' head block: when the
// demo's Prometheus started.
func firstSample(prom string) (time.Time, error) {
	resp, err := client.Get(prom + "/api/v1/status/tsdb")
	if err != nil {
		return time.Time{}, err
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			HeadStats struct {
				MinTime int64 `json:"minTime"`
			} `json:"headStats"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return time.Time{}, fmt.Errorf("%s/api/v1/status/tsdb: %w", prom, err)
	}
	if body.Data.HeadStats.MinTime <= 0 {
		return time.Time{}, fmt.Errorf("%s has no samples yet", prom)
	}
	return time.UnixMilli(body.Data.HeadStats.MinTime), nil
}
