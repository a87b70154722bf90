// Package manifests generates the deployment files that are copies of other files in
// the repository: for kustomize, the PrometheusRule from alerts/pg_liveness.rules.yml and
// one ConfigMap per Grafana dashboard in dashboards/; for the Helm chart, copies of the
// rules file and the dashboards under its files/, which its templates read (a chart
// cannot read files outside its directory). The output is committed; a test regenerates
// it and fails when it differs.
package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Dir is where the generated kustomize files go, relative to the repository root.
const Dir = "deploy/kubernetes/base/monitoring"

// ChartDir is the Helm chart, relative to the repository root; ChartFilesDir holds the
// copies its templates read.
const (
	ChartDir      = "deploy/helm/pg-liveness-exporter"
	ChartFilesDir = ChartDir + "/files"
)

// GeneratedDirs are the directories whose files are all generated: a file there that
// Generate does not return is stale.
var GeneratedDirs = []string{Dir, ChartFilesDir, ChartFilesDir + "/dashboards"}

// RegenerateCommand is what to run after changing a source.
const RegenerateCommand = "cd deploy && go generate ./..."

// DashboardLabel marks the ConfigMaps that the Grafana sidecar (the k8s-sidecar of the
// Grafana and kube-prometheus-stack charts) loads as dashboards.
const DashboardLabel = "grafana_dashboard"

const (
	rulesFile     = "alerts/pg_liveness.rules.yml"
	dashboardsDir = "dashboards"
)

func header(source string) string {
	return "# Generated from " + source + " by `" + RegenerateCommand + "`. Do not edit.\n"
}

var commonLabels = map[string]string{"app.kubernetes.io/name": "pg-liveness-exporter"}

// Generate returns the generated files by path relative to the repository root.
func Generate(root string) (map[string][]byte, error) {
	out := map[string][]byte{}
	rule, err := prometheusRule(root)
	if err != nil {
		return nil, err
	}
	out[filepath.Join(Dir, "prometheusrule.yaml")] = rule
	resources := []string{"prometheusrule.yaml"}
	rules, err := os.ReadFile(filepath.Join(root, rulesFile))
	if err != nil {
		return nil, err
	}
	out[filepath.Join(ChartFilesDir, filepath.Base(rulesFile))] = append([]byte(header(rulesFile)), rules...)

	paths, err := filepath.Glob(filepath.Join(root, dashboardsDir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no dashboards in %s", filepath.Join(root, dashboardsDir))
	}
	sort.Strings(paths)
	for _, p := range paths {
		name := strings.TrimSuffix(filepath.Base(p), ".json")
		b, err := dashboardConfigMap(root, name)
		if err != nil {
			return nil, err
		}
		file := "dashboard-" + name + ".yaml"
		out[filepath.Join(Dir, file)] = b
		resources = append(resources, file)
		// JSON has no comments for a header; the staleness test guards the copy.
		if out[filepath.Join(ChartFilesDir, "dashboards", name+".json")], err = os.ReadFile(p); err != nil {
			return nil, err
		}
	}

	var k bytes.Buffer
	k.WriteString(header(rulesFile + " and " + dashboardsDir + "/"))
	k.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n")
	for _, r := range resources {
		k.WriteString("  - " + r + "\n")
	}
	out[filepath.Join(Dir, "kustomization.yaml")] = k.Bytes()
	return out, nil
}

func prometheusRule(root string) ([]byte, error) {
	src, err := os.ReadFile(filepath.Join(root, rulesFile))
	if err != nil {
		return nil, err
	}
	var spec monitoringv1.PrometheusRuleSpec
	if err := DecodeStrict(src, &spec); err != nil {
		return nil, fmt.Errorf("%s: %w", rulesFile, err)
	}
	if len(spec.Groups) == 0 {
		return nil, fmt.Errorf("%s: no rule groups", rulesFile)
	}
	obj := monitoringv1.PrometheusRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "monitoring.coreos.com/v1", Kind: "PrometheusRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "pg-liveness-exporter", Labels: commonLabels},
		Spec:       spec,
	}
	return marshal(rulesFile, obj)
}

// DecodeStrict decodes YAML into v as the Kubernetes API server does in strict mode:
// field names match case-sensitively, and unknown or duplicate fields are errors.
func DecodeStrict(y []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(y)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

func dashboardConfigMap(root, name string) ([]byte, error) {
	source := dashboardsDir + "/" + name + ".json"
	b, err := os.ReadFile(filepath.Join(root, source))
	if err != nil {
		return nil, err
	}
	labels := map[string]string{DashboardLabel: "1"}
	for k, v := range commonLabels {
		labels[k] = v
	}
	obj := corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "pg-liveness-dashboard-" + name, Labels: labels},
		Data:       map[string]string{"pg-liveness-" + name + ".json": string(b)},
	}
	return marshal(source, obj)
}

func marshal(source string, obj any) ([]byte, error) {
	b, err := yaml.Marshal(obj)
	if err != nil {
		return nil, err
	}
	// Typed objects marshal an empty creationTimestamp; it is not part of a manifest.
	b = bytes.Replace(b, []byte("  creationTimestamp: null\n"), nil, 1)
	return append([]byte(header(source)), b...), nil
}
