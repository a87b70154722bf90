// Package alerts tests the alert rules the exporter ships (alerts/pg_liveness.rules.yml in
// the root module, read from there by relative path): promtool's checks and unit tests,
// each rule's conventions (labels, annotations, runbook, metric names the exporter
// exposes, parsed with Prometheus' own parser), that the unit tests catch a broken rule,
// and an end-to-end run of the real exporter, Prometheus and Alertmanager against a real
// PostgreSQL. It holds no code of its own; it lives in the tools module because the
// Prometheus parser must not reach the exporter's dependencies.
package alerts
