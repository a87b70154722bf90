package docquote

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/pg-liveness/pg_liveness_exporter/internal/cli"
	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// bytes is a setting that is a size: the docs write it with a unit of bytes.
type bytes int

// Settings are the values of the code the docs quote by name (<!-- default:NAME -->): the
// library's and the binary's defaults (internal/defaults, by their own names) and what
// follows from them. A doc that quotes one the code has changed fails
// TestDocsFiguresAreRunsOrCode; a doc that needs one more adds it here, from the code.
func Settings() map[string]any {
	lib := liveness.AgentConfig{Reaper: true}
	return map[string]any{
		"HeartbeatInterval":        defaults.HeartbeatInterval,
		"HeartbeatSlowInterval":    defaults.HeartbeatSlowInterval,
		"StaleThreshold":           defaults.StaleThreshold,
		"DefinitiveDeadCutoff":     defaults.DefinitiveDeadCutoff,
		"LockGrace":                defaults.LockGrace,
		"KeepaliveIdle":            defaults.KeepaliveIdle,
		"KeepaliveInterval":        defaults.KeepaliveInterval,
		"KeepaliveCount":           defaults.KeepaliveCount,
		"UserTimeout":              defaults.UserTimeout,
		"VerifyInterval":           defaults.VerifyInterval,
		"ReaperInterval":           defaults.ReaperInterval,
		"ReaperLeaseTTL":           defaults.ReaperLeaseTTL,
		"HistoryRetention":         defaults.HistoryRetention,
		"JobWindDown":              defaults.JobWindDown,
		"ShutdownTimeout":          defaults.ShutdownTimeout,
		"DuplicateTimeout":         defaults.DuplicateTimeout,
		"ElectorTTL":               defaults.ElectorTTL,
		"ElectorRetryPeriod":       defaults.ElectorRetryPeriod,
		"ElectorQuietPeriod":       defaults.ElectorQuietPeriod,
		"ShardsPollPeriod":         defaults.ShardsPollPeriod,
		"NodeAgentMaxConnections":  defaults.NodeAgentMaxConnections,
		"NodeAgentMaxMessageBytes": bytes(defaults.NodeAgentMaxMessageBytes),
		"WatchInterval":            defaults.WatchInterval,
		"WatchAlivePoll":           defaults.WatchAlivePoll,

		// The agent's clean-up on SIGTERM, with the binary's defaults.
		"ShutdownBudget": lib.ShutdownBudget(),

		"database.ConnectTimeout": database.DefaultConnectTimeout,
		"status.Refresh":          status.DefaultRefresh,
		"status.HistoryWindow":    status.DefaultHistoryWindow,
	}
}

// Quantify is a setting's value as a quantity, to compare with what a doc writes.
func Quantify(v any) (Quantity, error) {
	switch v := v.(type) {
	case time.Duration:
		return Quantity{Value: float64(v), Dim: "duration"}, nil
	case bytes:
		return Quantity{Value: float64(v), Dim: "size"}, nil
	case int:
		return Quantity{Value: float64(v), Dim: "count"}, nil
	case int32:
		return Quantity{Value: float64(v), Dim: "count"}, nil
	case float64:
		return Quantity{Value: v, Dim: "count"}, nil
	}
	return Quantity{}, fmt.Errorf("a setting of type %T", v)
}

// FlagDefaults are the binary's flags' defaults, as they are declared, by the flag's name
// with its dashes (<!-- flag:--agent.heartbeat-interval -->).
func FlagDefaults() map[string]string {
	app, _ := cli.NewApp(io.Discard)
	out := map[string]string{}
	for _, f := range app.Model().Flags {
		if len(f.Default) == 1 {
			out["--"+f.Name] = f.Default[0]
		}
	}
	return out
}

// FlagQuantity is a flag's default as a quantity: a duration ("1m0s") or a number.
func FlagQuantity(def string) (Quantity, error) {
	if d, err := time.ParseDuration(def); err == nil {
		return Quantity{Value: float64(d), Dim: "duration"}, nil
	}
	return ParseQuantity(def)
}

// AlertFors are the alert rules' `for` durations by alert name, read from the rules file
// (<!-- alert:PgLivenessInstanceDead -->).
func AlertFors(path string) (map[string]time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				For   string `yaml:"for"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]time.Duration{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			var d model.Duration
			if r.For != "" {
				if d, err = model.ParseDuration(r.For); err != nil {
					return nil, fmt.Errorf("%s: alert %s: for %q: %w", path, r.Alert, r.For, err)
				}
			}
			out[r.Alert] = time.Duration(d)
		}
	}
	return out, nil
}
