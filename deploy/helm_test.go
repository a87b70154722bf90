package deploy

import (
	"bytes"
	stdcmp "cmp"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/downloader"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kyaml "sigs.k8s.io/yaml"
)

// The chart, and the example chart of the sidecar shape that depends on it.
const (
	chartDir   = "helm/pg-liveness-exporter"
	exampleDir = "examples/checkout"
	// The example's values for the chart sit under the dependency's name.
	dependencyKey = "pg-liveness-exporter"
)

// buildExample copies the charts (helm/ and examples/) into a temporary directory and
// builds the example's dependency there as `helm dependency build` does (a file://
// repository, so offline), leaving the worktree as it is. It returns the example chart's
// directory.
func buildExample(t *testing.T) string {
	t.Helper()
	tmp := copyCharts(t)
	example := filepath.Join(tmp, exampleDir)
	buildDependencies(t, tmp, example)
	return example
}

// copyCharts copies helm/ and examples/ into a new temporary directory, leaving out
// what a dependency build leaves behind (git-ignored), and returns the directory.
func copyCharts(t *testing.T) string {
	t.Helper()
	tmp := t.TempDir()
	for _, root := range []string{"helm", "examples"} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Name() == "charts" && d.IsDir() || d.Name() == "Chart.lock" {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			dst := filepath.Join(tmp, p)
			if d.IsDir() {
				return os.MkdirAll(dst, 0o755)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(dst, b, 0o644)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return tmp
}

// buildDependencies runs `helm dependency build` on the chart in dir, offline.
func buildDependencies(t *testing.T, tmp, dir string) {
	t.Helper()
	var out bytes.Buffer
	m := &downloader.Manager{
		Out:              &out,
		ChartPath:        dir,
		Getters:          getter.All(cli.New()),
		RepositoryConfig: filepath.Join(tmp, "repositories.yaml"),
		RepositoryCache:  filepath.Join(tmp, "cache"),
		SkipUpdate:       true,
	}
	if err := m.Build(); err != nil {
		t.Fatalf("helm dependency build %s: %v\n%s", dir, err, out.String())
	}
}

// helmRelease is one rendering of a chart, as `helm install --dry-run` (and `helm
// template`) makes it with Helm's own library.
type helmRelease struct {
	*rendered
	manifest string
	notes    string
}

// helmInstall renders the chart in dir with the given values, as `helm install
// --dry-run` does; it returns the manifest and the notes.
func helmInstall(dir, release, namespace string, values map[string]any) (manifest, notes string, err error) {
	// Loaded afresh each time: an install processes the chart's dependencies in place.
	ch, err := loader.Load(dir)
	if err != nil {
		return "", "", err
	}
	inst := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	inst.DryRun, inst.ClientOnly, inst.Replace = true, true, true
	inst.ReleaseName, inst.Namespace = release, namespace
	rel, err := inst.Run(ch, deepCopy(values))
	if err != nil {
		return "", "", err
	}
	return rel.Manifest, rel.Info.Notes, nil
}

// helmTemplate renders the chart in dir with the given values; the objects are decoded
// strictly into their official types.
func helmTemplate(dir, release, namespace string, values map[string]any) (*helmRelease, error) {
	manifest, notes, err := helmInstall(dir, release, namespace, values)
	if err != nil {
		return nil, err
	}
	out := &helmRelease{rendered: &rendered{}, manifest: manifest, notes: notes}
	docs := releaseutil.SplitManifests(manifest)
	for _, k := range slices.Sorted(maps.Keys(docs)) {
		if err := out.add([]byte(docs[k])); err != nil {
			return nil, fmt.Errorf("%v\n%s", err, docs[k])
		}
	}
	return out, nil
}

func deepCopy(v map[string]any) map[string]any {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

// chartCase is one row of the values matrix.
type chartCase struct {
	name string
	// sidecar renders the example chart, with values under dependencyKey and parent as
	// its own values; otherwise the chart alone.
	sidecar bool
	values  string // the chart's values, YAML
	parent  string // the example chart's own values, YAML
	check   func(t *testing.T, r *helmRelease)
}

func (c chartCase) release() (name, namespace string) {
	if c.sidecar {
		return "checkout", "checkout"
	}
	return "pg-liveness-exporter", "pg-liveness"
}

// chartValues is the case's values for the chart.
func (c chartCase) chartValues(t *testing.T) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(c.values))
	if err != nil {
		t.Fatalf("%s: values: %v", c.name, err)
	}
	return v
}

// render renders the case, with the chart's values replaced by values.
func (c chartCase) render(t *testing.T, example string, values map[string]any) (*helmRelease, error) {
	t.Helper()
	dir, release, namespace, all := c.install(t, example, values)
	return helmTemplate(dir, release, namespace, all)
}

// outcome is what the case renders with the chart's values replaced by values: the
// manifest and notes, or the error.
func (c chartCase) outcome(t *testing.T, example string, values map[string]any) string {
	t.Helper()
	manifest, notes, err := helmInstall(c.install(t, example, values))
	if err != nil {
		return "error: " + err.Error()
	}
	return manifest + "\n---NOTES---\n" + notes
}

// install returns the chart to render and its values: the chart's own, or for the
// sidecar shape the example's, with the chart's under dependencyKey.
func (c chartCase) install(t *testing.T, example string, values map[string]any) (dir, release, namespace string, all map[string]any) {
	t.Helper()
	release, namespace = c.release()
	if !c.sidecar {
		return chartDir, release, namespace, values
	}
	parent, err := chartutil.ReadValues([]byte(c.parent))
	if err != nil {
		t.Fatalf("%s: parent values: %v", c.name, err)
	}
	parent[dependencyKey] = values
	return example, release, namespace, parent
}

// component is what an object is part of: its component label, or its name label when it
// has none.
func component(l map[string]string) string {
	return stdcmp.Or(l["app.kubernetes.io/component"], l["app.kubernetes.io/name"])
}

// counterpart returns the chart's object of the same component as kustomize's o.
func counterpart[T metaObject](t *testing.T, chart []T, o T) (T, bool) {
	t.Helper()
	i := slices.IndexFunc(chart, func(c T) bool { return component(c.GetLabels()) == component(o.GetLabels()) })
	if i < 0 {
		t.Errorf("the chart has no %T like kustomize's %s", o, o.GetName())
		return o, false
	}
	return chart[i], true
}

func byComponent[T interface{ GetLabels() map[string]string }](t *testing.T, objs []T, component string) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if o.GetLabels()["app.kubernetes.io/component"] == component {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %T objects of component %s, want 1", len(found), *new(T), component)
	}
	return found[0]
}

func wantCounts(t *testing.T, r *helmRelease, deployments, services, podMonitors, serviceMonitors, rules, dashboards, serviceAccounts, daemonSets int) {
	t.Helper()
	got := []int{len(r.deployments), len(r.services), len(r.podMonitors), len(r.serviceMonitors), len(r.promRules), len(r.configMaps), len(r.serviceAccounts), len(r.daemonSets)}
	want := []int{deployments, services, podMonitors, serviceMonitors, rules, dashboards, serviceAccounts, daemonSets}
	if !slices.Equal(got, want) {
		t.Fatalf("rendered %v Deployments, Services, PodMonitors, ServiceMonitors, PrometheusRules, ConfigMaps, ServiceAccounts, DaemonSets; want %v", got, want)
	}
}

func wantEqual[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if d := cmp.Diff(yamlOf(t, want), yamlOf(t, got)); d != "" {
		t.Errorf("%s (-want +got):\n%s", what, d)
	}
}

func yamlOf(t *testing.T, v any) string {
	t.Helper()
	b, err := kyaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func containerNamed(t *testing.T, pod corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range pod.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

// The number of dashboards in dashboards/, each rendered as a ConfigMap.
func dashboardCount(t *testing.T) int {
	t.Helper()
	return len(dashboardFiles(t))
}

func chartCases(t *testing.T) []chartCase {
	dashboards := dashboardCount(t)
	kustObserver := func() *rendered { return render(t, "kubernetes/overlays/observer") }
	kustSidecar := func() *rendered { return render(t, "kubernetes/overlays/sidecar") }
	return []chartCase{{
		name: "observer shape, defaults",
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 1, 1, 1, 0, 1, dashboards, 0, 0)
			checkObserver(t, r.deployments[0], defaultDSNSecret)
			checkMonitorJobs(t, r.rendered)
			sameAsKustomize(t, kustObserver(), r.rendered)
			if !strings.Contains(r.notes, "create secret generic pg-liveness-exporter-dsn --from-file=dsn=./dsn") {
				t.Errorf("NOTES do not say how to create the DSN Secret:\n%s", r.notes)
			}
		},
	}, {
		name:    "sidecar shape, the example chart",
		sidecar: true,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 2, 1, 2, 0, 1, dashboards, 0, 0)
			checkAgent(t, deployment(t, r.rendered, "checkout"), defaultDSNSecret)
			checkObserver(t, byComponent(t, r.deployments, "observer"), defaultDSNSecret)
			checkMonitorJobs(t, r.rendered)
			sameAsKustomize(t, kustSidecar(), r.rendered)
		},
	}, {
		name: "observer, every option",
		values: `
nameOverride: liveness
fullnameOverride: db1-liveness
commonLabels: {team: platform}
image: {repository: registry.example.com/pg_liveness_exporter, tag: v1.2.3, pullPolicy: Always}
imagePullSecrets: [{name: regcred}]
dsn: {existingSecret: db1-dsn, key: url}
podSecurityContext: {runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001}
securityContext: {seccompProfile: {type: RuntimeDefault}}
observer:
  resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: "1", memory: 128Mi}}
  extraArgs: [--log.level=debug, --web.config.file=/etc/pg-liveness-web/web.yml]
  extraEnv: [{name: GOMEMLIMIT, value: 80MiB}]
  extraVolumes: [{name: web, secret: {secretName: db1-web}}]
  extraVolumeMounts: [{name: web, mountPath: /etc/pg-liveness-web, readOnly: true}]
  podAnnotations: {example.com/owner: platform}
  podLabels: {tier: monitoring}
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: monitoring, effect: NoSchedule}]
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [monitoring]}]}]}}}
  priorityClassName: monitoring
  serviceAccount: {create: true, name: db1-observer, annotations: {example.com/role: observer}}
  service: {type: NodePort, port: 80, annotations: {example.com/expose: "false"}}
  podMonitor:
` + monitorSettings + `prometheusRule: {labels: {release: kube-prometheus-stack}}
dashboards: {labels: {team: platform-dashboards}, annotations: {grafana_folder: pg_liveness}}
`,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 1, 1, 1, 0, 1, dashboards, 1, 0)
			d := r.deployments[0]
			checkObserver(t, d, dsnSecret{"db1-dsn", "url"})
			checkMonitorJobs(t, r.rendered)
			pod := d.Spec.Template.Spec
			c := containerNamed(t, pod, "pg-liveness-exporter")
			var names, teams []string
			for _, o := range r.objects() {
				names = append(names, o.GetName())
				teams = append(teams, o.GetLabels()["team"])
				if n := o.GetLabels()["app.kubernetes.io/name"]; n != "liveness" {
					t.Errorf("%s: app.kubernetes.io/name %q, want nameOverride's liveness", o.GetName(), n)
				}
			}
			for i, n := range names {
				if !strings.HasPrefix(n, "db1-liveness") && n != "db1-observer" {
					t.Errorf("object %s not named after fullnameOverride", n)
				}
				if teams[i] != "platform" && teams[i] != "platform-dashboards" {
					t.Errorf("object %s lacks commonLabels", n)
				}
			}
			wantEqual(t, "image", c.Image+" "+string(c.ImagePullPolicy), "registry.example.com/pg_liveness_exporter:v1.2.3 Always")
			wantEqual(t, "imagePullSecrets", pod.ImagePullSecrets, []corev1.LocalObjectReference{{Name: "regcred"}})
			if sc := pod.SecurityContext; *sc.RunAsUser != 10001 || *sc.RunAsGroup != 10001 || *sc.FSGroup != 10001 || !*sc.RunAsNonRoot || sc.SeccompProfile == nil {
				t.Errorf("podSecurityContext not merged into the defaults: %+v", sc)
			}
			if sc := c.SecurityContext; sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("securityContext not merged into the defaults: %+v", sc)
			}
			wantEqual(t, "resources", c.Resources, corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("128Mi")},
			})
			wantEqual(t, "args", c.Args[len(c.Args)-2:], []string{"--log.level=debug", "--web.config.file=/etc/pg-liveness-web/web.yml"})
			wantEqual(t, "env", c.Env, []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "80MiB"}})
			wantEqual(t, "extra volume", pod.Volumes[1:], []corev1.Volume{{Name: "web", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db1-web"}}}})
			wantEqual(t, "extra mount", c.VolumeMounts[1:], []corev1.VolumeMount{{Name: "web", MountPath: "/etc/pg-liveness-web", ReadOnly: true}})
			wantEqual(t, "pod annotations", d.Spec.Template.Annotations, map[string]string{"example.com/owner": "platform"})
			if d.Spec.Template.Labels["tier"] != "monitoring" || d.Spec.Selector.MatchLabels["tier"] != "" {
				t.Errorf("podLabels belong on the pod, not in the selector: pod %v, selector %v", d.Spec.Template.Labels, d.Spec.Selector.MatchLabels)
			}
			wantEqual(t, "nodeSelector", pod.NodeSelector, map[string]string{"kubernetes.io/os": "linux"})
			wantEqual(t, "tolerations", pod.Tolerations, []corev1.Toleration{{Key: "dedicated", Operator: "Equal", Value: "monitoring", Effect: "NoSchedule"}})
			if a := pod.Affinity; a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "pool" {
				t.Errorf("affinity: %+v", a)
			}
			wantEqual(t, "priorityClassName", pod.PriorityClassName, "monitoring")
			sa := r.serviceAccounts[0]
			if pod.ServiceAccountName != "db1-observer" || sa.Name != "db1-observer" || sa.Annotations["example.com/role"] != "observer" || sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
				t.Errorf("service account: pod uses %q; created %s %v automount %v", pod.ServiceAccountName, sa.Name, sa.Annotations, sa.AutomountServiceAccountToken)
			}
			if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
				t.Error("the pod mounts a service-account token")
			}
			svc := r.services[0]
			if svc.Spec.Type != corev1.ServiceTypeNodePort || svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.String() != "metrics" || svc.Annotations["example.com/expose"] != "false" {
				t.Errorf("service: %+v %v", svc.Spec, svc.Annotations)
			}
			pm := r.podMonitors[0]
			ep := pm.Spec.PodMetricsEndpoints[0]
			checkMonitor(t, "podMonitor", pm.Labels, ep.Interval, ep.ScrapeTimeout, ep.RelabelConfigs, ep.MetricRelabelConfigs, ep)
			if r.promRules[0].Labels["release"] != "kube-prometheus-stack" {
				t.Errorf("prometheusRule labels: %v", r.promRules[0].Labels)
			}
			for _, cm := range r.configMaps {
				if cm.Labels["team"] != "platform-dashboards" || cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "pg_liveness" {
					t.Errorf("dashboard %s: labels %v, annotations %v", cm.Name, cm.Labels, cm.Annotations)
				}
			}
		},
	}, {
		name: "observer with a ServiceMonitor",
		values: `
observer:
  podMonitor: {enabled: false}
  serviceMonitor:
    enabled: true
` + monitorSettings,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 1, 1, 0, 1, 1, dashboards, 0, 0)
			checkMonitorJobs(t, r.rendered)
			sm, svc := r.serviceMonitors[0], r.services[0]
			for k, v := range sm.Spec.Selector.MatchLabels {
				if svc.Labels[k] != v {
					t.Errorf("the ServiceMonitor selects %s=%s, which the Service %s lacks (%v)", k, v, svc.Name, svc.Labels)
				}
			}
			ep := sm.Spec.Endpoints[0]
			if ep.Port != svc.Spec.Ports[0].Name {
				t.Errorf("the ServiceMonitor scrapes port %q, the Service's is %q", ep.Port, svc.Spec.Ports[0].Name)
			}
			checkMonitor(t, "serviceMonitor", sm.Labels, ep.Interval, ep.ScrapeTimeout, slices.Delete(slices.Clone(ep.RelabelConfigs), 1, 2), ep.MetricRelabelConfigs, ep)
			if strings.Contains(r.notes, "Neither observer.podMonitor") {
				t.Errorf("NOTES warn about a missing monitor:\n%s", r.notes)
			}
		},
	}, {
		name: "observer without a monitor, on a platform that assigns users",
		values: `
podSecurityContext: {runAsUser: null, runAsGroup: null, fsGroup: null}
observer: {podMonitor: {enabled: false}}
`,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 1, 1, 0, 0, 1, dashboards, 0, 0)
			sc := r.deployments[0].Spec.Template.Spec.SecurityContext
			if sc.RunAsUser != nil || sc.RunAsGroup != nil || sc.FSGroup != nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil {
				t.Errorf("want runAsNonRoot and seccomp without fixed ids: %+v", sc)
			}
			if !strings.Contains(r.notes, `with job="pg_liveness"`) {
				t.Errorf("NOTES do not say that nothing scrapes the observer:\n%s", r.notes)
			}
		},
	}, {
		name:    "sidecar, every agent option",
		sidecar: true,
		parent:  `extraVolumes: [{name: web, secret: {secretName: checkout-web}}, {name: direct-dsn, secret: {secretName: checkout-direct-dsn}}]`,
		values: `
agent:
  resources: {requests: {cpu: 20m, memory: 40Mi}, limits: {cpu: 300m, memory: 80Mi}}
  extraArgs: [--log.level=debug, --web.config.file=/etc/pg-liveness-web/web.yml, --db.direct-dsn-file=/etc/pg-liveness-direct/dsn]
  extraEnv: [{name: GOMEMLIMIT, value: 50MiB}]
  extraVolumeMounts: [{name: web, mountPath: /etc/pg-liveness-web, readOnly: true}, {name: direct-dsn, mountPath: /etc/pg-liveness-direct, readOnly: true}]
  terminationGracePeriodSeconds: 60
  livenessProbe: {tcpSocket: {port: pg-liveness}, periodSeconds: 20}
  readinessProbe: {tcpSocket: {port: pg-liveness}}
  podMonitor:
    enabled: true
` + monitorSettings,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 2, 1, 2, 0, 1, dashboards, 0, 0)
			d := deployment(t, r.rendered, "checkout")
			checkAgent(t, d, defaultDSNSecret)
			checkMonitorJobs(t, r.rendered)
			pod := d.Spec.Template.Spec
			c := containerNamed(t, pod, "pg-liveness-exporter")
			wantEqual(t, "resources", c.Resources, corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("20m"), corev1.ResourceMemory: resource.MustParse("40Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("300m"), corev1.ResourceMemory: resource.MustParse("80Mi")},
			})
			// The alive lock's own DSN (behind a pooler, the main DSN cannot serve it) as a
			// file: the one way that keeps it out of the process list.
			wantEqual(t, "args", c.Args[len(c.Args)-3:], []string{"--log.level=debug", "--web.config.file=/etc/pg-liveness-web/web.yml", "--db.direct-dsn-file=/etc/pg-liveness-direct/dsn"})
			wantEqual(t, "env", c.Env[2:], []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "50MiB"}})
			wantEqual(t, "extra mount", c.VolumeMounts[1:], []corev1.VolumeMount{{Name: "web", MountPath: "/etc/pg-liveness-web", ReadOnly: true}, {Name: "direct-dsn", MountPath: "/etc/pg-liveness-direct", ReadOnly: true}})
			wantEqual(t, "the parent's volume", pod.Volumes[1].Name, "web")
			wantEqual(t, "terminationGracePeriodSeconds", *pod.TerminationGracePeriodSeconds, int64(60))
			if c.LivenessProbe.TCPSocket == nil || c.LivenessProbe.PeriodSeconds != 20 || c.ReadinessProbe.TCPSocket == nil {
				t.Errorf("probes from values: %+v %+v", c.LivenessProbe, c.ReadinessProbe)
			}
			pm := byComponent(t, r.podMonitors, "agent")
			ep := pm.Spec.PodMetricsEndpoints[0]
			checkMonitor(t, "agent podMonitor", pm.Labels, ep.Interval, ep.ScrapeTimeout, ep.RelabelConfigs, ep.MetricRelabelConfigs, ep)
		},
	}, {
		// --web.config.file with TLS and basic auth: the probes cannot GET / (401), so
		// they check the port; the monitor scrapes over TLS with basic auth. And the
		// rest of what the prometheus-community charts offer.
		name: "observer behind TLS and basic auth, in another namespace",
		values: `
namespaceOverride: monitoring
database: orders
observer:
  extraArgs: [--web.config.file=/etc/pg-liveness-web/web.yml]
  extraVolumes: [{name: web, secret: {secretName: pg-liveness-web, defaultMode: 0440}}]
  extraVolumeMounts: [{name: web, mountPath: /etc/pg-liveness-web, readOnly: true}]
  extraContainers: [{name: log-shipper, image: "registry.example.com/shipper:1", securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}}]
  livenessProbe: {tcpSocket: {port: metrics}, periodSeconds: 10, failureThreshold: 6}
  readinessProbe: {tcpSocket: {port: metrics}, periodSeconds: 10}
  podDisruptionBudget: {enabled: true, maxUnavailable: 100%}
  podMonitor:
` + monitorSettings + `networkPolicy:
  enabled: true
  ingressFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: prometheus}}}]
  egress: [{ports: [{port: 5432, protocol: TCP}, {port: 53, protocol: UDP}]}]
`,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 1, 1, 1, 0, 1, dashboards, 0, 0)
			checkObserver(t, r.deployments[0], defaultDSNSecret)
			checkMonitorJobs(t, r.rendered)
			for _, o := range r.objects() {
				if o.GetNamespace() != "monitoring" {
					t.Errorf("%T %s in namespace %q, want namespaceOverride's monitoring", o, o.GetName(), o.GetNamespace())
				}
			}
			pod := r.deployments[0].Spec.Template.Spec
			if len(pod.Containers) != 2 || pod.Containers[1].Name != "log-shipper" {
				t.Errorf("extraContainers: %d containers", len(pod.Containers))
			}
			ep := r.podMonitors[0].Spec.PodMetricsEndpoints[0]
			checkMonitor(t, "podMonitor", r.podMonitors[0].Labels, ep.Interval, ep.ScrapeTimeout, ep.RelabelConfigs[1:], ep.MetricRelabelConfigs, ep)
			if rl := ep.RelabelConfigs[1]; rl.TargetLabel != "database" || rl.Replacement == nil || *rl.Replacement != "orders" {
				t.Errorf("the PodMonitor does not label database=orders: %+v", ep.RelabelConfigs)
			}
			if len(r.pdbs) != 1 || r.pdbs[0].Spec.MaxUnavailable.String() != "100%" || r.pdbs[0].Spec.MinAvailable != nil {
				t.Errorf("PodDisruptionBudget: %+v", r.pdbs)
			} else if sel := r.pdbs[0].Spec.Selector.MatchLabels; sel["app.kubernetes.io/component"] != "observer" {
				t.Errorf("the PodDisruptionBudget selects %v", sel)
			}
			if len(r.netpols) != 1 {
				t.Fatalf("%d NetworkPolicies, want 1", len(r.netpols))
			}
			np := r.netpols[0].Spec
			if len(np.Ingress) != 1 || len(np.Ingress[0].From) != 1 || np.Ingress[0].Ports[0].Port.String() != "metrics" ||
				len(np.Egress) != 1 || len(np.PolicyTypes) != 2 || np.PodSelector.MatchLabels["app.kubernetes.io/component"] != "observer" {
				t.Errorf("NetworkPolicy: %+v", np)
			}
		},
	}, {
		name: "nothing enabled",
		values: `
observer: {enabled: false}
prometheusRule: {enabled: false}
dashboards: {enabled: false}
`,
		check: func(t *testing.T, r *helmRelease) {
			if r.objectsTotal != 0 || strings.TrimSpace(r.notes) != "" {
				t.Errorf("rendered %d objects and notes %q, want none", r.objectsTotal, r.notes)
			}
		},
	}, {
		name:   "multi-target shape, as the overlay",
		values: `multiTarget: {enabled: true, probe: {targets: [orders, billing]}}`,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 1, 1, 1, 0, 1, dashboards, 0, 0)
			kust := render(t, "kubernetes/overlays/multi-target")
			sameAsKustomize(t, kust, r.rendered)
			if len(r.probes) != 1 || len(kust.probes) != 1 {
				t.Fatalf("%d Probes, kustomize %d; want 1", len(r.probes), len(kust.probes))
			}
			wantEqual(t, "Probe spec, kustomize (-) and the chart (+)", r.probes[0].Spec, kust.probes[0].Spec)
			checkMonitorJobs(t, r.rendered)
			if !strings.Contains(r.notes, "create secret generic pg-liveness-exporter-targets --from-file=targets.yml=./targets.yml") {
				t.Errorf("NOTES do not say how to create the targets' Secret:\n%s", r.notes)
			}
		},
	}, {
		name: "multi-target, every option",
		values: `
fullnameOverride: db1-liveness
image: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
multiTarget:
  enabled: true
  existingSecret: db1-targets
  key: exporter.yml
  probe:
    targets: [orders]
    interval: 1m
    scrapeTimeout: 20s
    labels: {release: kube-prometheus-stack}
    scheme: https
    tlsConfig: {serverName: pg-liveness-exporter, ca: {secret: {name: pg-liveness-web, key: ca.crt}}}
    basicAuth: {username: {name: pg-liveness-scrape, key: username}, password: {name: pg-liveness-scrape, key: password}}
`,
		check: func(t *testing.T, r *helmRelease) {
			if len(r.probes) != 1 {
				t.Fatalf("%d Probes, want 1", len(r.probes))
			}
			p := r.probes[0]
			c := containerNamed(t, r.deployments[0].Spec.Template.Spec, "pg-liveness-exporter")
			wantEqual(t, "args", c.Args, []string{"--no-agent", "--config.file=/etc/pg-liveness-exporter/exporter.yml", "--web.listen-address=:9816"})
			wantEqual(t, "image pinned by digest", c.Image, "ghcr.io/pg-liveness/pg_liveness_exporter@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
			if v := r.deployments[0].Spec.Template.Spec.Volumes; len(v) != 1 || v[0].Secret == nil || v[0].Secret.SecretName != "db1-targets" {
				t.Errorf("volumes %+v, want the Secret db1-targets", v)
			}
			if p.Labels["release"] != "kube-prometheus-stack" || p.Spec.Interval != "1m" || p.Spec.ScrapeTimeout != "20s" ||
				p.Spec.ProberSpec.URL != "db1-liveness.pg-liveness.svc:9816" || !slices.Equal(p.Spec.Targets.StaticConfig.Targets, []string{"orders"}) {
				t.Errorf("Probe %s: labels %v, interval %s, timeout %s, prober %s, targets %v", p.Name, p.Labels, p.Spec.Interval,
					p.Spec.ScrapeTimeout, p.Spec.ProberSpec.URL, p.Spec.Targets.StaticConfig.Targets)
			}
			if p.Spec.ProberSpec.Scheme == nil || *p.Spec.ProberSpec.Scheme != "https" || p.Spec.TLSConfig == nil || p.Spec.BasicAuth == nil {
				t.Errorf("Probe %s: scheme %v, tlsConfig %+v, basicAuth %+v", p.Name, p.Spec.ProberSpec.Scheme, p.Spec.TLSConfig, p.Spec.BasicAuth)
			}
		},
	}, {
		name:   "multi-target without the Probe",
		values: `multiTarget: {enabled: true, probe: {enabled: false}}`,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 1, 1, 1, 0, 1, dashboards, 0, 0)
			if len(r.probes) != 0 {
				t.Errorf("%d Probes, want none", len(r.probes))
			}
		},
	}, {
		name:   "node-agent shape, as the overlay",
		values: `nodeAgent: {enabled: true}`,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 1, 2, 2, 0, 1, dashboards, 0, 1)
			checkObserver(t, byComponent(t, r.deployments, "observer"), defaultDSNSecret)
			at := nodeAgentService(t, r.rendered)
			checkMonitorJobs(t, r.rendered)
			sameAsKustomize(t, render(t, "kubernetes/overlays/node-agent"), r.rendered)
			for _, want := range []string{at.address, "create secret generic " + at.tokenSecret + " --from-file=" + at.key + "=./token"} {
				if !strings.Contains(r.notes, want) {
					t.Errorf("NOTES do not say %q:\n%s", want, r.notes)
				}
			}
		},
	}, {
		name: "node agent, every option",
		values: `
commonLabels: {team: platform}
observer: {enabled: false}
nodeAgent:
  enabled: true
  port: 9818
  token: {existingSecret: orders-node-agent-token, key: node-token}
  serviceName: orders-node-agent
  podSecurityContext: {runAsUser: 10001, runAsGroup: 10001}
  securityContext: {runAsUser: 10001}
  resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {cpu: "1", memory: 256Mi}}
  extraArgs: [--log.level=debug, --db.direct-dsn-file=/etc/pg-liveness-direct/dsn]
  extraEnv: [{name: GOMEMLIMIT, value: 100MiB}]
  extraVolumes: [{name: direct-dsn, secret: {secretName: orders-direct-dsn, defaultMode: 0440}}]
  extraVolumeMounts: [{name: direct-dsn, mountPath: /etc/pg-liveness-direct, readOnly: true}]
  livenessProbe: {tcpSocket: {port: metrics}, periodSeconds: 20}
  readinessProbe: {tcpSocket: {port: metrics}}
  terminationGracePeriodSeconds: 60
  maxUnavailable: 10%
  podAnnotations: {example.com/owner: platform}
  podLabels: {tier: node}
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{operator: Exists}]
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [orders]}]}]}}}
  priorityClassName: system-node-critical
  podMonitor:
` + monitorSettings,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 0, 1, 1, 0, 1, dashboards, 0, 1)
			d := r.daemonSets[0]
			at := nodeAgentService(t, r.rendered)
			checkMonitorJobs(t, r.rendered)
			wantEqual(t, "where processes attach", at, nodeAgentEndpoint{"tcp://pg-liveness-exporter-node-agent.pg-liveness.svc:9818",
				"orders-node-agent-token", "node-token"})
			pod := d.Spec.Template.Spec
			c := containerNamed(t, pod, "pg-liveness-exporter")
			for _, flag := range []string{"--node-agent.listen-address=:9818", "--agent.service-name=orders-node-agent"} {
				if !slices.Contains(c.Args, flag) {
					t.Errorf("args %q lack %s", c.Args, flag)
				}
			}
			if sc := pod.SecurityContext; *sc.RunAsUser != 10001 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || *sc.FSGroup != 65532 || sc.SeccompProfile == nil {
				t.Errorf("nodeAgent.podSecurityContext not merged into its defaults: %+v", sc)
			}
			if sc := c.SecurityContext; sc.RunAsUser == nil || *sc.RunAsUser != 10001 || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("nodeAgent.securityContext not merged into its defaults: %+v", sc)
			}
			wantEqual(t, "resources", c.Resources, corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")},
			})
			wantEqual(t, "args", c.Args[len(c.Args)-2:], []string{"--log.level=debug", "--db.direct-dsn-file=/etc/pg-liveness-direct/dsn"})
			wantEqual(t, "env", c.Env[1:], []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "100MiB"}})
			wantEqual(t, "extra volume", pod.Volumes[3:], []corev1.Volume{{Name: "direct-dsn", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "orders-direct-dsn", DefaultMode: new(int32(0o440))}}}})
			wantEqual(t, "extra mount", c.VolumeMounts[3:], []corev1.VolumeMount{{Name: "direct-dsn", MountPath: "/etc/pg-liveness-direct", ReadOnly: true}})
			if c.LivenessProbe.TCPSocket == nil || c.LivenessProbe.PeriodSeconds != 20 || c.ReadinessProbe.TCPSocket == nil {
				t.Errorf("probes from values: %+v %+v", c.LivenessProbe, c.ReadinessProbe)
			}
			wantEqual(t, "terminationGracePeriodSeconds", *pod.TerminationGracePeriodSeconds, int64(60))
			wantEqual(t, "maxUnavailable", d.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String(), "10%")
			wantEqual(t, "pod annotations", d.Spec.Template.Annotations, map[string]string{"example.com/owner": "platform"})
			if d.Spec.Template.Labels["tier"] != "node" || d.Spec.Selector.MatchLabels["tier"] != "" {
				t.Errorf("podLabels belong on the pod, not in the selector: pod %v, selector %v", d.Spec.Template.Labels, d.Spec.Selector.MatchLabels)
			}
			wantEqual(t, "nodeSelector", pod.NodeSelector, map[string]string{"kubernetes.io/os": "linux"})
			wantEqual(t, "tolerations", pod.Tolerations, []corev1.Toleration{{Operator: "Exists"}})
			if a := pod.Affinity; a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "pool" {
				t.Errorf("affinity: %+v", a)
			}
			wantEqual(t, "priorityClassName", pod.PriorityClassName, "system-node-critical")
			for _, o := range r.objects() {
				if o.GetLabels()["team"] != "platform" && o.GetLabels()["grafana_dashboard"] == "" {
					t.Errorf("%T %s lacks commonLabels", o, o.GetName())
				}
			}
			pm := r.podMonitors[0]
			ep := pm.Spec.PodMetricsEndpoints[0]
			checkMonitor(t, "nodeAgent.podMonitor", pm.Labels, ep.Interval, ep.ScrapeTimeout, ep.RelabelConfigs, ep.MetricRelabelConfigs, ep)
			if !strings.Contains(r.notes, "--from-file=node-token=./token") {
				t.Errorf("NOTES do not say how to create the token's Secret:\n%s", r.notes)
			}
		},
	}, {
		name: "node agent with a ServiceMonitor",
		values: `
nodeAgent:
  enabled: true
  podMonitor: {enabled: false}
  serviceMonitor:
    enabled: true
` + monitorSettings,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 1, 2, 1, 1, 1, dashboards, 0, 1)
			checkMonitorJobs(t, r.rendered)
			sm, svc, ds := r.serviceMonitors[0], byComponent(t, r.services, "node-agent"), r.daemonSets[0]
			for k, v := range sm.Spec.Selector.MatchLabels {
				if svc.Labels[k] != v {
					t.Errorf("the ServiceMonitor selects %s=%s, which the Service %s lacks (%v)", k, v, svc.Name, svc.Labels)
				}
			}
			for k, v := range svc.Spec.Selector {
				if ds.Spec.Template.Labels[k] != v {
					t.Errorf("the Service selects %s=%s, which the node agents' pods lack (%v)", k, v, ds.Spec.Template.Labels)
				}
			}
			nodeAgentService(t, r.rendered)
			ep := sm.Spec.Endpoints[0]
			metrics := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port })
			if metrics < 0 || svc.Spec.Ports[metrics].TargetPort.String() != ds.Spec.Template.Spec.Containers[0].Ports[0].Name {
				t.Errorf("the ServiceMonitor scrapes port %q, which the Service %+v does not target at the pods' metrics port", ep.Port, svc.Spec.Ports)
			}
			checkMonitor(t, "nodeAgent.serviceMonitor", sm.Labels, ep.Interval, ep.ScrapeTimeout, slices.Delete(slices.Clone(ep.RelabelConfigs), 1, 2), ep.MetricRelabelConfigs, ep)
		},
	}, {
		// A second release beside the observer's: only the node agents.
		name: "node agents alone, without a monitor",
		values: `
observer: {enabled: false}
prometheusRule: {enabled: false}
dashboards: {enabled: false}
nodeAgent: {enabled: true, podMonitor: {enabled: false}}
`,
		check: func(t *testing.T, r *helmRelease) {
			wantCounts(t, r, 0, 1, 0, 0, 0, 0, 0, 1)
			if !strings.Contains(r.notes, `with job="pg_liveness_node_agent"`) {
				t.Errorf("NOTES do not say that nothing scrapes the node agents:\n%s", r.notes)
			}
		},
	}}
}

// monitorSettings are the scrape settings the matrix gives a monitor (podMonitor or
// serviceMonitor), at the indentation of its keys; checkMonitor checks that the rendered
// monitor has them.
const monitorSettings = `    labels: {release: kube-prometheus-stack}
    interval: 15s
    scrapeTimeout: 5s
    honorLabels: false
    scheme: https
    tlsConfig: {serverName: pg-liveness-exporter, ca: {secret: {name: pg-liveness-web, key: ca.crt}}}
    basicAuth: {username: {name: pg-liveness-scrape, key: username}, password: {name: pg-liveness-scrape, key: password}}
    relabelings: [{action: replace, targetLabel: cluster, replacement: eu-1}]
    metricRelabelings: [{action: drop, sourceLabels: [__name__], regex: go_gc_.*}]
`

func checkMonitor(t *testing.T, what string, labels map[string]string, interval, timeout monitoringv1.Duration,
	relabel, metricRelabel []monitoringv1.RelabelConfig, endpoint any) {
	t.Helper()
	if labels["release"] != "kube-prometheus-stack" || string(interval) != "15s" || string(timeout) != "5s" ||
		len(relabel) != 2 || relabel[1].TargetLabel != "cluster" || len(metricRelabel) != 1 {
		t.Errorf("%s: labels %v, endpoint %+v", what, labels, endpoint)
	}
	// The scrape over TLS with basic auth, as --web.config.file serves it.
	y := yamlOf(t, endpoint)
	for _, want := range []string{"scheme: https", "serverName: pg-liveness-exporter", "name: pg-liveness-scrape"} {
		if !strings.Contains(y, want) {
			t.Errorf("%s: the endpoint lacks %q:\n%s", what, want, y)
		}
	}
	if strings.Contains(y, "honorLabels: true") {
		t.Errorf("%s: honorLabels is true, the values say false", what)
	}
}

// metaObject is what the label checks read of an object.
type metaObject interface {
	GetName() string
	GetNamespace() string
	GetLabels() map[string]string
}

// objects lists every rendered object's metadata.
func (r *rendered) objects() []metaObject {
	var out []metaObject
	out = appendObjects(out, r.deployments)
	out = appendObjects(out, r.daemonSets)
	out = appendObjects(out, r.services)
	out = appendObjects(out, r.serviceAccounts)
	out = appendObjects(out, r.configMaps)
	out = appendObjects(out, r.podMonitors)
	out = appendObjects(out, r.serviceMonitors)
	out = appendObjects(out, r.probes)
	out = appendObjects(out, r.pdbs)
	out = appendObjects(out, r.netpols)
	return appendObjects(out, r.promRules)
}

func appendObjects[T metaObject](out []metaObject, list []T) []metaObject {
	for _, o := range list {
		out = append(out, o)
	}
	return out
}

// The chart is rendered for every row of the matrix with Helm's library and each object
// decodes strictly into its Kubernetes or Prometheus Operator type.
func TestChartRendersStrictlyIntoOfficialTypes(t *testing.T) {
	example := buildExample(t)
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			r, err := c.render(t, example, c.chartValues(t))
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, r)
		})
	}
}

// sameAsKustomize checks that the chart renders the objects the kustomize overlay does:
// the same Deployment and DaemonSet specs (containers, arguments, probes, security
// contexts, resources, volumes, termination grace), Services, PodMonitors, PrometheusRule
// and dashboards. Names, namespaces and labels differ by design: Helm's labels name the
// release; the chart's selectors must contain kustomize's.
func sameAsKustomize(t *testing.T, k *rendered, h *rendered) {
	t.Helper()
	if len(k.deployments) != len(h.deployments) || len(k.daemonSets) != len(h.daemonSets) || len(k.services) != len(h.services) || len(k.podMonitors) != len(h.podMonitors) ||
		len(k.serviceMonitors) != len(h.serviceMonitors) || len(k.promRules) != len(h.promRules) || len(k.configMaps) != len(h.configMaps) {
		t.Fatalf("kustomize renders %d Deployments, %d DaemonSets, %d Services, %d PodMonitors, %d ServiceMonitors, %d PrometheusRules, %d ConfigMaps; the chart %d, %d, %d, %d, %d, %d, %d",
			len(k.deployments), len(k.daemonSets), len(k.services), len(k.podMonitors), len(k.serviceMonitors), len(k.promRules), len(k.configMaps),
			len(h.deployments), len(h.daemonSets), len(h.services), len(h.podMonitors), len(h.serviceMonitors), len(h.promRules), len(h.configMaps))
	}
	match := func(what string, kl, hl map[string]string) {
		t.Helper()
		for key, v := range kl {
			if hl[key] != v {
				t.Errorf("%s: kustomize has %s=%s, the chart %v", what, key, v, hl)
			}
		}
	}
	for _, kd := range k.deployments {
		hd, ok := counterpart(t, h.deployments, kd)
		if !ok {
			continue
		}
		ks, hs := kd.Spec.DeepCopy(), hd.Spec.DeepCopy()
		match("Deployment "+kd.Name+" selector", ks.Selector.MatchLabels, hs.Selector.MatchLabels)
		match("Deployment "+kd.Name+" pod labels", ks.Template.Labels, hs.Template.Labels)
		ks.Selector, hs.Selector, ks.Template.Labels, hs.Template.Labels = nil, nil, nil, nil
		wantEqual(t, "Deployment "+kd.Name+" spec, kustomize (-) and the chart (+)", *hs, *ks)
	}
	for _, kd := range k.daemonSets {
		hd, ok := counterpart(t, h.daemonSets, kd)
		if !ok {
			continue
		}
		ks, hs := kd.Spec.DeepCopy(), hd.Spec.DeepCopy()
		match("DaemonSet "+kd.Name+" selector", ks.Selector.MatchLabels, hs.Selector.MatchLabels)
		match("DaemonSet "+kd.Name+" pod labels", ks.Template.Labels, hs.Template.Labels)
		ks.Selector, hs.Selector, ks.Template.Labels, hs.Template.Labels = nil, nil, nil, nil
		wantEqual(t, "DaemonSet "+kd.Name+" spec, kustomize (-) and the chart (+)", *hs, *ks)
	}
	for _, ks := range k.services {
		hs, ok := counterpart(t, h.services, ks)
		if !ok {
			continue
		}
		match("Service "+ks.Name+" selector", ks.Spec.Selector, hs.Spec.Selector)
		kspec, hspec := ks.Spec.DeepCopy(), hs.Spec.DeepCopy()
		kspec.Selector, hspec.Selector = nil, nil
		kspec.Type = stdcmp.Or(kspec.Type, corev1.ServiceTypeClusterIP) // the API's default
		wantEqual(t, "Service "+ks.Name+" spec, kustomize (-) and the chart (+)", *hspec, *kspec)
	}
	for _, kp := range k.podMonitors {
		hp, ok := counterpart(t, h.podMonitors, kp)
		if !ok {
			continue
		}
		ks, hs := kp.Spec.DeepCopy(), hp.Spec.DeepCopy()
		match("PodMonitor "+kp.Name+" selector", ks.Selector.MatchLabels, hs.Selector.MatchLabels)
		ks.Selector.MatchLabels, hs.Selector.MatchLabels = nil, nil
		wantEqual(t, "PodMonitor "+kp.Name+" spec, kustomize (-) and the chart (+)", *hs, *ks)
	}
	wantEqual(t, "PrometheusRule spec, kustomize (-) and the chart (+)", h.promRules[0].Spec, k.promRules[0].Spec)
	dashboards := func(r *rendered) map[string]string {
		out := map[string]string{}
		for _, c := range r.configMaps {
			if c.Labels["grafana_dashboard"] != "1" {
				t.Errorf("ConfigMap %s is not labelled grafana_dashboard=1", c.Name)
			}
			maps.Copy(out, c.Data)
		}
		return out
	}
	kd, hd := dashboards(k), dashboards(h)
	if !slices.Equal(slices.Sorted(maps.Keys(kd)), slices.Sorted(maps.Keys(hd))) {
		t.Errorf("the dashboards differ: kustomize has %v, the chart %v", slices.Sorted(maps.Keys(kd)), slices.Sorted(maps.Keys(hd)))
	}
	for name, kj := range kd {
		if d := cmp.Diff(kj, hd[name]); d != "" {
			t.Errorf("dashboard %s, kustomize (-) and the chart (+):\n%s", name, d)
		}
	}
}

// Values the chart must refuse, each with an error that names the value; a DSN in a
// refused value is never repeated.
func TestChartRefusesBadValues(t *testing.T) {
	const secret = "hunter2"
	example := buildExample(t)
	for _, c := range []struct {
		name    string
		sidecar bool
		values  string
		want    string
	}{
		{"a DSN in the observer's arguments", false, `observer: {extraArgs: ["--db.dsn=postgres://u:` + secret + `@db/app"]}`, "observer.extraArgs: --db.dsn would put a DSN in the process list"},
		{"a direct DSN in the agent's arguments", true, `agent: {extraArgs: ["--db.direct-dsn=postgres://u:` + secret + `@db/app"]}`, "agent.extraArgs: --db.direct-dsn would put a DSN in the process list; put it in a Secret and pass its file with --db.direct-dsn-file"},
		{"a DSN in the observer's environment", false, `observer: {extraEnv: [{name: DATA_SOURCE_NAME, value: "postgres://u:` + secret + `@db/app"}]}`, "observer.extraEnv: DATA_SOURCE_NAME would put a DSN or password in the environment"},
		{"postgres_exporter's password variable", false, `observer: {extraEnv: [{name: DATA_SOURCE_PASS, value: ` + secret + `}]}`, "observer.extraEnv: DATA_SOURCE_PASS would put a DSN or password in the environment"},
		{"a DSN flag's variable", true, `agent: {extraEnv: [{name: PG_LIVENESS_EXPORTER_DB_DSN, value: "host=db password=` + secret + `"}]}`, "agent.extraEnv: PG_LIVENESS_EXPORTER_DB_DSN would put a DSN or password in the environment"},
		{"a password in the agent's environment", true, `agent: {extraEnv: [{name: PGPASSWORD, value: ` + secret + `}]}`, "agent.extraEnv: PGPASSWORD would put a DSN or password in the environment"},
		{"a flag the chart sets, observer", false, `observer: {extraArgs: ["--web.listen-address=:9000"]}`, "observer.extraArgs: --web.listen-address is set by the chart"},
		{"a negated flag the chart sets, observer", false, `observer: {extraArgs: ["--migrations.apply"]}`, "observer.extraArgs: --migrations.apply is set by the chart"},
		{"a flag the chart sets, agent", true, `agent: {extraArgs: ["--collector.leases"]}`, "agent.extraArgs: --collector.leases is set by the chart"},
		{"a variable the chart sets, agent", true, `agent: {extraEnv: [{name: POD_UID, value: x}]}`, "agent.extraEnv: POD_UID is set by the chart"},
		{"two monitors of the observer", false, `observer: {serviceMonitor: {enabled: true}}`, "observer.podMonitor.enabled and observer.serviceMonitor.enabled: enable one"},
		{"a misspelt value", false, `observer: {podMonitr: {enabled: false}}`, "podMonitr"},
		{"a misspelt value under the example", true, `agent: {terminationGracePeriod: 60}`, "terminationGracePeriod"},
		{"a value of the wrong type", false, `observer: {service: {port: metrics}}`, "port"},
		{"an environment variable without a name", false, `observer: {extraEnv: [{value: x}]}`, "name"},
		{"a Probe without targets", false, `multiTarget: {enabled: true}`, "multiTarget.probe.targets: name at least one target"},
		{"multi-target without the observer", false, `observer: {enabled: false}
multiTarget: {enabled: true, probe: {targets: [orders]}}`, "multiTarget.enabled needs observer.enabled"},
		{"a config file in the observer's arguments", false, `observer: {extraArgs: ["--config.file=/x"]}`, "observer.extraArgs: --config.file is set by the chart"},
		{"two monitors of the node agents", false, `nodeAgent: {enabled: true, serviceMonitor: {enabled: true}}`, "nodeAgent.podMonitor.enabled and nodeAgent.serviceMonitor.enabled: enable one"},
		{"a DSN in the node agent's arguments", false, `nodeAgent: {enabled: true, extraArgs: ["--db.direct-dsn=postgres://u:` + secret + `@db/app"]}`, "nodeAgent.extraArgs: --db.direct-dsn would put a DSN in the process list"},
		{"a password in the node agent's environment", false, `nodeAgent: {enabled: true, extraEnv: [{name: PGPASSWORD, value: ` + secret + `}]}`, "nodeAgent.extraEnv: PGPASSWORD would put a DSN or password in the environment"},
		{"the listen address in the node agent's arguments", false, `nodeAgent: {enabled: true, extraArgs: ["--node-agent.listen-address=:9000"]}`, "nodeAgent.extraArgs: --node-agent.listen-address is set by the chart"},
		{"the token file in the node agent's arguments", false, `nodeAgent: {enabled: true, extraArgs: ["--node-agent.token-file=/x"]}`, "nodeAgent.extraArgs: --node-agent.token-file is set by the chart"},
		{"a variable the chart sets, node agent", false, `nodeAgent: {enabled: true, extraEnv: [{name: POD_UID, value: x}]}`, "nodeAgent.extraEnv: POD_UID is set by the chart"},
		{"the node agents on the metrics port", false, `nodeAgent: {enabled: true, port: 9816}`, "nodeAgent.port: 9816 is the metrics port"},
		{"a port that is none", false, `nodeAgent: {enabled: true, port: 70000}`, "port"},
		{"no Secret for the token", false, `nodeAgent: {enabled: true, token: {existingSecret: ""}}`, "existingSecret"},
		{"the old socket's directory", false, `nodeAgent: {enabled: true, socketDirectory: /run/pg-liveness}`, "socketDirectory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cc := chartCase{name: c.name, sidecar: c.sidecar, values: c.values}
			_, err := cc.render(t, example, cc.chartValues(t))
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Errorf("the error repeats the password: %v", err)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// helm lint's checks, run through Helm's library with each case's values: the chart's
// metadata, the values against values.schema.json, and every rendered template. Lint
// may only note that the chart has no icon (there is none to give).
func TestChartLint(t *testing.T) {
	example := buildExample(t)
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			dir, _, namespace, values := c.install(t, example, c.chartValues(t))
			l := lint.All(dir, values, namespace, false)
			for _, m := range l.Messages {
				if m.Severity == support.InfoSev && strings.HasSuffix(m.Error(), "icon is recommended") {
					continue
				}
				t.Errorf("helm lint %s: %s", dir, m.Error())
			}
			if len(l.Messages) == 0 {
				t.Error("helm lint gave no message at all, not even the missing icon: is it linting the chart?")
			}
		})
	}
}

// schemaNode is a node of values.schema.json.
type schemaNode struct {
	Ref        string                 `json:"$ref"`
	Properties map[string]*schemaNode `json:"properties"`
}

func loadSchema(t *testing.T) (root *schemaNode, resolve func(*schemaNode) *schemaNode) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		schemaNode
		Definitions map[string]*schemaNode `json:"definitions"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s.schemaNode, func(n *schemaNode) *schemaNode {
		for n.Ref != "" {
			d := s.Definitions[strings.TrimPrefix(n.Ref, "#/definitions/")]
			if d == nil {
				t.Fatalf("values.schema.json: %s is not defined", n.Ref)
			}
			n = d
		}
		return n
	}
}

// valuesLeaves walks values.yaml along values.schema.json: every key must have a comment
// above it and a schema of its own, and every schema property a key. A key whose schema
// has no properties (a string, a list, a Kubernetes object) is a leaf; the leaves' paths
// are returned.
func valuesLeaves(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	root, resolve := loadSchema(t)
	var leaves []string
	var walk func(path string, m *yaml.Node, s *schemaNode)
	walk = func(path string, m *yaml.Node, s *schemaNode) {
		seen := map[string]bool{}
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			p := strings.TrimPrefix(path+"."+k.Value, ".")
			seen[k.Value] = true
			if strings.TrimSpace(k.HeadComment) == "" {
				t.Errorf("values.yaml: %s has no comment saying what it is", p)
			}
			ks := s.Properties[k.Value]
			if ks == nil {
				t.Errorf("values.yaml: %s is not in values.schema.json", p)
				continue
			}
			ks = resolve(ks)
			if len(ks.Properties) == 0 {
				leaves = append(leaves, p)
				continue
			}
			if v.Kind != yaml.MappingNode {
				t.Errorf("values.yaml: %s is not a mapping, but its schema has properties", p)
				continue
			}
			walk(p, v, ks)
		}
		for name := range s.Properties {
			if !seen[name] && !(path == "" && name == "global") { // Helm gives a dependency "global"
				t.Errorf("values.schema.json: %s has no value in values.yaml", strings.TrimPrefix(path+"."+name, "."))
			}
		}
	}
	walk("", doc.Content[0], root)
	return leaves
}

func lookup(v map[string]any, path string) (any, bool) {
	var cur any = v
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func set(v map[string]any, path string, x any) {
	keys := strings.Split(path, ".")
	for _, k := range keys[:len(keys)-1] {
		v = v[k].(map[string]any)
	}
	v[keys[len(keys)-1]] = x
}

// Every value in values.yaml is documented, typed by the schema, and exercised: some
// row of the matrix sets it to something other than its default, and putting the
// default back changes what that row renders.
func TestChartValuesDocumentedAndExercised(t *testing.T) {
	leaves := valuesLeaves(t)
	if len(leaves) < 20 {
		t.Fatalf("only %d values found in values.yaml: %v", len(leaves), leaves)
	}
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	defaults := ch.Values
	example := buildExample(t)
	cases := chartCases(t)
	base := map[string]string{}
	for _, c := range cases {
		base[c.name] = c.outcome(t, example, c.chartValues(t))
	}
	for _, leaf := range leaves {
		def, ok := lookup(defaults, leaf)
		if !ok {
			t.Errorf("%s: no default", leaf)
			continue
		}
		exercised := false
		for _, c := range cases {
			values := c.chartValues(t)
			v, ok := lookup(values, leaf)
			if !ok || reflect.DeepEqual(v, def) {
				continue
			}
			reset := deepCopy(values)
			set(reset, leaf, deepCopy(map[string]any{"v": def})["v"])
			if c.outcome(t, example, reset) == base[c.name] {
				t.Errorf("%s: case %q sets it to %v, but the default %v renders the same", leaf, c.name, v, def)
			}
			exercised = true
		}
		if !exercised {
			t.Errorf("%s: no case of the matrix sets it to something other than its default %v", leaf, def)
		}
	}
}

// The named templates the deployment guide (docs/deployment.md) tells a service's chart to
// include are defined by the chart, and the example chart includes each of them.
func TestDocsNameTheChartsTemplates(t *testing.T) {
	readme, err := os.ReadFile("../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Helm\n")
	if !ok {
		t.Fatal("docs/deployment.md has no ## Helm section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	helpers, err := os.ReadFile(filepath.Join(chartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(filepath.Join(exampleDir, "templates", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`include "(pg-liveness-exporter\.[^"]+)"`).FindAllStringSubmatch(section, -1)
	if len(named) < 5 {
		t.Fatalf("docs/deployment.md's Helm section names %d of the chart's templates, want the five of the sidecar shape", len(named))
	}
	for _, m := range named {
		if !bytes.Contains(helpers, []byte(`define "`+m[1]+`"`)) {
			t.Errorf("docs/deployment.md includes %s, which the chart does not define", m[1])
		}
		if !bytes.Contains(example, []byte(m[0])) {
			t.Errorf("docs/deployment.md includes %s, which %s does not", m[1], exampleDir)
		}
	}
}

// Every chart of the repository passes `helm lint --strict` (warnings are errors) with its
// own values, after `helm dependency build`; and every entry of helm/ is a chart without
// dependencies to build, so that `helm lint --strict deploy/helm/*` works as it is. Only
// the missing icon, an info, is allowed.
func TestEveryChartLintsStrict(t *testing.T) {
	entries, err := os.ReadDir("helm")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		ch, err := loader.Load(filepath.Join("helm", e.Name()))
		if err != nil {
			t.Errorf("helm/%s is not a chart (helm lint --strict deploy/helm/* lints it): %v", e.Name(), err)
			continue
		}
		if len(ch.Metadata.Dependencies) > 0 {
			t.Errorf("helm/%s has dependencies to build before it lints; charts that do belong in examples/", e.Name())
		}
	}
	tmp := copyCharts(t)
	var charts []string
	err = filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "Chart.yaml" {
			charts = append(charts, filepath.Dir(p))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(charts) < 2 {
		t.Fatalf("found %d charts: %v", len(charts), charts)
	}
	for _, dir := range charts {
		rel, _ := filepath.Rel(tmp, dir)
		t.Run(rel, func(t *testing.T) {
			buildDependencies(t, tmp, dir)
			l := lint.All(dir, nil, "default", true)
			for _, m := range l.Messages {
				if m.Severity == support.InfoSev && strings.HasSuffix(m.Error(), "icon is recommended") {
					continue
				}
				t.Errorf("helm lint --strict %s: %s", rel, m.Error())
			}
		})
	}
}

// The chart's README names every top-level value.
func TestChartReadmeNamesEveryValue(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for key := range ch.Values {
		if !bytes.Contains(readme, []byte("`"+key)) {
			t.Errorf("%s/README.md does not name the value %s", chartDir, key)
		}
	}
}
