package deploy

import (
	"bytes"
	"fmt"
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
			wantPodMonitors := wantDeployments + wantDaemonSets
			if len(r.deployments) != wantDeployments || len(r.daemonSets) != wantDaemonSets || len(r.services) != 1 || len(r.promRules) != 1 || len(r.podMonitors) != wantPodMonitors {
				t.Errorf("got %d Deployments, %d DaemonSets, %d Services, %d PodMonitors, %d PrometheusRules; want %d, %d, 1, %d, 1",
					len(r.deployments), len(r.daemonSets), len(r.services), len(r.podMonitors), len(r.promRules), wantDeployments, wantDaemonSets, wantPodMonitors)
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

	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != 9816 {
		t.Fatalf("%s: want one container port 9816, got %+v", name, c.Ports)
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
// processes on a socket in a host directory that the node's pods mount.
func TestNodeAgentDaemonSet(t *testing.T) {
	r := render(t, "kubernetes/overlays/node-agent")
	if len(r.daemonSets) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(r.daemonSets))
	}
	checkNodeAgent(t, r.daemonSets[0], defaultDSNSecret)
	checkMonitorJobs(t, r)
	if ns := r.namespaces[0]; ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace %s: labels %v; the baseline Pod Security Standard refuses a hostPath volume", ns.Name, ns.Labels)
	}
}

// nodeAgentSocket is where a node agent listens: the host's directory, shared with the
// node's pods, the socket's file name in it, and the group that may connect.
type nodeAgentSocket struct {
	hostDir, file string
	group         int64
}

// checkNodeAgent checks a node agent's DaemonSet and returns where its socket is.
func checkNodeAgent(t *testing.T, d *appsv1.DaemonSet, dsn dsnSecret) nodeAgentSocket {
	t.Helper()
	w := ofDaemonSet(d)
	c := checkExporterContainer(t, w, dsn)
	checkAgentArgs(t, w, c, "kubernetes/components/node-agent/node-agent-daemonset.yaml")
	pod := w.template.Spec

	// The socket, in a host directory that the container mounts writable.
	socket, ok := flagValue(c.Args, "node-agent.socket")
	if !ok || !filepath.IsAbs(socket) {
		t.Fatalf("%s: --node-agent.socket=%q, want an absolute path", d.Name, socket)
	}
	var out nodeAgentSocket
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) != filepath.Dir(socket) {
			continue
		}
		if m.ReadOnly {
			t.Errorf("%s: the socket's directory %s is mounted read-only", d.Name, m.MountPath)
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.HostPath == nil || v.HostPath.Type == nil ||
				!slices.Contains([]corev1.HostPathType{corev1.HostPathDirectoryOrCreate, corev1.HostPathDirectory}, *v.HostPath.Type) {
				t.Fatalf("%s: the socket's directory is not a host directory the node's pods can mount: %+v", d.Name, v.VolumeSource)
			}
			out.hostDir, out.file = v.HostPath.Path, filepath.Base(socket)
		}
	}
	if out.hostDir == "" {
		t.Fatalf("%s: the directory of %s is not a mounted volume", d.Name, socket)
	}
	// Whoever may connect may hold and let go any instance's lock: not every user.
	mode := "0660" // the flag's default
	if v, ok := flagValue(c.Args, "node-agent.socket-mode"); ok {
		mode = v
	}
	if m, err := strconv.ParseUint(mode, 8, 32); err != nil || m&0o007 != 0 || m&0o060 != 0o060 {
		t.Errorf("%s: --node-agent.socket-mode=%s: want the socket's group to connect, other users not", d.Name, mode)
	}
	// The socket's group is the process's: not root's, so that pods need no root group.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsGroup == nil || *psc.RunAsGroup == 0 {
		t.Fatalf("%s: the pod's runAsGroup (the socket's group) must be set and not 0", d.Name)
	}
	out.group = *psc.RunAsGroup
	// Two node agents on a node would contend for the socket: an update replaces them.
	if ru := d.Spec.UpdateStrategy.RollingUpdate; d.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType ||
		ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 0 || ru.MaxUnavailable == nil {
		t.Errorf("%s: updateStrategy %+v, want RollingUpdate with maxSurge 0", d.Name, d.Spec.UpdateStrategy)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("%s: the pod mounts a service-account token", d.Name)
	}
	return out
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

// The pod the deployment guide and the chart's README show reaches the node agent the manifests deploy: it mounts the
// node agent's host directory, has the socket's group, and names the socket's path in
// its container as the one its service gives to liveness.AgentConfig.NodeAgentSocket.
func TestDocsShowHowAPodAttaches(t *testing.T) {
	r := render(t, "kubernetes/overlays/node-agent")
	if len(r.daemonSets) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(r.daemonSets))
	}
	socket := checkNodeAgent(t, r.daemonSets[0], defaultDSNSecret)
	for _, readme := range []string{"../docs/deployment.md", filepath.Join(chartDir, "README.md")} {
		t.Run(readme, func(t *testing.T) {
			b, err := os.ReadFile(readme)
			if err != nil {
				t.Fatal(err)
			}
			pod := readmePodSnippet(t, string(b))
			checkAttachingPod(t, pod, socket)
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

func checkAttachingPod(t *testing.T, pod corev1.PodTemplateSpec, socket nodeAgentSocket) {
	t.Helper()
	spec := pod.Spec
	var volume string
	for _, v := range spec.Volumes {
		if v.HostPath != nil && filepath.Clean(v.HostPath.Path) == filepath.Clean(socket.hostDir) {
			volume = v.Name
		}
	}
	if volume == "" {
		t.Fatalf("no volume of the host directory %s: %+v", socket.hostDir, spec.Volumes)
	}
	attached := false
	for _, c := range spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name != volume {
				continue
			}
			path := filepath.Join(m.MountPath, socket.file)
			for _, e := range c.Env {
				attached = attached || e.Value == path
			}
			if !attached {
				t.Errorf("container %s mounts the socket's directory at %s, but no variable names %s", c.Name, m.MountPath, path)
			}
		}
	}
	if !attached {
		t.Errorf("no container mounts the volume %s and names the socket in it", volume)
	}
	sc := spec.SecurityContext
	if sc == nil || (sc.FSGroup == nil || *sc.FSGroup != socket.group) && !slices.Contains(sc.SupplementalGroups, socket.group) {
		t.Errorf("the pod's securityContext %+v lacks the socket's group %d (fsGroup or supplementalGroups)", sc, socket.group)
	}
}
