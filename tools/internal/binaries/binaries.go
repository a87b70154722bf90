// Package binaries builds the programs that the fault suite (tools/faults) and the soak
// (tools/soak) run as processes of their own, the exporter and the faultagent, and reads
// the agent flags' defaults from the exporter's --help, so that the agents of both run at
// whatever defaults the binary ships.
package binaries

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// AgentFlags are the exporter's agent flags whose defaults the agents are started with.
var AgentFlags = []string{
	"agent.heartbeat-interval", "agent.heartbeat-slow-interval", "agent.stale-threshold",
	"agent.definitive-dead-cutoff", "agent.tcp-keepalive-idle", "agent.tcp-keepalive-interval",
	"agent.tcp-keepalive-count", "agent.tcp-user-timeout", "agent.reaper-interval",
	"agent.reaper-lease-ttl",
}

// Built are the binaries Build made, in Dir.
type Built struct {
	Dir      string
	Exporter string // the exporter, from the repository's root module, with its dependencies
	Agent    string // tools/cmd/faultagent
}

// Build builds the exporter and the faultagent, without -race (a fleet of them shares two
// cores with its servers), into a new temporary folder named after prefix. It runs
// within the tools module, as its tests do.
func Build(prefix string) (Built, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return Built{}, fmt.Errorf("go env GOMOD: %v", err)
	}
	tools := filepath.Dir(strings.TrimSpace(string(gomod)))
	if filepath.Base(tools) != "tools" {
		return Built{}, fmt.Errorf("binaries.Build runs within the tools module, not %s", tools)
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return Built{}, err
	}
	b := Built{Dir: dir, Exporter: filepath.Join(dir, "pg_liveness_exporter"), Agent: filepath.Join(dir, "faultagent")}
	// The exporter is built in its own module (the repository's root), with the
	// dependencies it ships with; the faultagent in this one.
	for _, p := range []struct{ out, dir, pkg string }{{b.Exporter, filepath.Dir(tools), "."}, {b.Agent, tools, "./cmd/faultagent"}} {
		build := exec.Command("go", "build", "-o", p.out, p.pkg)
		build.Dir = p.dir
		if out, err := build.CombinedOutput(); err != nil {
			b.Remove()
			return Built{}, fmt.Errorf("go build %s: %v\n%s", p.pkg, err, out)
		}
	}
	return b, nil
}

// Main is a TestMain of a package whose tests run the binaries: it builds them into b,
// runs the tests with pgtest.Run (which stops the package's shared server), then after
// (when not nil) with their exit code, removes the binaries and exits with the code
// after returns.
func Main(m *testing.M, prefix string, b *Built, after func(code int) int) {
	flag.Parse()
	var err error
	if *b, err = Build(prefix); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := pgtest.Run(m)
	if after != nil {
		code = after(code)
	}
	b.Remove()
	os.Exit(code)
}

// Remove deletes the binaries' folder.
func (b Built) Remove() { _ = os.RemoveAll(b.Dir) }

// AgentDefaults reads the defaults of AgentFlags from the exporter's --help, by flag
// name; an error names a flag whose default it does not show.
func (b Built) AgentDefaults() (map[string]string, error) {
	out, _ := exec.Command(b.Exporter, "--help").CombinedOutput()
	defaults := map[string]string{}
	for _, m := range regexp.MustCompile(`--(agent\.[a-z.-]+)=(\S+)`).FindAllStringSubmatch(string(out), -1) {
		defaults[m[1]] = m[2]
	}
	for _, name := range AgentFlags {
		if _, ok := defaults[name]; !ok {
			return nil, fmt.Errorf("the exporter's --help shows no default for --%s", name)
		}
	}
	return defaults, nil
}
