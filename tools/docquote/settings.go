package docquote

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/cli"
	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/lifegate"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent/proto"
	"github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// bytes is a setting that is a size: the docs write it with a unit of bytes.
type bytes int

// share is a setting that is a percentage: the docs write it with "%".
type share float64

// Settings are the values of the code the docs quote by name (<!-- default:NAME -->): the
// library's and the binary's defaults (internal/defaults, by their own names), values
// other packages keep (by package and name: read from the source when unexported, so
// that the API does not grow for a doc), and what follows from them. A value that cannot
// be read is an error, which fails the quote. A doc that quotes one the code has changed
// fails TestDocsFiguresAreRunsOrCode; a doc that needs one more adds it here, from the
// code.
func Settings(root string) map[string]any {
	lib := liveness.AgentConfig{Reaper: true}
	gate := lifegate.Timing{Grace: defaults.LockGrace}
	src := func(dir, name string) any {
		v, err := SourceValue(root, dir, name)
		if err != nil {
			return err
		}
		return v
	}
	// withSource is f of a duration read from the source, or the error that reading it
	// gave: a value derived from one that cannot be read is no value.
	withSource := func(dir, name string, f func(time.Duration) any) any {
		d, ok := src(dir, name).(time.Duration)
		if !ok {
			return fmt.Errorf("%s.%s: %v is no duration", filepath.Base(dir), name, src(dir, name))
		}
		return f(d)
	}
	_, clientUserTimeout, err := alivelock.Config{DSN: "postgres://docs@127.0.0.1/docs", InstanceID: uuid.New(),
		ServiceName: "docs"}.ConnConfig()
	var clientTimeout any = clientUserTimeout
	if err != nil {
		clientTimeout = err
	}
	var gc any = src(".", "gcPercent")
	if n, ok := gc.(int); ok {
		gc = share(n)
	}
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

		// The agent's clean-up on SIGTERM with the binary's defaults, and with the HTTP
		// server's shutdown after it: what a SIGTERM may take.
		"ShutdownBudget": lib.ShutdownBudget(),
		"ShutdownTotal":  withSource("internal/server", "shutdownTimeout", func(d time.Duration) any { return lib.ShutdownBudget() + d }),
		// A beat's deadline at the defaults: half the fast interval, at most the cap
		// (liveness's beatTimeout).
		"liveness.BeatTimeout": withSource("liveness", "heartbeatMaxStatementTimeout", func(d time.Duration) any {
			return min(defaults.HeartbeatInterval/2, d)
		}),
		// The life gate's margin at the defaults: half the fast interval (liveness's
		// newLifeMonitor).
		"lifegate.Margin": defaults.HeartbeatInterval / 2,
		// The margin Agent.WatchAlive's error suggests above the slow interval.
		"liveness.WatchAliveSuggestedMaxHeartbeatAge": defaults.HeartbeatSlowInterval + defaults.HeartbeatSlowInterval/2,

		"lifegate.ProofMaxAge":           gate.ProofMaxAge(),
		"lifegate.LeaderVerifyInterval":  gate.LeaderVerifyInterval(),
		"alivelock.ReconnectBackoffMin":  alivelock.ReconnectBackoffMin,
		"alivelock.ReconnectBackoffMax":  alivelock.ReconnectBackoffMax,
		"alivelock.clientUserTimeout":    clientTimeout,
		"alivelock.nodeAgentRedialEvery": src("internal/alivelock", "nodeAgentRedialEvery"),
		"database.ConnectTimeout":        database.DefaultConnectTimeout,
		"database.TCPHandshakeTimeout":   database.TCPHandshakeTimeout,
		"database.authBackoffMin":        src("internal/database", "authBackoffMin"),
		"database.authBackoffMax":        src("internal/database", "authBackoffMax"),
		"dsn.MaxFileSize":                bytes(dsn.MaxFileSize),
		"store.MaxIdentifierLength":      bytes(store.MaxIdentifierLength),
		"status.Refresh":                 status.DefaultRefresh,
		"status.HistoryWindow":           status.DefaultHistoryWindow,
		"status.maxHistoryWindow":        src("internal/status", "maxHistoryWindow"),
		"status.historyTimeout":          src("internal/status", "historyTimeout"),
		"status.maxWait":                 src("internal/status", "maxWait"),
		"status.queryTimeout":            src("internal/status", "queryTimeout"),
		"status.pagesPerSecond":          src("internal/status", "pagesPerSecond"),
		"status.pageBurst":               src("internal/status", "pageBurst"),
		"liveness.releaseRetry":          src("liveness", "releaseRetry"),
		"liveness.shardReleaseRetry":     src("liveness", "shardReleaseRetry"),
		"liveness.proofRetry":            src("liveness", "proofRetry"),
		"liveness.watcherRetryPeriod":    src("liveness", "watcherRetryPeriod"),
		"liveness.reaperMaxRetryPeriod":  src("liveness", "reaperMaxRetryPeriod"),
		"nodeagent.tcpAttachTimeout":     src("internal/nodeagent", "tcpAttachTimeout"),
		"nodeagent.rareLogEvery":         src("internal/nodeagent", "rareLogEvery"),
		"nodeagent.handOverWait":         src("internal/nodeagent", "handOverWait"),
		"proto.TCPDeadPeer":              proto.TCPDeadPeer,
		"proto.TCPKeepalive.Idle":        proto.TCPKeepalive.Idle,
		"proto.TCPKeepalive.Interval":    proto.TCPKeepalive.Interval,
		"proto.TCPKeepalive.Count":       proto.TCPKeepalive.Count,
		"proto.TokenMin":                 bytes(proto.TokenMin),
		"server.shutdownGrace":           src("internal/server", "shutdownGrace"),
		"server.shutdownTimeout":         src("internal/server", "shutdownTimeout"),
		"targets.closeGrace":             src("internal/targets", "closeGrace"),
		"targets.minTurnBudget":          src("internal/targets", "minTurnBudget"),
		"reload.filePoll":                src("internal/reload", "filePoll"),
		"collector.ofLocksRecheck":       src("collector", "ofLocksRecheck"),
		"main.gcPercent":                 gc,
		"dashboardplots.defaultMaxRange": src("tools/cmd/dashboardplots", "defaultMaxRange"),
	}
}

// Quantify is a setting's value as a quantity, to compare with what a doc writes.
func Quantify(v any) (Quantity, error) {
	switch v := v.(type) {
	case error:
		return Quantity{}, v
	case share:
		return Quantity{Value: float64(v), Dim: "share"}, nil
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

// Rule is an alert rule's `for` and expression.
type Rule struct {
	For  time.Duration
	Expr string
}

// AlertRules are the alert rules by name, read from the rules file: a doc quotes a rule's
// `for` (<!-- alert:PgLivenessInstanceDead -->) or a figure its expression holds
// (<!-- alert:PgLivenessLeaseFlapping expr -->).
func AlertRules(path string) (map[string]Rule, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				For   string `yaml:"for"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]Rule{}
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
			out[r.Alert] = Rule{For: time.Duration(d), Expr: r.Expr}
		}
	}
	return out, nil
}

// InExpr says whether a rule's expression holds the figure: a duration as PromQL writes
// it ("[30m]", "30m") or in seconds ("> 120"), a share as a fraction (75 % as 0.75), a
// plain number as itself.
func InExpr(expr string, q Quantity) bool {
	var forms []string
	switch q.Dim {
	case "duration":
		forms = []string{model.Duration(time.Duration(q.Value)).String(), strconv.FormatFloat(q.Value/1e9, 'f', -1, 64)}
	case "share":
		forms = []string{strconv.FormatFloat(q.Value/100, 'f', -1, 64)}
	default:
		forms = []string{strconv.FormatFloat(q.Value, 'f', -1, 64)}
	}
	for _, f := range forms {
		if regexp.MustCompile(`(^|[^\w.])` + regexp.QuoteMeta(f) + `($|[^\w.])`).MatchString(expr) {
			return true
		}
	}
	return false
}

// YAMLValue is a value of a YAML file of the repository (the chart's values.yaml, which
// the manifests are checked against), by its dotted path, as a quantity: a Kubernetes
// size ("48Mi"), a duration ("45s"), a count of seconds under a key that says so
// (terminationGracePeriodSeconds), or a number.
func YAMLValue(path, dotted string) (Quantity, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Quantity{}, err
	}
	var node any
	if err := yaml.Unmarshal(b, &node); err != nil {
		return Quantity{}, fmt.Errorf("%s: %w", path, err)
	}
	keys := strings.Split(dotted, ".")
	for _, k := range keys {
		m, ok := node.(map[string]any)
		if !ok {
			return Quantity{}, fmt.Errorf("%s: %s: %q is not under a mapping", path, dotted, k)
		}
		if node, ok = m[k]; !ok {
			return Quantity{}, fmt.Errorf("%s has no %s", path, dotted)
		}
	}
	switch v := node.(type) {
	case int:
		if strings.HasSuffix(keys[len(keys)-1], "Seconds") {
			return Quantity{Value: float64(v) * 1e9, Dim: "duration"}, nil
		}
		return Quantity{Value: float64(v), Dim: "count"}, nil
	case string:
		for suffix, size := range map[string]float64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
			if n, ok := strings.CutSuffix(v, suffix); ok {
				f, err := strconv.ParseFloat(n, 64)
				if err != nil {
					return Quantity{}, fmt.Errorf("%s: %s: %q: %w", path, dotted, v, err)
				}
				return Quantity{Value: f * size, Dim: "size"}, nil
			}
		}
		if d, err := model.ParseDuration(v); err == nil {
			return Quantity{Value: float64(d), Dim: "duration"}, nil
		}
	}
	return Quantity{}, fmt.Errorf("%s: %s is %v, which is no size, duration or number", path, dotted, node)
}
