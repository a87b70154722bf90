package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	podpkg "k8s.io/kubernetes/pkg/api/pod"
	"k8s.io/kubernetes/pkg/apis/apps"
	_ "k8s.io/kubernetes/pkg/apis/apps/install"
	appsvalidation "k8s.io/kubernetes/pkg/apis/apps/validation"
	"k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	"k8s.io/kubernetes/pkg/apis/networking"
	_ "k8s.io/kubernetes/pkg/apis/networking/install"
	networkingvalidation "k8s.io/kubernetes/pkg/apis/networking/validation"
	"k8s.io/kubernetes/pkg/apis/policy"
	_ "k8s.io/kubernetes/pkg/apis/policy/install"
	policyvalidation "k8s.io/kubernetes/pkg/apis/policy/validation"
)

// The API server's own validation, run on what the chart renders. Strict decoding into
// the Go types (TestChartRendersStrictlyIntoOfficialTypes) cannot see a probe with two
// handlers, a port name too long, a selector that does not match the pod's labels: the
// API server's validation does. It is Kubernetes' code (k8s.io/kubernetes/pkg/apis/*/
// validation), run as kube-apiserver runs it on a create: the object defaulted in its
// versioned type (legacyscheme, as registered by the API groups' install packages),
// converted to the internal type, validated. That needs the k8s.io/kubernetes module, whose
// go.mod requires its staging modules at v0.0.0, hence deploy/go.mod's replace
// directives, all at the release of k8s.io/api. A real kube-apiserver (with etcd) would
// check the same code, started for seconds per test, with binaries no registry here serves.

// toInternal defaults the versioned object as the API server does and converts it into
// the internal type.
func toInternal(t *testing.T, versioned runtime.Object, internal any) {
	t.Helper()
	legacyscheme.Scheme.Default(versioned)
	if err := legacyscheme.Scheme.Convert(versioned, internal, nil); err != nil {
		t.Fatalf("converting %T: %v", versioned, err)
	}
}

// validateRendered runs the API server's validation of a create on every workload,
// Service, ServiceAccount, ConfigMap, PodDisruptionBudget and NetworkPolicy rendered, and
// reports each error with the object's kind and name; it returns how many objects it
// validated. An object that names no namespace gets namespace's, as `helm install -n`
// gives it.
func validateRendered(t *testing.T, r *rendered, namespace string) int {
	t.Helper()
	for _, o := range r.objects() {
		if m, ok := o.(interface{ SetNamespace(string) }); ok && o.GetNamespace() == "" {
			m.SetNamespace(namespace)
		}
	}
	n := 0
	report := func(kind, name string, errs field.ErrorList) {
		t.Helper()
		n++
		for _, e := range errs {
			t.Errorf("the API server refuses %s %s: %v", kind, name, e)
		}
	}
	for _, d := range r.deployments {
		var in apps.Deployment
		toInternal(t, d.DeepCopy(), &in)
		report("Deployment", d.Name, appsvalidation.ValidateDeployment(&in, podpkg.GetValidationOptionsFromPodTemplate(&in.Spec.Template, nil)))
	}
	for _, d := range r.daemonSets {
		var in apps.DaemonSet
		toInternal(t, d.DeepCopy(), &in)
		report("DaemonSet", d.Name, appsvalidation.ValidateDaemonSet(&in, podpkg.GetValidationOptionsFromPodTemplate(&in.Spec.Template, nil)))
	}
	for _, s := range r.services {
		var in core.Service
		toInternal(t, s.DeepCopy(), &in)
		// The service registry fills clusterIPs from clusterIP before it validates a
		// create (pkg/registry/core/service/storage, normalizeClusterIPs): a headless
		// Service's None.
		if in.Spec.ClusterIP != "" && len(in.Spec.ClusterIPs) == 0 {
			in.Spec.ClusterIPs = []string{in.Spec.ClusterIP}
		}
		report("Service", s.Name, corevalidation.ValidateServiceCreate(&in))
	}
	for _, s := range r.serviceAccounts {
		var in core.ServiceAccount
		toInternal(t, s.DeepCopy(), &in)
		report("ServiceAccount", s.Name, corevalidation.ValidateServiceAccount(&in))
	}
	for _, c := range r.configMaps {
		var in core.ConfigMap
		toInternal(t, c.DeepCopy(), &in)
		report("ConfigMap", c.Name, corevalidation.ValidateConfigMap(&in))
	}
	for _, p := range r.pdbs {
		var in policy.PodDisruptionBudget
		toInternal(t, p.DeepCopy(), &in)
		report("PodDisruptionBudget", p.Name, policyvalidation.ValidatePodDisruptionBudget(&in, policyvalidation.PodDisruptionBudgetValidationOptions{}))
	}
	for _, p := range r.netpols {
		var in networking.NetworkPolicy
		toInternal(t, p.DeepCopy(), &in)
		report("NetworkPolicy", p.Name, networkingvalidation.ValidateNetworkPolicy(&in, networkingvalidation.NetworkPolicyValidationOptions{}))
	}
	return n
}

// Every row of the chart's values matrix renders objects the API server accepts.
func TestChartPassesTheAPIServersValidation(t *testing.T) {
	example := buildExample(t)
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			r, err := c.render(t, example, c.chartValues(t))
			if err != nil {
				t.Fatal(err)
			}
			_, namespace := c.release()
			if n := validateRendered(t, r.rendered, namespace); n == 0 && r.objectsTotal > 0 {
				t.Errorf("rendered %d objects, validated none", r.objectsTotal)
			}
		})
	}
}

// readmeValuesRecipes are the values recipes of the chart's README, by the heading of
// their section: every ```yaml block but the example pod (podSnippetMarker), each a
// block a user copies into a values file. A section holds one at most.
func readmeValuesRecipes(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	section := ""
	md := string(b)
	for len(md) > 0 {
		line, rest, _ := strings.Cut(md, "\n")
		md = rest
		if h, ok := strings.CutPrefix(line, "## "); ok {
			section = h
			continue
		}
		if line != "```yaml" {
			continue
		}
		block, rest, ok := strings.Cut(md, "```")
		if !ok {
			t.Fatalf("README.md, %s: a ```yaml block does not end", section)
		}
		md = rest
		if strings.HasPrefix(block, podSnippetMarker) { // a pod of the user's, not values
			continue
		}
		if out[section] != "" {
			t.Fatalf("README.md, %s: two values recipes in one section", section)
		}
		out[section] = block
	}
	return out
}

// Each values recipe of the chart's README, as it is written there, renders objects the
// API server accepts, for each part of the chart that takes it: the TLS and basic-auth
// probes for the observer, and, as the README says they take the same settings, for the
// agent (sidecar) and the node agent. The probes' handler is the recipe's alone.
func TestChartReadmeRecipesPassTheAPIServersValidation(t *testing.T) {
	recipes := readmeValuesRecipes(t)
	if len(recipes) == 0 {
		t.Fatal("the chart's README has no values recipe")
	}
	example := buildExample(t)
	for section, recipe := range recipes {
		values, err := chartutil.ReadValues([]byte(recipe))
		if err != nil {
			t.Fatalf("README.md, %s: %v\n%s", section, err, recipe)
		}
		for _, c := range readmeRecipeUses(t, values.AsMap()) {
			t.Run(section+"/"+c.name, func(t *testing.T) {
				r, err := c.render(t, example, c.chartValues(t))
				if err != nil {
					t.Fatal(err)
				}
				_, namespace := c.release()
				if n := validateRendered(t, r.rendered, namespace); n == 0 {
					t.Fatal("nothing rendered to validate")
				}
				for _, pod := range podSpecs(r.rendered) {
					for _, ctr := range pod.Containers {
						for _, p := range []*corev1.Probe{ctr.LivenessProbe, ctr.ReadinessProbe} {
							if p != nil && p.HTTPGet != nil && (p.TCPSocket != nil || p.Exec != nil || p.GRPC != nil) {
								t.Errorf("container %s: a probe with the recipe's handler and the default httpGet: %+v", ctr.Name, p.ProbeHandler)
							}
						}
					}
				}
			})
		}
	}
}

// readmeRecipeUses turns a README recipe written for the observer into the matrix rows
// that use it: as it is, and, when it sets observer probes, the same probes for the
// agents (the example chart, port pg-liveness) and the node agents (port metrics).
func readmeRecipeUses(t *testing.T, values map[string]any) []chartCase {
	t.Helper()
	observerYAML := yamlOf(t, values)
	uses := []chartCase{{name: "observer", values: observerYAML}}
	o, _ := values["observer"].(map[string]any)
	if o == nil || o["livenessProbe"] == nil {
		return uses
	}
	probes := map[string]any{"livenessProbe": o["livenessProbe"], "readinessProbe": o["readinessProbe"]}
	agent := deepCopy(map[string]any{"agent": probes})
	for _, k := range []string{"livenessProbe", "readinessProbe"} {
		setProbePort(agent["agent"].(map[string]any)[k], "pg-liveness")
	}
	node := deepCopy(map[string]any{"nodeAgent": probes})
	node["nodeAgent"].(map[string]any)["enabled"] = true
	return append(uses,
		chartCase{name: "agent", sidecar: true, values: yamlOf(t, agent)},
		chartCase{name: "node agent", values: yamlOf(t, node)})
}

// setProbePort points a probe's handler at the named port.
func setProbePort(probe any, port string) {
	p, _ := probe.(map[string]any)
	for _, h := range []string{"tcpSocket", "httpGet", "grpc"} {
		if m, ok := p[h].(map[string]any); ok {
			m["port"] = port
		}
	}
}

// podSpecs are the pod specs of the rendered workloads.
func podSpecs(r *rendered) []corev1.PodSpec {
	var out []corev1.PodSpec
	for _, d := range r.deployments {
		out = append(out, d.Spec.Template.Spec)
	}
	for _, d := range r.daemonSets {
		out = append(out, d.Spec.Template.Spec)
	}
	return out
}

// The validation sees what strict decoding cannot: a probe with two handlers (what the
// chart rendered before a recipe's tcpSocket replaced the default httpGet), and a
// selector its pod's labels do not match.
func TestAPIServerValidationCatchesWhatDecodingCannot(t *testing.T) {
	r := render(t, "kubernetes/overlays/observer")
	if len(r.deployments) != 1 {
		t.Fatalf("%d Deployments, want 1", len(r.deployments))
	}
	twoHandlers := r.deployments[0].DeepCopy()
	c := &twoHandlers.Spec.Template.Spec.Containers[0]
	c.LivenessProbe.TCPSocket = &corev1.TCPSocketAction{Port: c.LivenessProbe.HTTPGet.Port}
	badSelector := r.deployments[0].DeepCopy()
	badSelector.Spec.Selector.MatchLabels = map[string]string{"app.kubernetes.io/name": "someone-else"}
	for _, c := range []struct {
		name string
		d    *appsv1.Deployment
		want string
	}{
		{"two handlers", twoHandlers, "may not specify more than 1 handler type"},
		{"selector", badSelector, "`selector` does not match template `labels`"},
	} {
		var in apps.Deployment
		toInternal(t, c.d, &in)
		errs := appsvalidation.ValidateDeployment(&in, podpkg.GetValidationOptionsFromPodTemplate(&in.Spec.Template, nil))
		if !strings.Contains(errs.ToAggregate().Error(), c.want) {
			t.Errorf("%s: validation says %v; want %q", c.name, errs, c.want)
		}
	}
}
