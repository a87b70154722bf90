// Package deploy holds the deployment artefacts of pg_liveness_exporter and the tests that
// keep them correct: Kubernetes manifests (kubernetes/, a kustomize base, overlays and the
// node agent's component), a Helm chart (helm/pg-liveness-exporter, with the example chart
// examples/checkout for the sidecar shape), systemd units (systemd/, the node agent's among
// them) and the repository's Dockerfile. Its tests also decode
// the Grafana dashboards (../dashboards) strictly into Grafana's own schema types.
//
// It is a module of its own so that the Kubernetes, Prometheus Operator, Helm, Grafana
// Foundation SDK and BuildKit libraries its tests use never reach the exporter's
// dependencies.
//
// The kustomize overlays and the chart are written separately, each in its own idiom,
// and a test renders both and requires the same objects: the Deployment and DaemonSet
// specs (containers, arguments, probes, security contexts, resources, volumes, termination
// grace), the Services, the PodMonitors, the PrometheusRule and the dashboards. What both copy from
// elsewhere is generated: the PrometheusRule and the dashboard ConfigMaps under
// kubernetes/base/monitoring, and the chart's files/, from alerts/pg_liveness.rules.yml
// and dashboards/. Regenerate them with
//
//	cd deploy && go generate ./...
package deploy

//go:generate go run ./internal/genmanifests
