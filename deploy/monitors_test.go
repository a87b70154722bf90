package deploy

// Labels survive every shipped monitor: each monitor shape the kustomizations and the chart
// render (PodMonitor, ServiceMonitor, Probe) and the plain scrape_config of
// docs/many-databases.md is turned into the scrape configuration the Prometheus Operator
// generates for it, that configuration's relabelling is applied with Prometheus' own
// relabel library to the labels Kubernetes' service discovery gives the rendered pods, the
// exporter's real exposition (collector/testdata/scenario.prom, which the collector's
// scenario test asserts) is attached to the resulting targets as a scrape attaches it
// (honor_labels included), and promtool runs the alert rules over the series that result. A
// monitor that renames the fleet's service label (a ServiceMonitor adds service=<its
// Service>), or a two-leaders alert that two deployments meet in, fails here.

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
)

// rule parses one relabel rule written as Prometheus' YAML, with Prometheus' defaults.
func rule(t *testing.T, y string) *relabel.Config {
	t.Helper()
	var c relabel.Config
	if err := yaml.Unmarshal([]byte(y), &c); err != nil {
		t.Fatalf("relabel rule %q: %v", y, err)
	}
	if err := c.Validate(model.UTF8Validation); err != nil {
		t.Fatalf("relabel rule %q: %v", y, err)
	}
	return &c
}

// userRules converts the monitors' own relabelings as the operator does
// (generateRelabelConfig): the fields given, Prometheus' defaults for the others.
func userRules(t *testing.T, rcs []monitoringv1.RelabelConfig) []*relabel.Config {
	t.Helper()
	var out []*relabel.Config
	for _, rc := range rcs {
		m := map[string]any{}
		if len(rc.SourceLabels) > 0 {
			var sl []string
			for _, l := range rc.SourceLabels {
				sl = append(sl, string(l))
			}
			m["source_labels"] = sl
		}
		if rc.Separator != nil {
			m["separator"] = *rc.Separator
		}
		if rc.TargetLabel != "" {
			m["target_label"] = rc.TargetLabel
		}
		if rc.Regex != "" {
			m["regex"] = rc.Regex
		}
		if rc.Modulus != 0 {
			m["modulus"] = rc.Modulus
		}
		if rc.Replacement != nil {
			m["replacement"] = *rc.Replacement
		}
		if rc.Action != "" {
			m["action"] = strings.ToLower(rc.Action)
		}
		b, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rule(t, string(b)))
	}
	return out
}

var invalidLabelChar = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// sanitize is Kubernetes service discovery's (and the operator's) label-name mangling.
func sanitize(s string) string { return invalidLabelChar.ReplaceAllString(s, "_") }

// scrapeConfig is the part of a generated scrape configuration this test applies.
type scrapeConfig struct {
	job           string
	honorLabels   bool
	relabel       []*relabel.Config
	metricRelabel []*relabel.Config
}

// keepLabel is the operator's filter of one selector label.
func keepLabels(t *testing.T, prefix string, match map[string]string) []*relabel.Config {
	t.Helper()
	var out []*relabel.Config
	for _, k := range slices.Sorted(maps.Keys(match)) {
		out = append(out, rule(t, fmt.Sprintf("{action: keep, source_labels: [%s%s], regex: %q}", prefix, sanitize(k), match[k])))
	}
	return out
}

// podMonitorConfig is the operator's generatePodMonitorConfig for one endpoint.
func podMonitorConfig(t *testing.T, pm *monitoringv1.PodMonitor, i int) scrapeConfig {
	t.Helper()
	ep := pm.Spec.PodMetricsEndpoints[i]
	rcs := []*relabel.Config{rule(t, "{source_labels: [job], target_label: __tmp_prometheus_job_name}")}
	rcs = append(rcs, keepLabels(t, "__meta_kubernetes_pod_label_", pm.Spec.Selector.MatchLabels)...)
	rcs = append(rcs,
		rule(t, fmt.Sprintf("{action: keep, source_labels: [__meta_kubernetes_pod_container_port_name], regex: %q}", *ep.Port)),
		rule(t, "{source_labels: [__meta_kubernetes_namespace], target_label: namespace}"),
		rule(t, "{source_labels: [__meta_kubernetes_pod_container_name], target_label: container}"),
		rule(t, "{source_labels: [__meta_kubernetes_pod_name], target_label: pod}"),
		rule(t, fmt.Sprintf("{target_label: job, replacement: %q}", pm.Namespace+"/"+pm.Name)),
		rule(t, fmt.Sprintf("{target_label: endpoint, replacement: %q}", *ep.Port)))
	rcs = append(rcs, userRules(t, ep.RelabelConfigs)...)
	return scrapeConfig{job: fmt.Sprintf("podMonitor/%s/%s/%d", pm.Namespace, pm.Name, i), honorLabels: ep.HonorLabels,
		relabel: rcs, metricRelabel: userRules(t, ep.MetricRelabelConfigs)}
}

// serviceMonitorConfig is the operator's generateServiceMonitorConfig for one endpoint.
func serviceMonitorConfig(t *testing.T, sm *monitoringv1.ServiceMonitor, i int) scrapeConfig {
	t.Helper()
	ep := sm.Spec.Endpoints[i]
	rcs := []*relabel.Config{rule(t, "{source_labels: [job], target_label: __tmp_prometheus_job_name}")}
	rcs = append(rcs, keepLabels(t, "__meta_kubernetes_service_label_", sm.Spec.Selector.MatchLabels)...)
	rcs = append(rcs,
		rule(t, fmt.Sprintf("{action: keep, source_labels: [__meta_kubernetes_endpoint_port_name], regex: %q}", ep.Port)),
		rule(t, `{source_labels: [__meta_kubernetes_endpoint_address_target_kind, __meta_kubernetes_endpoint_address_target_name], separator: ";", regex: "Node;(.*)", replacement: "${1}", target_label: node}`),
		rule(t, `{source_labels: [__meta_kubernetes_endpoint_address_target_kind, __meta_kubernetes_endpoint_address_target_name], separator: ";", regex: "Pod;(.*)", replacement: "${1}", target_label: pod}`),
		rule(t, "{source_labels: [__meta_kubernetes_namespace], target_label: namespace}"),
		rule(t, "{source_labels: [__meta_kubernetes_service_name], target_label: service}"),
		rule(t, "{source_labels: [__meta_kubernetes_pod_name], target_label: pod}"),
		rule(t, "{source_labels: [__meta_kubernetes_pod_container_name], target_label: container}"),
		rule(t, `{source_labels: [__meta_kubernetes_service_name], target_label: job, replacement: "${1}"}`),
		rule(t, fmt.Sprintf("{target_label: endpoint, replacement: %q}", ep.Port)))
	rcs = append(rcs, userRules(t, ep.RelabelConfigs)...)
	return scrapeConfig{job: fmt.Sprintf("serviceMonitor/%s/%s/%d", sm.Namespace, sm.Name, i), honorLabels: ep.HonorLabels,
		relabel: rcs, metricRelabel: userRules(t, ep.MetricRelabelConfigs)}
}

// probeTargets is the operator's generateProbeConfig for a static Probe: each target
// with the static labels (namespace: the Probe's), and the prober's relabelling.
func probeTargets(t *testing.T, p *monitoringv1.Probe) (scrapeConfig, []labels.Labels) {
	t.Helper()
	rcs := []*relabel.Config{rule(t, "{source_labels: [job], target_label: __tmp_prometheus_job_name}")}
	if p.Spec.JobName != "" {
		rcs = append(rcs, rule(t, fmt.Sprintf("{target_label: job, replacement: %q}", p.Spec.JobName)))
	}
	sc := p.Spec.Targets.StaticConfig
	rcs = append(rcs,
		rule(t, "{source_labels: [__address__], target_label: __param_target}"),
		rule(t, "{source_labels: [__param_target], target_label: instance}"),
		rule(t, fmt.Sprintf("{target_label: __address__, replacement: %q}", p.Spec.ProberSpec.URL)))
	rcs = append(rcs, userRules(t, sc.RelabelConfigs)...)
	static := map[string]string{"namespace": p.Namespace}
	for k, v := range sc.Labels {
		static[k] = v
	}
	var metas []labels.Labels
	for _, addr := range sc.Targets {
		m := maps.Clone(static)
		m["__address__"] = string(addr)
		metas = append(metas, labels.FromMap(m))
	}
	return scrapeConfig{job: "probe/" + p.Namespace + "/" + p.Name, relabel: rcs}, metas
}

// podMetas are the labels Kubernetes' pod role gives each port of each container of a
// pod of w, named name with address ip.
func podMetas(w workload, name, ip string) []labels.Labels {
	var out []labels.Labels
	for _, c := range w.template.Spec.Containers {
		for _, p := range c.Ports {
			m := map[string]string{
				"__address__":                                 fmt.Sprintf("%s:%d", ip, p.ContainerPort),
				"__meta_kubernetes_namespace":                 w.namespace,
				"__meta_kubernetes_pod_name":                  name,
				"__meta_kubernetes_pod_ip":                    ip,
				"__meta_kubernetes_pod_container_name":        c.Name,
				"__meta_kubernetes_pod_container_port_name":   p.Name,
				"__meta_kubernetes_pod_container_port_number": strconv.Itoa(int(p.ContainerPort)),
			}
			for k, v := range w.template.Labels {
				m["__meta_kubernetes_pod_label_"+sanitize(k)] = v
				m["__meta_kubernetes_pod_labelpresent_"+sanitize(k)] = "true"
			}
			out = append(out, labels.FromMap(m))
		}
	}
	return out
}

// endpointMetas are the labels Kubernetes' endpoints role gives each port of svc backed
// by the pod of w named name, with address ip.
func endpointMetas(svc *corev1.Service, w workload, name, ip string) []labels.Labels {
	var out []labels.Labels
	for _, sp := range svc.Spec.Ports {
		for _, pm := range podMetas(w, name, ip) {
			if pm.Get("__meta_kubernetes_pod_container_port_name") != sp.TargetPort.String() {
				continue
			}
			b := labels.NewBuilder(pm)
			b.Set("__meta_kubernetes_service_name", svc.Name)
			for k, v := range svc.Labels {
				b.Set("__meta_kubernetes_service_label_"+sanitize(k), v)
				b.Set("__meta_kubernetes_service_labelpresent_"+sanitize(k), "true")
			}
			b.Set("__meta_kubernetes_endpoint_port_name", sp.Name)
			b.Set("__meta_kubernetes_endpoint_address_target_kind", "Pod")
			b.Set("__meta_kubernetes_endpoint_address_target_name", name)
			out = append(out, b.Labels())
		}
	}
	return out
}

// targetLabels is what Prometheus makes of a discovered target (scrape.PopulateLabels):
// the job first, the relabelling, instance from the address when unset, and every label
// that starts with __ dropped. ok is false for a target the relabelling drops.
func targetLabels(sc scrapeConfig, meta labels.Labels) (labels.Labels, bool) {
	b := labels.NewBuilder(meta)
	b.Set("job", sc.job)
	b.Set("__metrics_path__", "/metrics")
	b.Set("__scheme__", "http")
	if !relabel.ProcessBuilder(b, sc.relabel...) {
		return labels.EmptyLabels(), false
	}
	if b.Get("instance") == "" {
		b.Set("instance", b.Get("__address__"))
	}
	out := labels.NewBuilder(labels.EmptyLabels())
	b.Labels().Range(func(l labels.Label) {
		if !strings.HasPrefix(l.Name, "__") && l.Value != "" {
			out.Set(l.Name, l.Value)
		}
	})
	return out.Labels(), true
}

// sample is one series a scrape stores.
type sample struct {
	labels  labels.Labels // with __name__
	value   float64
	counter bool
}

// scrape attaches target labels to each sample of the exposition as Prometheus' scrape
// loop does (mutateSampleLabels): with honor_labels the exposed labels win; without, the
// target's win and a conflicting exposed label is kept as exported_<name>. Then the
// metric relabelling.
func scrape(t *testing.T, target labels.Labels, sc scrapeConfig, exposition string) []sample {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(exposition))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
	var out []sample
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		f := fams[name]
		for _, m := range f.Metric {
			exposed := map[string]string{"__name__": name}
			for _, lp := range m.Label {
				exposed[lp.GetName()] = lp.GetValue()
			}
			b := labels.NewBuilder(labels.FromMap(exposed))
			var conflicts []labels.Label
			target.Range(func(l labels.Label) {
				if v := exposed[l.Name]; v != "" {
					if sc.honorLabels {
						return
					}
					conflicts = append(conflicts, labels.Label{Name: l.Name, Value: v})
				}
				b.Set(l.Name, l.Value)
			})
			sort.SliceStable(conflicts, func(i, j int) bool { return len(conflicts[i].Name) < len(conflicts[j].Name) })
			for _, c := range conflicts {
				n := c.Name
				for {
					n = model.ExportedLabelPrefix + n
					if b.Get(n) == "" {
						b.Set(n, c.Value)
						break
					}
				}
			}
			if !relabel.ProcessBuilder(b, sc.metricRelabel...) {
				continue
			}
			var v float64
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			default:
				v = m.GetUntyped().GetValue()
			}
			out = append(out, sample{labels: b.Labels(), value: v, counter: f.GetType() == dto.MetricType_COUNTER})
		}
	}
	return out
}

// scenario returns the exporter's real exposition, split as the shapes serve it: the
// observer's (and a /probe answer's) every family but the agent's; an agent's (the
// sidecars run without the fleet-wide collectors) the agent's and its database's
// identity, which every exporter exports.
func scenario(t *testing.T) (observer, agent string) {
	t.Helper()
	b, err := os.ReadFile("../collector/testdata/scenario.prom")
	if err != nil {
		t.Fatal(err)
	}
	var o, a strings.Builder
	for line := range strings.Lines(string(b)) {
		name := line
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" {
			name = f[2]
		}
		switch {
		case strings.HasPrefix(name, "pg_liveness_agent_"):
			a.WriteString(line)
		case strings.HasPrefix(name, "pg_liveness_database_info"):
			a.WriteString(line)
			o.WriteString(line)
		default:
			o.WriteString(line)
		}
	}
	return o.String(), a.String()
}

// withLeaseRow adds the reaper's lease row at epoch to an observer's exposition: the row
// the agents' pg_liveness_reaper beliefs (epoch 7 in the scenario) are compared with.
func withLeaseRow(t *testing.T, exposition string, epoch int) string {
	t.Helper()
	const after = "pg_liveness_lease_epoch{lease=\"cleanup\"} 1\n"
	if !strings.Contains(exposition, after) {
		t.Fatalf("the scenario's exposition has no %q", after)
	}
	return strings.Replace(exposition, after, after+fmt.Sprintf("pg_liveness_lease_epoch{lease=%q} %d\n", "pg_liveness_reaper", epoch), 1)
}

// alertCheck is one alert_rule_test of promtool: the alert fires with exactly these
// label sets at the evaluation time (none: it must not fire).
type alertCheck struct {
	alert string
	fires []map[string]string
}

// runRules runs promtool over the samples, each a series constant for 40 minutes but the
// counters in grow (their increase a minute), with the shipped rules less their
// annotations (the rules' own unit tests check those), and checks each alert.
func runRules(t *testing.T, samples []sample, grow map[string]float64, checks ...alertCheck) {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile("../alerts/pg_liveness.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string           `yaml:"name"`
			Rules []map[string]any `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			delete(r, "annotations")
		}
	}
	rb, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	rulesFile := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(rulesFile, rb, 0o600); err != nil {
		t.Fatal(err)
	}
	type series struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	type expAlert struct {
		ExpLabels map[string]string `yaml:"exp_labels"`
	}
	type ruleTest struct {
		EvalTime  string     `yaml:"eval_time"`
		Alertname string     `yaml:"alertname"`
		ExpAlerts []expAlert `yaml:"exp_alerts,omitempty"`
	}
	seen := map[string]bool{}
	var in []series
	for _, s := range samples {
		name := s.labels.Get("__name__")
		var pairs []string
		s.labels.Range(func(l labels.Label) {
			if l.Name != "__name__" {
				pairs = append(pairs, fmt.Sprintf("%s=%q", l.Name, l.Value))
			}
		})
		sel := name + "{" + strings.Join(pairs, ",") + "}"
		if seen[sel] {
			t.Fatalf("two samples of %s: two targets share every label", sel)
		}
		seen[sel] = true
		step := 0.0
		if s.counter {
			step = grow[name+"/"+s.labels.Get("statement")]
		}
		in = append(in, series{Series: sel, Values: fmt.Sprintf("%s+%sx40", strconv.FormatFloat(s.value, 'f', -1, 64), strconv.FormatFloat(step, 'f', -1, 64))})
	}
	var tests []ruleTest
	for _, c := range checks {
		rt := ruleTest{EvalTime: "40m", Alertname: c.alert}
		for _, f := range c.fires {
			rt.ExpAlerts = append(rt.ExpAlerts, expAlert{ExpLabels: f})
		}
		tests = append(tests, rt)
	}
	doc := map[string]any{
		"rule_files":          []string{rulesFile},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval": "1m", "input_series": in, "alert_rule_test": tests,
		}},
	}
	tb, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	testFile := filepath.Join(dir, "test.yml")
	if err := os.WriteFile(testFile, tb, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(proctest.NeedTool(t, "promtool", "prometheus"), "test", "rules", testFile).CombinedOutput()
	if err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
}

// without returns l without the named labels, as a map, plus extra.
func without(l labels.Labels, drop []string, extra map[string]string) map[string]string {
	m := l.Map()
	for _, d := range drop {
		delete(m, d)
	}
	maps.Copy(m, extra)
	return m
}

// agentTarget is a plain scrape of one agent, for the configured heartbeat interval the
// write-rate alerts read.
func agentTarget(t *testing.T, agent string) []sample {
	t.Helper()
	return scrape(t, labels.FromStrings("job", "pg_liveness_agent", "instance", "agent:9816"), scrapeConfig{}, agent)
}

// An observer's monitor, whichever shape, keeps the fleet's service label: the stale
// instances of service api alert as service="api" (not as the Kubernetes Service's name,
// with exported_service="api"), and heartbeats written far too fast alert at all.
func TestObserverMonitorsKeepTheServiceLabel(t *testing.T) {
	observer, agent := scenario(t)
	type shape struct {
		name   string
		target func(t *testing.T) (labels.Labels, scrapeConfig)
	}
	onlyTarget := func(t *testing.T, sc scrapeConfig, metas []labels.Labels) (labels.Labels, scrapeConfig) {
		t.Helper()
		var kept []labels.Labels
		for _, m := range metas {
			if l, ok := targetLabels(sc, m); ok {
				kept = append(kept, l)
			}
		}
		if len(kept) != 1 {
			t.Fatalf("%d targets kept by the monitor's relabelling, want 1: %v", len(kept), kept)
		}
		return kept[0], sc
	}
	podMonitor := func(r *rendered) func(t *testing.T) (labels.Labels, scrapeConfig) {
		return func(t *testing.T) (labels.Labels, scrapeConfig) {
			return onlyTarget(t, podMonitorConfig(t, r.podMonitors[0], 0), podMetas(ofDeployment(r.deployments[0]), r.deployments[0].Name+"-7d9f-abcde", "10.0.0.7"))
		}
	}
	probe := func(r *rendered) func(t *testing.T) (labels.Labels, scrapeConfig) {
		return func(t *testing.T) (labels.Labels, scrapeConfig) {
			sc, metas := probeTargets(t, r.probes[0])
			return onlyTarget(t, sc, metas[:1])
		}
	}
	helm := func(t *testing.T, values string) *rendered {
		t.Helper()
		r, err := helmTemplate(chartDir, "pg-liveness-exporter", "pg-liveness", chartCase{values: values}.chartValues(t))
		if err != nil {
			t.Fatal(err)
		}
		return r.rendered
	}
	shapes := []shape{
		{"kustomize observer, PodMonitor", podMonitor(render(t, "kubernetes/overlays/observer"))},
		{"helm observer, PodMonitor", podMonitor(helm(t, ""))},
		{"helm observer, ServiceMonitor", func(t *testing.T) (labels.Labels, scrapeConfig) {
			r := helm(t, "observer: {podMonitor: {enabled: false}, serviceMonitor: {enabled: true}}")
			d := r.deployments[0]
			return onlyTarget(t, serviceMonitorConfig(t, r.serviceMonitors[0], 0), endpointMetas(r.services[0], ofDeployment(d), d.Name+"-7d9f-abcde", "10.0.0.7"))
		}},
		{"kustomize multi-target, Probe", probe(render(t, "kubernetes/overlays/multi-target"))},
		{"helm multi-target, Probe", probe(helm(t, "multiTarget: {enabled: true, probe: {targets: [orders]}}"))},
		{"docs/many-databases.md's scrape_config", func(t *testing.T) (labels.Labels, scrapeConfig) {
			sc, metas := readmeProbeJob(t)
			return onlyTarget(t, sc, metas[:1])
		}},
	}
	for _, s := range shapes {
		t.Run(s.name, func(t *testing.T) {
			target, sc := s.target(t)
			samples := append(scrape(t, target, sc, observer), agentTarget(t, agent)...)
			// Six live instances at a 30 s fast interval may write 0.3/s: 10/s fires.
			grow := map[string]float64{"pg_liveness_statement_calls_total/heartbeat": 600}
			runRules(t, samples, grow,
				alertCheck{"PgLivenessInstancesStale", []map[string]string{without(target, []string{"instance"},
					map[string]string{"service": "api", "state": "stale", "severity": "warning"})}},
				alertCheck{"PgLivenessHeartbeatWriteRateHigh", []map[string]string{without(target, []string{"instance"},
					map[string]string{"severity": "warning"})}})
		})
	}
}

// readmeProbeJob is the plain scrape_config for /probe (job pg_liveness_probe) of
// docs/many-databases.md: its relabelling and its static targets.
func readmeProbeJob(t *testing.T) (scrapeConfig, []labels.Labels) {
	t.Helper()
	b, err := os.ReadFile("../docs/many-databases.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(b), "```yaml\n# prometheus.yml: each database a target of the job pg_liveness_probe")
	if !ok {
		t.Fatal("docs/many-databases.md has no prometheus.yml block for /probe")
	}
	block, _, _ = strings.Cut(block, "```")
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			HonorLabels   bool   `yaml:"honor_labels"`
			StaticConfigs []struct {
				Targets []string          `yaml:"targets"`
				Labels  map[string]string `yaml:"labels"`
			} `yaml:"static_configs"`
			RelabelConfigs []*relabel.Config `yaml:"relabel_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal([]byte("# prometheus.yml"+block), &cfg); err != nil {
		t.Fatalf("docs/many-databases.md's prometheus.yml: %v", err)
	}
	for _, j := range cfg.ScrapeConfigs {
		if j.JobName != "pg_liveness_probe" {
			continue
		}
		for _, r := range j.RelabelConfigs {
			if err := r.Validate(model.UTF8Validation); err != nil {
				t.Fatal(err)
			}
		}
		var metas []labels.Labels
		for _, s := range j.StaticConfigs {
			for _, addr := range s.Targets {
				m := maps.Clone(s.Labels)
				if m == nil {
					m = map[string]string{}
				}
				m["__address__"] = addr
				metas = append(metas, labels.FromMap(m))
			}
		}
		return scrapeConfig{job: j.JobName, honorLabels: j.HonorLabels, relabel: j.RelabelConfigs}, metas
	}
	t.Fatal("docs/many-databases.md's prometheus.yml has no job pg_liveness_probe")
	return scrapeConfig{}, nil
}

// scraped is one target of an install and what it serves.
type scraped struct {
	labels labels.Labels
	sc     scrapeConfig
	agent  bool // an agent's pod (it serves the agent's families); else the fleet's
}

// installTargets applies every monitor of an install to every pod of its Deployments
// and DaemonSets and every Probe to its targets, and returns the targets Prometheus
// keeps. Agents' pods (a Deployment with a pg-liveness port, or a DaemonSet of node
// agents) come two to a workload, the observer's one. A ServiceMonitor reaches the pods
// of the Services it selects. The pods' addresses start at 10.0.<net>.1. A multi-target
// exporter's own /metrics (its process metrics only) is left out.
func installTargets(t *testing.T, r *rendered, net int) []scraped {
	t.Helper()
	var out []scraped
	host := 0
	multiTarget := len(r.probes) > 0
	for _, w := range r.workloads() {
		agent := w.kind == "DaemonSet" || slices.ContainsFunc(w.template.Spec.Containers, func(c corev1.Container) bool {
			return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "pg-liveness" })
		})
		pods := []string{w.name + "-5f7c-a"}
		if agent {
			pods = append(pods, w.name+"-5f7c-b")
		}
		keep := func(sc scrapeConfig, metas []labels.Labels) {
			for _, m := range metas {
				if l, ok := targetLabels(sc, m); ok && (agent || !multiTarget) {
					out = append(out, scraped{labels: l, sc: sc, agent: agent})
				}
			}
		}
		for _, pod := range pods {
			host++
			ip := fmt.Sprintf("10.0.%d.%d", net, host)
			for _, pm := range r.podMonitors {
				for i := range pm.Spec.PodMetricsEndpoints {
					keep(podMonitorConfig(t, pm, i), podMetas(w, pod, ip))
				}
			}
			for _, sm := range r.serviceMonitors {
				for _, svc := range r.services {
					if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) || !selects(svc.Spec.Selector, w.template.Labels) {
						continue
					}
					for i := range sm.Spec.Endpoints {
						keep(serviceMonitorConfig(t, sm, i), endpointMetas(svc, w, pod, ip))
					}
				}
			}
		}
	}
	for _, p := range r.probes {
		sc, metas := probeTargets(t, p)
		for _, m := range metas {
			if l, ok := targetLabels(sc, m); ok {
				out = append(out, scraped{labels: l, sc: sc})
			}
		}
	}
	return out
}

// selects: a selector's labels are all among labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// inNamespace moves a kustomization's rendered objects to ns, as an overlay's namespace:
// does.
func inNamespace(r *rendered, ns string) *rendered {
	for _, o := range r.deployments {
		o.Namespace = ns
	}
	for _, o := range r.daemonSets {
		o.Namespace = ns
	}
	for _, o := range r.podMonitors {
		o.Namespace = ns
	}
	for _, o := range r.probes {
		o.Namespace = ns
	}
	return r
}

// PgLivenessLeaseTwoLeaders fires on a real double leader in every shipped install shape
// that has agents (two agents hold the reaper's lease under two epochs, or one leads
// under an epoch the lease row no longer has), and two deployments of a shape (staging
// and prod, each on its own database), each with its one leader of the same lease, never
// meet: every exporter of a deployment exports its database's identity.
func TestTwoLeadersInEveryShape(t *testing.T) {
	// databaseID is the identity of env's database, as pg_liveness_database_info gives it.
	databaseID := func(env string) string {
		return map[string]string{"staging": "6961000000000000002:16384", "prod": "6961000000000000001:16384"}[env]
	}
	observer, agent := scenario(t)
	example := buildExample(t)
	helm := func(t *testing.T, dir, release, ns, values string) *rendered {
		t.Helper()
		v, err := chartutil.ReadValues([]byte(values))
		if err != nil {
			t.Fatal(err)
		}
		r, err := helmTemplate(dir, release, ns, v)
		if err != nil {
			t.Fatal(err)
		}
		// helm install -n puts an object that names no namespace in the release's.
		for _, d := range r.deployments {
			d.Namespace = cmp.Or(d.Namespace, ns)
		}
		for _, d := range r.daemonSets {
			d.Namespace = cmp.Or(d.Namespace, ns)
		}
		return r.rendered
	}
	merge := func(rs ...*rendered) *rendered {
		out := &rendered{}
		for _, r := range rs {
			out.deployments = append(out.deployments, r.deployments...)
			out.daemonSets = append(out.daemonSets, r.daemonSets...)
			out.podMonitors = append(out.podMonitors, r.podMonitors...)
			out.serviceMonitors = append(out.serviceMonitors, r.serviceMonitors...)
			out.services = append(out.services, r.services...)
			out.probes = append(out.probes, r.probes...)
		}
		return out
	}
	type shape struct {
		name string
		// install renders the shape as deployment env (staging, prod) would; scope is the
		// label set the alert names it by.
		install func(t *testing.T, env string) (r *rendered, scope map[string]string)
	}
	shapes := []shape{
		{"kustomize sidecar overlay", func(t *testing.T, env string) (*rendered, map[string]string) {
			return inNamespace(render(t, "kubernetes/overlays/sidecar"), env), map[string]string{"namespace": env}
		}},
		{"helm sidecar example", func(t *testing.T, env string) (*rendered, map[string]string) {
			return helm(t, example, "checkout", env, ""), map[string]string{"namespace": env}
		}},
		{"helm multi-target, agents labelled with the target's database", func(t *testing.T, env string) (*rendered, map[string]string) {
			db := env + "-orders"
			exporter := helm(t, chartDir, "pg-liveness-exporter", env+"-monitoring",
				"multiTarget: {enabled: true, probe: {targets: ["+db+"]}}\nprometheusRule: {enabled: false}\ndashboards: {enabled: false}")
			agents := helm(t, example, "checkout", env, `pg-liveness-exporter:
  database: `+db+`
  observer: {enabled: false}
  prometheusRule: {enabled: false}
  dashboards: {enabled: false}
`)
			return merge(exporter, agents), map[string]string{"database": db}
		}},
		// The node agents are agents too (the reaper's lease among them), beside the
		// observer of their namespace.
		{"kustomize node-agent overlay", func(t *testing.T, env string) (*rendered, map[string]string) {
			return inNamespace(render(t, "kubernetes/overlays/node-agent"), env), map[string]string{"namespace": env}
		}},
		{"helm node agents, PodMonitor", func(t *testing.T, env string) (*rendered, map[string]string) {
			return helm(t, chartDir, "pg-liveness-exporter", env, "nodeAgent: {enabled: true}"), map[string]string{"namespace": env}
		}},
		{"helm node agents, ServiceMonitor", func(t *testing.T, env string) (*rendered, map[string]string) {
			return helm(t, chartDir, "pg-liveness-exporter", env, "nodeAgent: {enabled: true, podMonitor: {enabled: false}, serviceMonitor: {enabled: true}}"),
				map[string]string{"namespace": env}
		}},
	}
	// samples scrapes an install of env (its database's identity): the agents (the first
	// only, when one leads) serve the scenario's agent families (the reaper's lease, epoch
	// 7; a second leader still believes the epoch before), the fleet's targets the scenario
	// with the reaper's lease row at rowEpoch.
	samples := func(t *testing.T, env string, targets []scraped, agents, rowEpoch int) []sample {
		t.Helper()
		ofEnv := func(exposition string) string {
			return strings.NewReplacer(`database_id="SYSID:OID"`, `database_id="`+databaseID(env)+`"`, `datname="DATNAME"`, `datname="app"`).Replace(exposition)
		}
		var out []sample
		served := 0
		for _, tg := range targets {
			switch {
			case tg.agent && served < agents:
				served++
				a := agent
				if served > 1 {
					a = strings.Replace(a, `pg_liveness_agent_lease_epoch{lease="pg_liveness_reaper"} 7`, `pg_liveness_agent_lease_epoch{lease="pg_liveness_reaper"} 6`, 1)
				}
				out = append(out, scrape(t, tg.labels, tg.sc, ofEnv(a))...)
			case !tg.agent:
				out = append(out, scrape(t, tg.labels, tg.sc, ofEnv(withLeaseRow(t, observer, rowEpoch)))...)
			}
		}
		if served != agents {
			t.Fatalf("%d agent targets, want %d: %v", served, agents, targets)
		}
		return out
	}
	fires := func(env string) []map[string]string {
		return []map[string]string{{"database_id": databaseID(env), "datname": "app", "lease": "pg_liveness_reaper", "severity": "critical"}}
	}
	for _, s := range shapes {
		t.Run(s.name, func(t *testing.T) {
			t.Run("two leaders", func(t *testing.T) {
				r, _ := s.install(t, "prod")
				runRules(t, samples(t, "prod", installTargets(t, r, 1), 2, 7), nil, alertCheck{"PgLivenessLeaseTwoLeaders", fires("prod")})
			})
			t.Run("a stale leader", func(t *testing.T) {
				r, _ := s.install(t, "prod")
				runRules(t, samples(t, "prod", installTargets(t, r, 1), 1, 8), nil, alertCheck{"PgLivenessLeaseTwoLeaders", fires("prod")})
			})
			t.Run("staging and prod, one leader each", func(t *testing.T) {
				staging, _ := s.install(t, "staging")
				prod, _ := s.install(t, "prod")
				all := append(samples(t, "staging", installTargets(t, staging, 1), 1, 7), samples(t, "prod", installTargets(t, prod, 2), 1, 7)...)
				runRules(t, all, nil, alertCheck{alert: "PgLivenessLeaseTwoLeaders"})
			})
		})
	}
}
