package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	psapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// The Pod Security admission's own code (k8s.io/pod-security-admission, as kube-apiserver
// runs it for a namespace labelled pod-security.kubernetes.io/enforce) judges every pod
// the chart and the kustomizations render, and the pods the docs show, at the level
// restricted of the latest version: each must be allowed.

// restrictedEvaluator is the admission's evaluator with its default checks.
func restrictedEvaluator(t *testing.T) policy.Evaluator {
	t.Helper()
	e, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// restricted evaluates a pod at restricted, latest; it returns what the admission would
// refuse it for ("" when allowed).
func restricted(e policy.Evaluator, pod corev1.PodTemplateSpec) string {
	lv := psapi.LevelVersion{Level: psapi.LevelRestricted, Version: psapi.LatestVersion()}
	r := policy.AggregateCheckResults(e.EvaluatePod(lv, &pod.ObjectMeta, &pod.Spec))
	if r.Allowed {
		return ""
	}
	return r.ForbiddenDetail()
}

// checkRestricted fails the test for each pod of r that restricted refuses, and when r
// renders no pod.
func checkRestricted(t *testing.T, e policy.Evaluator, r *rendered) {
	t.Helper()
	ws := r.workloads()
	if len(ws) == 0 {
		t.Fatal("no pod rendered to evaluate")
	}
	for _, w := range ws {
		if why := restricted(e, w.template); why != "" {
			t.Errorf("%s %s violates the restricted Pod Security Standard: %s", w.kind, w.name, why)
		}
	}
}

// Every kustomization renders pods that the restricted Pod Security Standard allows, and
// every overlay's namespace enforces it.
func TestPodSecurityRestrictedKustomizations(t *testing.T) {
	e := restrictedEvaluator(t)
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			checkRestricted(t, e, r)
			for _, ns := range r.namespaces {
				if l := ns.Labels[psapi.EnforceLevelLabel]; l != string(psapi.LevelRestricted) {
					t.Errorf("namespace %s enforces %q; want restricted", ns.Name, l)
				}
			}
		})
	}
}

// Every row of the chart's values matrix renders pods the restricted standard allows.
func TestPodSecurityRestrictedChart(t *testing.T) {
	e := restrictedEvaluator(t)
	example := buildExample(t)
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			r, err := c.render(t, example, c.chartValues(t))
			if err != nil {
				t.Fatal(err)
			}
			if r.objectsTotal == 0 { // "nothing enabled": no pod to judge
				return
			}
			checkRestricted(t, e, r.rendered)
		})
	}
}

// Every values recipe of the chart's README, for each part that takes it, renders pods
// the restricted standard allows.
func TestPodSecurityRestrictedChartReadmeRecipes(t *testing.T) {
	e := restrictedEvaluator(t)
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
				checkRestricted(t, e, r.rendered)
			})
		}
	}
}

// The pod that docs/deployment.md and the chart's README show attaching to its node's
// agent is allowed by the restricted standard.
func TestPodSecurityRestrictedDocsPods(t *testing.T) {
	e := restrictedEvaluator(t)
	for _, doc := range []string{"../docs/deployment.md", filepath.Join(chartDir, "README.md")} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if why := restricted(e, readmePodSnippet(t, string(b))); why != "" {
			t.Errorf("%s: the pod that attaches violates the restricted Pod Security Standard: %s", doc, why)
		}
	}
}

// The evaluation refuses what the node agent's DaemonSet used to be (user 0, a hostPath
// for its socket), and each thing restricted forbids on its own: it can fail.
func TestPodSecurityCatchesWhatRestrictedForbids(t *testing.T) {
	e := restrictedEvaluator(t)
	r := render(t, "kubernetes/overlays/node-agent")
	if len(r.daemonSets) != 1 {
		t.Fatalf("%d DaemonSets, want 1", len(r.daemonSets))
	}
	base := r.daemonSets[0].Spec.Template
	if why := restricted(e, base); why != "" {
		t.Fatalf("the node agent's pod is refused as it is: %s", why)
	}
	for _, c := range []struct {
		name   string
		change func(p *corev1.PodTemplateSpec)
		want   string
	}{
		{"the old socket's hostPath and user 0", func(p *corev1.PodTemplateSpec) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "socket", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/run/pg-liveness"}}})
			p.Spec.SecurityContext.RunAsNonRoot, p.Spec.SecurityContext.RunAsUser = nil, new(int64(0))
			p.Spec.Containers[0].SecurityContext.RunAsNonRoot = nil
		}, `restricted volume type "hostPath"`},
		{"a host port", func(p *corev1.PodTemplateSpec) { p.Spec.Containers[0].Ports[1].HostPort = 9817 }, "hostPort"},
		{"the host's network", func(p *corev1.PodTemplateSpec) { p.Spec.HostNetwork = true }, "host namespaces"},
		{"privilege escalation", func(p *corev1.PodTemplateSpec) {
			p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
		}, "allowPrivilegeEscalation"},
		{"capabilities kept", func(p *corev1.PodTemplateSpec) { p.Spec.Containers[0].SecurityContext.Capabilities = nil }, "capabilities"},
		{"no seccomp profile", func(p *corev1.PodTemplateSpec) { p.Spec.SecurityContext.SeccompProfile = nil }, "seccompProfile"},
		{"root", func(p *corev1.PodTemplateSpec) { p.Spec.SecurityContext.RunAsUser = new(int64(0)) }, "runAsUser=0"},
	} {
		p := *base.DeepCopy()
		c.change(&p)
		if why := restricted(e, p); !strings.Contains(why, c.want) {
			t.Errorf("%s: the evaluation says %q; want a refusal naming %q", c.name, why, c.want)
		}
	}
}
