package deploy

import (
	"bytes"
	stdcmp "cmp"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/pg-liveness/pg_liveness_exporter/deploy/internal/manifests"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// The kustomizations users apply.
var kustomizations = []string{"kubernetes/base", "kubernetes/overlays/observer", "kubernetes/overlays/sidecar", "kubernetes/overlays/multi-target",
	"kubernetes/overlays/node-agent"}

// rendered is the output of one kustomization or one Helm release, every object decoded
// into its official type.
type rendered struct {
	deployments     []*appsv1.Deployment
	daemonSets      []*appsv1.DaemonSet
	services        []*corev1.Service
	serviceAccounts []*corev1.ServiceAccount
	configMaps      []*corev1.ConfigMap
	namespaces      []*corev1.Namespace
	podMonitors     []*monitoringv1.PodMonitor
	serviceMonitors []*monitoringv1.ServiceMonitor
	promRules       []*monitoringv1.PrometheusRule
	probes          []*monitoringv1.Probe
	pdbs            []*policyv1.PodDisruptionBudget
	netpols         []*networkingv1.NetworkPolicy
	objectsTotal    int
}

// officialTypes gives, by "apiVersion kind", a new object of the official type, added to
// its list in rendered.
var officialTypes = map[string]func(*rendered) any{
	"apps/v1 Deployment":                      func(r *rendered) any { return appendNew(&r.deployments) },
	"apps/v1 DaemonSet":                       func(r *rendered) any { return appendNew(&r.daemonSets) },
	"v1 Service":                              func(r *rendered) any { return appendNew(&r.services) },
	"v1 ServiceAccount":                       func(r *rendered) any { return appendNew(&r.serviceAccounts) },
	"v1 ConfigMap":                            func(r *rendered) any { return appendNew(&r.configMaps) },
	"v1 Namespace":                            func(r *rendered) any { return appendNew(&r.namespaces) },
	"monitoring.coreos.com/v1 PodMonitor":     func(r *rendered) any { return appendNew(&r.podMonitors) },
	"monitoring.coreos.com/v1 ServiceMonitor": func(r *rendered) any { return appendNew(&r.serviceMonitors) },
	"monitoring.coreos.com/v1 PrometheusRule": func(r *rendered) any { return appendNew(&r.promRules) },
	"monitoring.coreos.com/v1 Probe":          func(r *rendered) any { return appendNew(&r.probes) },
	"policy/v1 PodDisruptionBudget":           func(r *rendered) any { return appendNew(&r.pdbs) },
	"networking.k8s.io/v1 NetworkPolicy":      func(r *rendered) any { return appendNew(&r.netpols) },
}

// add decodes one object strictly into its official type: a field the type does not
// have is an error, and so is a kind this test knows no type for.
func (out *rendered) add(y []byte) error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(y, &head); err != nil {
		return err
	}
	gv := head.APIVersion + " " + head.Kind
	newObject, ok := officialTypes[gv]
	if !ok {
		return fmt.Errorf("no official type known to this test for %s", gv)
	}
	obj := newObject(out)
	if err := manifests.DecodeStrict(y, obj); err != nil {
		return fmt.Errorf("does not decode strictly into its official type: %w", err)
	}
	out.objectsTotal++
	return nil
}

// appendNew appends a new, empty object to list and returns it, to decode into.
func appendNew[T any](list *[]*T) *T {
	v := new(T)
	*list = append(*list, v)
	return v
}

// render builds the kustomization in dir with the kustomize API and decodes every object
// strictly.
func render(t *testing.T, dir string) *rendered {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out rendered
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, r.CurId(), err)
		}
		if err := out.add(y); err != nil {
			t.Fatalf("%s: %s: %v", dir, r.CurId(), err)
		}
	}
	return &out
}

func TestKustomizationsRenderStrictlyIntoOfficialTypes(t *testing.T) {
	dashboards, err := filepath.Glob("../dashboards/*.json")
	if err != nil || len(dashboards) == 0 {
		t.Fatalf("no dashboards found: %v", err)
	}
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			wantDeployments, wantDaemonSets := 1, 0
			switch {
			case strings.HasSuffix(dir, "sidecar"):
				wantDeployments = 2
			case strings.HasSuffix(dir, "node-agent"):
				wantDaemonSets = 1
			}
			wantPodMonitors, wantServices := wantDeployments+wantDaemonSets, 1+wantDaemonSets // the node agents' own
			if len(r.deployments) != wantDeployments || len(r.daemonSets) != wantDaemonSets || len(r.services) != wantServices || len(r.promRules) != 1 || len(r.podMonitors) != wantPodMonitors {
				t.Errorf("got %d Deployments, %d DaemonSets, %d Services, %d PodMonitors, %d PrometheusRules; want %d, %d, %d, %d, 1",
					len(r.deployments), len(r.daemonSets), len(r.services), len(r.podMonitors), len(r.promRules), wantDeployments, wantDaemonSets, wantServices, wantPodMonitors)
			}
			var labelled int
			for _, c := range r.configMaps {
				if c.Labels[manifests.DashboardLabel] == "1" {
					labelled++
				}
			}
			if labelled != len(dashboards) {
				t.Errorf("%d ConfigMaps labelled %s=1, want one per dashboard (%d)", labelled, manifests.DashboardLabel, len(dashboards))
			}
			if strings.Contains(dir, "overlays") {
				if len(r.namespaces) != 1 {
					t.Fatalf("overlay creates %d namespaces, want 1", len(r.namespaces))
				}
				for _, w := range r.workloads() {
					if w.namespace != r.namespaces[0].Name {
						t.Errorf("%s %s in namespace %q, want %q", w.kind, w.name, w.namespace, r.namespaces[0].Name)
					}
				}
			}
		})
	}
}

func TestGeneratedManifestsAreUpToDate(t *testing.T) {
	files, err := manifests.Generate("..")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range files {
		got, err := os.ReadFile(filepath.Join("..", path))
		if err != nil {
			t.Errorf("%s: %v; regenerate with: %s", path, err, manifests.RegenerateCommand)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from its source; regenerate with: %s", path, manifests.RegenerateCommand)
		}
	}
	for _, dir := range manifests.GeneratedDirs {
		on, err := filepath.Glob(filepath.Join("..", dir, "*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range on {
			if fi, err := os.Stat(p); err != nil || fi.IsDir() {
				continue
			}
			rel, _ := filepath.Rel("..", p)
			if _, ok := files[rel]; !ok {
				t.Errorf("%s is not generated from any source; regenerate with: %s", rel, manifests.RegenerateCommand)
			}
		}
	}
}

// serverShutdown is the deadline the binary gives the HTTP server after the agent has
// stopped (srv.Shutdown in serve.go).
const serverShutdown = 5 * time.Second

// checkQuotedBudget checks that the file quotes the agent's shutdown budget: the first
// match of re's group is a number of seconds.
func checkQuotedBudget(t *testing.T, path, re string, budget time.Duration) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(re).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s quotes no shutdown budget (%s)", path, re)
	}
	if quoted := string(m[1]) + "s"; quoted != fmt.Sprintf("%.0fs", budget.Seconds()) {
		t.Errorf("%s quotes a shutdown budget of %s; the agent's is %s with these settings", path, quoted, budget)
	}
}

const dsnFlag = "--db.dsn-file="

// workload is what the checks read of a Deployment or a DaemonSet.
type workload struct {
	kind, name, namespace string
	template              corev1.PodTemplateSpec
}

func ofDeployment(d *appsv1.Deployment) workload {
	return workload{"Deployment", d.Name, d.Namespace, d.Spec.Template}
}

func ofDaemonSet(d *appsv1.DaemonSet) workload {
	return workload{"DaemonSet", d.Name, d.Namespace, d.Spec.Template}
}

// workloads are the rendered Deployments and DaemonSets.
func (r *rendered) workloads() []workload {
	var out []workload
	for _, d := range r.deployments {
		out = append(out, ofDeployment(d))
	}
	for _, d := range r.daemonSets {
		out = append(out, ofDaemonSet(d))
	}
	return out
}

func exporterContainer(t *testing.T, w workload) *corev1.Container {
	t.Helper()
	for i, c := range w.template.Spec.Containers {
		if c.Name == "pg-liveness-exporter" {
			return &w.template.Spec.Containers[i]
		}
	}
	t.Fatalf("%s %s has no pg-liveness-exporter container", w.kind, w.name)
	return nil
}

func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// dsnSecret names the Secret and key that hold the DSN.
type dsnSecret struct{ name, key string }

// The Secret the kustomize base and the chart's defaults read.
var defaultDSNSecret = dsnSecret{"pg-liveness-exporter-dsn", "dsn"}

// checkExporterContainer asserts what every exporter container must do: the DSN from a
// Secret mounted as a file, never in the environment or the arguments; read-only root
// file system, no privilege escalation, no capabilities; requests and limits; probes on
// the landing page. Who it runs as is checkNonRoot's, or the node agent's own check.
func checkExporterContainer(t *testing.T, w workload, dsn dsnSecret) *corev1.Container {
	t.Helper()
	c := exporterContainer(t, w)
	pod := w.template.Spec
	name := w.name

	for _, e := range c.Env {
		if e.Name == "DATA_SOURCE_NAME" || strings.Contains(strings.ToLower(e.Value), "password") {
			t.Errorf("%s: environment variable %s carries a DSN; use %s with a Secret", name, e.Name, dsnFlag)
		}
	}
	if len(c.EnvFrom) > 0 {
		t.Errorf("%s: envFrom can put a DSN in the environment", name)
	}
	for _, a := range slices.Concat(c.Command, c.Args) {
		if strings.HasPrefix(a, "--db.dsn=") || strings.HasPrefix(a, "--db.direct-dsn=") {
			t.Errorf("%s: %q puts a DSN in the process list", name, a)
		}
	}
	dsnFile, ok := flagValue(c.Args, "db.dsn-file")
	if !ok {
		t.Fatalf("%s: no %s argument", name, dsnFlag)
	}
	var secret *corev1.SecretVolumeSource
	for _, m := range c.VolumeMounts {
		if filepath.Dir(dsnFile) != filepath.Clean(m.MountPath) {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%s: the DSN mount %s is writable", name, m.MountPath)
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				secret = v.Secret
			}
		}
	}
	if secret == nil {
		t.Fatalf("%s: %s is not on a mounted Secret volume", name, dsnFile)
	}
	if secret.SecretName != dsn.name || len(secret.Items) != 1 || secret.Items[0].Key != dsn.key || secret.Items[0].Path != filepath.Base(dsnFile) {
		t.Errorf("%s: the Secret volume does not put key %s of %s at %s: %+v", name, dsn.key, dsn.name, dsnFile, secret)
	}
	if secret.DefaultMode == nil || *secret.DefaultMode&0o007 != 0 {
		t.Errorf("%s: the DSN file must not be world-readable (defaultMode %s)", name, fmtMode(secret.DefaultMode))
	}
	if psc := pod.SecurityContext; psc == nil || psc.FSGroup == nil || psc.RunAsUser == nil {
		t.Errorf("%s: the pod needs a runAsUser and an fsGroup to read the DSN file", name)
	}

	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatalf("%s: no securityContext", name)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: readOnlyRootFilesystem is not true", name)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: allowPrivilegeEscalation is not false", name)
	case sc.Privileged != nil && *sc.Privileged:
		t.Errorf("%s: privileged", name)
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("%s: capabilities must drop ALL and add none: %+v", name, sc.Capabilities)
	}

	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, lim := c.Resources.Requests[res], c.Resources.Limits[res]
		if req.IsZero() || lim.IsZero() || lim.Cmp(req) < 0 {
			t.Errorf("%s: %s request %s and limit %s: both must be set, limit ≥ request", name, res, req.String(), lim.String())
		}
	}
	if mem := c.Resources.Requests[corev1.ResourceMemory]; mem.Value() < 32<<20 {
		t.Errorf("%s: memory request %s is below the 29 MiB peak measured in docs/performance.md", name, mem.String())
	}

	if len(c.Ports) == 0 || c.Ports[0].ContainerPort != 9816 {
		t.Fatalf("%s: want container port 9816 first, got %+v", name, c.Ports)
	}
	for _, p := range c.Ports {
		if p.HostPort != 0 {
			t.Errorf("%s: port %s is a host port", name, p.Name)
		}
		if p.ContainerPort != 9816 && (w.kind != "DaemonSet" || p.Name != "attach") {
			t.Errorf("%s: port %+v: only the node agent has another, attach", name, p)
		}
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Errorf("%s: the pod shares the host's namespaces", name)
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			t.Errorf("%s: volume %s is a host path", name, v.Name)
		}
	}
	// The landing page, which answers without the database; or, where basic auth makes it
	// answer 401, the port.
	for probe, p := range map[string]*corev1.Probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe} {
		landing := p != nil && p.HTTPGet != nil && p.HTTPGet.Path == "/" && p.HTTPGet.Port.String() == c.Ports[0].Name
		port := p != nil && p.TCPSocket != nil && p.TCPSocket.Port.String() == c.Ports[0].Name
		if !landing && !port {
			t.Errorf("%s: %s must GET the landing page / on port %s, or check that port: %+v", name, probe, c.Ports[0].Name, p)
		}
	}
	return c
}

// checkNonRoot: the observer and the sidecar run as a user other than root, and say so.
func checkNonRoot(t *testing.T, w workload, c *corev1.Container) {
	t.Helper()
	if psc := w.template.Spec.SecurityContext; psc == nil || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("%s: the pod needs a non-root runAsUser", w.name)
	}
	if sc := c.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("%s: runAsNonRoot is not true", w.name)
	}
}

func deployment(t *testing.T, r *rendered, name string) *appsv1.Deployment {
	t.Helper()
	for _, d := range r.deployments {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no Deployment %s", name)
	return nil
}

func TestObserverDeployment(t *testing.T) {
	checkObserver(t, deployment(t, render(t, "kubernetes/overlays/observer"), "pg-liveness-exporter"), defaultDSNSecret)
}

// The multi-target exporter has no DSN of its own: it runs with --config.file from its
// Secret, and its Probe scrapes /probe on its Service with the database label the alerts
// and dashboards group by.
func TestMultiTargetOverlay(t *testing.T) {
	r := render(t, "kubernetes/overlays/multi-target")
	d := deployment(t, r, "pg-liveness-exporter")
	c := d.Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--no-agent") || !slices.Contains(c.Args, "--config.file=/etc/pg-liveness-exporter/targets.yml") {
		t.Errorf("args %q, want --no-agent and --config.file", c.Args)
	}
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--db.dsn") {
			t.Errorf("the multi-target exporter has a DSN of its own: %s", a)
		}
	}
	vols := d.Spec.Template.Spec.Volumes
	if len(vols) != 1 || vols[0].Secret == nil || vols[0].Secret.SecretName != "pg-liveness-exporter-targets" {
		t.Errorf("volumes %+v, want the one Secret pg-liveness-exporter-targets", vols)
	}
	if len(r.probes) != 1 {
		t.Fatalf("%d Probes, want 1", len(r.probes))
	}
	p := r.probes[0].Spec
	svc := r.services[0]
	if want := fmt.Sprintf("%s.%s.svc:%d", svc.Name, svc.Namespace, svc.Spec.Ports[0].Port); p.ProberSpec.URL != want || p.ProberSpec.Path != "/probe" {
		t.Errorf("prober %s%s, want %s/probe", p.ProberSpec.URL, p.ProberSpec.Path, want)
	}
	if !strings.HasPrefix(p.JobName, "pg_liveness") {
		t.Errorf("job %q: the alert rules select up{job=~\"pg_liveness.*\"}", p.JobName)
	}
	relabelled := false
	for _, rc := range p.Targets.StaticConfig.RelabelConfigs {
		relabelled = relabelled || len(rc.SourceLabels) == 1 && rc.SourceLabels[0] == "__param_target" && rc.TargetLabel == "database"
	}
	if !relabelled || len(p.Targets.StaticConfig.Targets) == 0 {
		t.Errorf("static targets %+v: want targets, relabelled __param_target to database", p.Targets.StaticConfig)
	}
}

func checkObserver(t *testing.T, d *appsv1.Deployment, dsn dsnSecret) {
	t.Helper()
	c := checkExporterContainer(t, ofDeployment(d), dsn)
	checkNonRoot(t, ofDeployment(d), c)
	if !slices.Contains(c.Args, "--no-agent") {
		t.Errorf("the observer must run with --no-agent: %q", c.Args)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("one observer per database, got replicas %v", d.Spec.Replicas)
	}
}

// The sidecar's SIGTERM clean-up (leases released, row deleted, lock session closed, then
// the HTTP server) always finishes before Kubernetes sends SIGKILL.
func TestSidecarAgent(t *testing.T) {
	checkAgent(t, deployment(t, render(t, "kubernetes/overlays/sidecar"), "checkout"), defaultDSNSecret)
}

func checkAgent(t *testing.T, d *appsv1.Deployment, dsn dsnSecret) {
	t.Helper()
	w := ofDeployment(d)
	c := checkExporterContainer(t, w, dsn)
	checkNonRoot(t, w, c)
	checkAgentArgs(t, w, c, "kubernetes/overlays/sidecar/checkout-deployment.yaml")
	// The service name from the pod, through the downward API.
	v, _ := flagValue(c.Args, "agent.service-name")
	if env := envFromField(c)["metadata.labels['app.kubernetes.io/name']"]; env == "" || v != fmt.Sprintf("$(%s)", env) {
		t.Errorf("--agent.service-name=%q, want it from the pod's app.kubernetes.io/name label through the downward API", v)
	}
}

// envFromField maps the downward API's field paths to the container's variables.
func envFromField(c *corev1.Container) map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			out[e.ValueFrom.FieldRef.FieldPath] = e.Name
		}
	}
	return out
}

// checkAgentArgs checks what an exporter running as an agent (the sidecar, the node
// agent) needs: its SIGTERM clean-up ends before Kubernetes' SIGKILL, and manifest (the
// kustomize file of the workload) quotes the agent's budget; the pod's UID is the
// instance id; the fleet-wide collectors are off (the observer exports those once).
func checkAgentArgs(t *testing.T, w workload, c *corev1.Container, manifest string) {
	t.Helper()
	if slices.Contains(c.Args, "--no-agent") {
		t.Fatalf("%s must run as an agent", w.name)
	}

	// The agent's configuration as its arguments set it, on the binary's defaults: its
	// flags default to the library's, and the job wind-down and the row's shutdown
	// timeout have no flag, so zero values stand for them here too.
	cfg := liveness.AgentConfig{Reaper: !slices.Contains(c.Args, "--no-agent.reaper")}
	if v, ok := flagValue(c.Args, "agent.heartbeat-interval"); ok {
		var err error
		if cfg.Timing.HeartbeatInterval, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	budget := cfg.ShutdownBudget() + serverShutdown
	grace := w.template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= budget {
		t.Errorf("%s: terminationGracePeriodSeconds %s must exceed the shutdown budget %s (agent %s + HTTP server %s)",
			w.name, fmtSeconds(grace), budget, cfg.ShutdownBudget(), serverShutdown)
	}
	// The manifest's comment quotes the agent's budget; it must be the one computed.
	checkQuotedBudget(t, manifest, `takes at most (\d+) s`, cfg.ShutdownBudget())

	// The instance id from the pod, through the downward API.
	v, _ := flagValue(c.Args, "agent.instance-id")
	if env := envFromField(c)["metadata.uid"]; env == "" || v != fmt.Sprintf("$(%s)", env) {
		t.Errorf("%s: --agent.instance-id=%q, want the pod's UID through the downward API", w.name, v)
	}
	for _, coll := range []string{"instances", "leases", "advisory_locks", "statements"} {
		if !slices.Contains(c.Args, "--no-collector."+coll) {
			t.Errorf("%s must not export the fleet (add --no-collector.%s)", w.name, coll)
		}
	}
}

// The node agents: one per node, the exporter holding the alive locks of the node's
// processes, which reach it over TCP through a node-local Service, with a token, all under
// the restricted Pod Security Standard.
func TestNodeAgentDaemonSet(t *testing.T) {
	r := render(t, "kubernetes/overlays/node-agent")
	if len(r.daemonSets) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(r.daemonSets))
	}
	checkNodeAgent(t, r.daemonSets[0], defaultDSNSecret)
	nodeAgentService(t, r)
	checkMonitorJobs(t, r)
	if ns := r.namespaces[0]; ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("namespace %s: labels %v; want the restricted Pod Security Standard enforced", ns.Name, ns.Labels)
	}
}

// nodeAgentEndpoint is where a node's processes attach to its node agent: the Service's
// address (tcp://name.namespace.svc:port) and the Secret and key of the token.
type nodeAgentEndpoint struct {
	address          string
	tokenSecret, key string
}

// checkNodeAgent checks a node agent's DaemonSet: the exporter as an agent, on TCP with
// a token from a Secret and its claims in an emptyDir, a user other than root; it returns
// the container's attach port and the token's Secret and key.
func checkNodeAgent(t *testing.T, d *appsv1.DaemonSet, dsn dsnSecret) (port int32, tokenSecret, tokenKey string) {
	t.Helper()
	w := ofDaemonSet(d)
	c := checkExporterContainer(t, w, dsn)
	checkNonRoot(t, w, c)
	checkAgentArgs(t, w, c, "kubernetes/components/node-agent/node-agent-daemonset.yaml")
	pod := w.template.Spec

	if v, ok := flagValue(c.Args, "node-agent.socket"); ok {
		t.Errorf("%s: --node-agent.socket=%s: in Kubernetes processes attach over TCP, not through a host path", d.Name, v)
	}
	listen, ok := flagValue(c.Args, "node-agent.listen-address")
	_, p, err := net.SplitHostPort(listen)
	if !ok || err != nil {
		t.Fatalf("%s: --node-agent.listen-address=%q, want :PORT", d.Name, listen)
	}
	for _, cp := range c.Ports {
		if cp.Name == "attach" && strconv.Itoa(int(cp.ContainerPort)) == p {
			port = cp.ContainerPort
		}
	}
	if port == 0 {
		t.Fatalf("%s: no container port named attach is --node-agent.listen-address's %s: %+v", d.Name, p, c.Ports)
	}
	// volumeOf is the volume mounted at the directory of the file the flag names.
	volumeOf := func(flag string) (corev1.Volume, corev1.VolumeMount, string) {
		t.Helper()
		file, ok := flagValue(c.Args, flag)
		if !ok {
			t.Fatalf("%s: no --%s", d.Name, flag)
		}
		for _, m := range c.VolumeMounts {
			if filepath.Clean(m.MountPath) != filepath.Dir(file) {
				continue
			}
			for _, v := range pod.Volumes {
				if v.Name == m.Name {
					return v, m, filepath.Base(file)
				}
			}
		}
		t.Fatalf("%s: --%s=%s is on no mounted volume", d.Name, flag, file)
		return corev1.Volume{}, corev1.VolumeMount{}, ""
	}
	tv, tm, file := volumeOf("node-agent.token-file")
	if s := tv.Secret; s == nil || len(s.Items) != 1 || s.Items[0].Path != file || !tm.ReadOnly {
		t.Fatalf("%s: the token is not one key of a Secret, mounted read-only: %+v", d.Name, tv.VolumeSource)
	}
	if m := tv.Secret.DefaultMode; m == nil || *m&0o007 != 0 {
		t.Errorf("%s: the token file must not be world-readable (defaultMode %s)", d.Name, fmtMode(m))
	}
	if cv, cm, _ := volumeOf("node-agent.claims-file"); cv.EmptyDir == nil || cm.ReadOnly {
		t.Errorf("%s: the claims are not in a writable emptyDir: %+v", d.Name, cv.VolumeSource)
	}
	// Two node agents on a node would split its processes: an update replaces them.
	if ru := d.Spec.UpdateStrategy.RollingUpdate; d.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType ||
		ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 0 || ru.MaxUnavailable == nil {
		t.Errorf("%s: updateStrategy %+v, want RollingUpdate with maxSurge 0", d.Name, d.Spec.UpdateStrategy)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("%s: the pod mounts a service-account token", d.Name)
	}
	return port, tv.Secret.SecretName, tv.Secret.Items[0].Key
}

// nodeAgentService checks the node agents' Service of r: node-local
// (internalTrafficPolicy: Local), selecting the DaemonSet's pods, its attach port the
// pods'; it returns where a process attaches, with the token's Secret and key.
func nodeAgentService(t *testing.T, r *rendered) nodeAgentEndpoint {
	t.Helper()
	if len(r.daemonSets) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(r.daemonSets))
	}
	ds := r.daemonSets[0]
	port, secret, key := checkNodeAgent(t, ds, defaultDSNSecret)
	svc := byComponent(t, r.services, "node-agent")
	if p := svc.Spec.InternalTrafficPolicy; p == nil || *p != corev1.ServiceInternalTrafficPolicyLocal {
		t.Errorf("Service %s: internalTrafficPolicy %v; want Local, so that a process reaches its own node's agent", svc.Name, p)
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Errorf("Service %s is headless: its name would resolve to every node's agent, not through kube-proxy to the local one", svc.Name)
	}
	for k, v := range svc.Spec.Selector {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("Service %s selects %s=%s, which the node agents' pods lack (%v)", svc.Name, k, v, ds.Spec.Template.Labels)
		}
	}
	var addr string
	for _, sp := range svc.Spec.Ports {
		if sp.Name == "attach" && sp.TargetPort.String() == "attach" {
			addr = fmt.Sprintf("tcp://%s.%s.svc:%d", svc.Name, stdcmp.Or(svc.Namespace, "pg-liveness"), sp.Port)
		}
	}
	if addr == "" || port == 0 {
		t.Fatalf("Service %s has no port attach targeting the pods' attach port: %+v", svc.Name, svc.Spec.Ports)
	}
	return nodeAgentEndpoint{address: addr, tokenSecret: secret, key: key}
}

// Each PodMonitor names its job so that PgLivenessExporterDown's selector finds it.
func TestPodMonitorsMatchTheAlertRulesJob(t *testing.T) {
	checkMonitorJobs(t, render(t, "kubernetes/overlays/sidecar"))
}

// checkMonitorJobs checks every PodMonitor's and ServiceMonitor's job against the alert
// rules of the same rendering.
func checkMonitorJobs(t *testing.T, r *rendered) {
	t.Helper()
	if len(r.promRules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(r.promRules))
	}
	var selector string
	for _, g := range r.promRules[0].Spec.Groups {
		for _, rule := range g.Rules {
			if rule.Alert == "PgLivenessExporterDown" {
				if m := regexp.MustCompile(`job=~"([^"]+)"`).FindStringSubmatch(rule.Expr.String()); m != nil {
					selector = m[1]
				}
			}
		}
	}
	if selector == "" {
		t.Fatal("PgLivenessExporterDown has no job=~ selector")
	}
	re := regexp.MustCompile("^(?:" + selector + ")$")
	jobOf := func(relabelings []monitoringv1.RelabelConfig) string {
		var job string
		for _, rl := range relabelings {
			if rl.TargetLabel == "job" && rl.Replacement != nil {
				job = *rl.Replacement
			}
		}
		return job
	}
	var monitors int
	for _, pm := range r.podMonitors {
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			monitors++
			if job := jobOf(ep.RelabelConfigs); !re.MatchString(job) {
				t.Errorf("PodMonitor %s sets job %q, which up{job=~%q} does not select", pm.Name, job, selector)
			}
		}
	}
	for _, sm := range r.serviceMonitors {
		for _, ep := range sm.Spec.Endpoints {
			monitors++
			if job := jobOf(ep.RelabelConfigs); !re.MatchString(job) {
				t.Errorf("ServiceMonitor %s sets job %q, which up{job=~%q} does not select", sm.Name, job, selector)
			}
		}
	}
	if monitors == 0 {
		t.Error("no PodMonitor or ServiceMonitor endpoint to check")
	}
}

func fmtSeconds(s *int64) string {
	if s == nil {
		return "unset (30s)"
	}
	return fmt.Sprintf("%ds", *s)
}

func fmtMode(m *int32) string {
	if m == nil {
		return "unset (0644)"
	}
	return fmt.Sprintf("%#o", *m)
}

// podSnippetMarker starts docs/deployment.md's and the chart README's example of a pod
// that attaches to its node's agent.
const podSnippetMarker = "# A pod of your service that attaches to its node's agent:"

// The pod the deployment guide and the chart's README show reaches the node agents the
// kustomize overlay and the chart (with its defaults) deploy: it names their Service's
// address and mounts their token's Secret, naming the token's file, in the container
// that gives both to liveness.AgentConfig.
func TestDocsShowHowAPodAttaches(t *testing.T) {
	kust := nodeAgentService(t, render(t, "kubernetes/overlays/node-agent"))
	c := chartCase{name: "node agent", values: `nodeAgent: {enabled: true}`}
	h, err := c.render(t, buildExample(t), c.chartValues(t))
	if err != nil {
		t.Fatal(err)
	}
	chart := nodeAgentService(t, h.rendered)
	if kust != chart {
		t.Errorf("kustomize's node agents are at %+v, the chart's (its defaults) at %+v: one example pod cannot serve both", kust, chart)
	}
	for _, readme := range []string{"../docs/deployment.md", filepath.Join(chartDir, "README.md")} {
		t.Run(readme, func(t *testing.T) {
			b, err := os.ReadFile(readme)
			if err != nil {
				t.Fatal(err)
			}
			checkAttachingPod(t, readmePodSnippet(t, string(b)), kust)
		})
	}
}

// readmePodSnippet decodes the YAML block that starts with podSnippetMarker strictly into
// a pod template.
func readmePodSnippet(t *testing.T, md string) corev1.PodTemplateSpec {
	t.Helper()
	i := strings.Index(md, podSnippetMarker)
	if i < 0 {
		t.Fatalf("no YAML block starts with %q", podSnippetMarker)
	}
	lineStart := strings.LastIndex(md[:i], "\n") + 1
	indent := md[lineStart:i]
	block, _, ok := strings.Cut(md[lineStart:], "```")
	if !ok || strings.TrimSpace(indent) != "" {
		t.Fatalf("the block of %q does not end", podSnippetMarker)
	}
	var y strings.Builder
	for line := range strings.Lines(block) {
		y.WriteString(strings.TrimPrefix(line, indent))
	}
	var pod corev1.PodTemplateSpec
	if err := manifests.DecodeStrict([]byte(y.String()), &pod); err != nil {
		t.Fatalf("the example pod does not decode strictly into a pod template: %v\n%s", err, y.String())
	}
	return pod
}

// checkAttachingPod checks that a container of pod names the node agents' address in a
// variable, mounts the token's Secret read-only, and names the token's file in another.
func checkAttachingPod(t *testing.T, pod corev1.PodTemplateSpec, at nodeAgentEndpoint) {
	t.Helper()
	spec := pod.Spec
	var volume string
	for _, v := range spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == at.tokenSecret {
			volume = v.Name
			if m := v.Secret.DefaultMode; m == nil || *m&0o007 != 0 {
				t.Errorf("the token's volume %s is world-readable (defaultMode %s)", v.Name, fmtMode(m))
			}
			for _, it := range v.Secret.Items {
				if it.Key != at.key {
					t.Errorf("the token's volume %s maps key %s, not the token's %s", v.Name, it.Key, at.key)
				}
			}
		}
	}
	if volume == "" {
		t.Fatalf("no volume of the token's Secret %s: %+v", at.tokenSecret, spec.Volumes)
	}
	attached := false
	for _, c := range spec.Containers {
		values := map[string]bool{}
		for _, e := range c.Env {
			values[e.Value] = true
		}
		for _, m := range c.VolumeMounts {
			if m.Name != volume {
				continue
			}
			if !m.ReadOnly {
				t.Errorf("container %s mounts the token writable", c.Name)
			}
			if !values[at.address] || !values[filepath.Join(m.MountPath, at.key)] {
				t.Errorf("container %s mounts the token at %s, but its variables do not name both %s and %s: %+v", c.Name,
					m.MountPath, at.address, filepath.Join(m.MountPath, at.key), c.Env)
				continue
			}
			attached = true
		}
	}
	if !attached {
		t.Errorf("no container mounts the token and names the node agents' address %s", at.address)
	}
}

// docs/deployment.md deploys the node agent under restricted step by step, and each step
// is what the tested files do: the namespace it applies is the overlay's, enforcing
// restricted; the Secrets it creates are the ones the node agents read, the token's in
// the node agents' namespace and in the attaching pods'; the overlay and the Helm
// release it installs put the node agents at the address the example pod names.
func TestDocsDeployTheNodeAgentUnderRestricted(t *testing.T) {
	b, err := os.ReadFile("../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Node agent\n")
	if !ok {
		t.Fatal("docs/deployment.md has no ## Node agent section")
	}
	section, _, _ = strings.Cut(section, "\n- **systemd**")
	var commands []string
	for line := range strings.Lines(section) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "kubectl ") || strings.HasPrefix(line, "helm ") {
			commands = append(commands, line)
		}
	}
	find := func(re string) [][]string {
		t.Helper()
		var out [][]string
		for _, c := range commands {
			if m := regexp.MustCompile(re).FindStringSubmatch(c); m != nil {
				out = append(out, m)
			}
		}
		if len(out) == 0 {
			t.Fatalf("the node agent's steps have no command like %s: %q", re, commands)
		}
		return out
	}

	overlay := find(`^kubectl apply -k deploy/(kubernetes/overlays/\S+)$`)[0][1]
	if !slices.Contains(kustomizations, overlay) {
		t.Fatalf("the steps apply %s, which no test renders", overlay)
	}
	r := render(t, overlay)
	at := nodeAgentService(t, r)
	ns := r.namespaces[0]
	nsFile := find(`^kubectl apply -f deploy/(\S+)$`)[0][1]
	if filepath.Dir(nsFile) != overlay {
		t.Errorf("the steps apply %s, not the namespace of %s", nsFile, overlay)
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("the namespace %s does not enforce restricted: %v", ns.Name, ns.Labels)
	}
	secrets := map[string]bool{} // namespace/name/key
	for _, m := range find(`^kubectl -n (\S+) create secret generic (\S+) --from-file=([^=]+)=`) {
		secrets[m[1]+"/"+m[2]+"/"+m[3]] = true
	}
	for _, want := range []string{ns.Name + "/" + defaultDSNSecret.name + "/" + defaultDSNSecret.key,
		ns.Name + "/" + at.tokenSecret + "/" + at.key} {
		if !secrets[want] {
			t.Errorf("the steps create no Secret %s (namespace/name/key): %v", want, secrets)
		}
	}
	labelled := find(`^kubectl label namespace (\S+) pod-security\.kubernetes\.io/enforce=restricted$`)[0][1]
	if !secrets[labelled+"/"+at.tokenSecret+"/"+at.key] {
		t.Errorf("the steps label %s for the attaching pods but create no token's Secret there: %v", labelled, secrets)
	}
	install := find(`^helm install (\S+) deploy/(\S+) -n (\S+) --set nodeAgent\.enabled=true$`)[0]
	if install[2] != chartDir {
		t.Fatalf("the steps install %s, not the chart %s", install[2], chartDir)
	}
	h, err := helmTemplate(chartDir, install[1], install[3], map[string]any{"nodeAgent": map[string]any{"enabled": true}})
	if err != nil {
		t.Fatal(err)
	}
	if chart := nodeAgentService(t, h.rendered); chart != at {
		t.Errorf("the steps' Helm release puts the node agents at %+v, the overlay at %+v", chart, at)
	}
	b, err = os.ReadFile("../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	checkAttachingPod(t, readmePodSnippet(t, string(b)), at)
}
