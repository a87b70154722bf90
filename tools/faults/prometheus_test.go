package faults

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/sampler"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/wait"
)

// rulesFile is the alert rule file the project ships, loaded unchanged.
const rulesFile = "../../alerts/pg_liveness.rules.yml"

// twoLeadersAlert is the alert that shows a process that still believes it leads.
const twoLeadersAlert = "PgLivenessLeaseTwoLeaders"

// prometheus is a real Prometheus (the Debian package) scraping its targets and
// evaluating the shipped rules every second, and a sampler of its active alerts.
type prometheus struct {
	addr   string
	server *proctest.Prometheus
	stop   func() // ends sampling and the process; idempotent

	mu      sync.Mutex
	samples []alertSample
}

// alertSample is the state of one alert, as GET /api/v1/alerts said, at one time:
// "" (inactive), "pending" or "firing".
type alertSample struct {
	At    time.Time
	State string
}

func startPrometheus(t *testing.T, alert string, targets ...string) *prometheus {
	t.Helper()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	p := &prometheus{server: proctest.StartPrometheus(t, map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"rule_files": []string{rules},
		"scrape_configs": []any{map[string]any{
			"job_name":       "pg_liveness",
			"static_configs": []any{map[string]any{"targets": targets}},
		}},
	}, "--log.level=warn")}
	p.addr = p.server.Addr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.sampleLoop(ctx, alert)
	}()
	var once sync.Once
	p.stop = func() { once.Do(func() { cancel(); <-done; p.server.Stop(10 * time.Second) }) }
	t.Cleanup(p.stop)
	return p
}

func (p *prometheus) sampleLoop(ctx context.Context, alert string) {
	client := &http.Client{Timeout: 2 * time.Second}
	wait.Every(ctx, 250*time.Millisecond, func() {
		if states, err := sampler.Alerts(ctx, client, p.addr); err == nil {
			p.mu.Lock()
			p.samples = append(p.samples, alertSample{time.Now(), states[alert]})
			p.mu.Unlock()
		}
	})
}

// first returns how long after t0 the alert was first sampled in state.
func (p *prometheus) first(t0 time.Time, state string) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.samples {
		if !s.At.Before(t0) && s.State == state {
			return s.At.Sub(t0), true
		}
	}
	return 0, false
}

// active sums, between from and to, how long the alert was sampled pending and whether
// it was ever sampled firing, and counts the samples.
func (p *prometheus) active(from, to time.Time) (pending time.Duration, fired bool, samples int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var prev time.Time
	for _, s := range p.samples {
		if s.At.Before(from) || s.At.After(to) {
			continue
		}
		samples++
		switch s.State {
		case "firing":
			fired = true
		case "pending":
			if !prev.IsZero() {
				pending += s.At.Sub(prev)
			}
		}
		prev = s.At
	}
	return pending, fired, samples
}

// query runs an instant query and returns how many samples it gave.
func (p *prometheus) query(expr string) (int, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	req, _ := http.NewRequest(http.MethodGet, "http://"+p.addr+"/api/v1/query", nil)
	q := req.URL.Query()
	q.Set("query", expr)
	req.URL.RawQuery = q.Encode()
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, err
	}
	return len(body.Data.Result), nil
}
