// Package dashboards tests the Grafana dashboards the exporter ships (dashboards/*.json in
// the root module, read from there by relative path): their uids, data source and
// template variables, and every query, parsed with Prometheus' own parser, selecting only
// metrics the exporter exposes, filtered by job and instance; their titles, which ask the
// question each panel answers; their thresholds, which must be the numbers of the alerts
// in alerts/pg_liveness.rules.yml whose runbooks they link to; and their links, which
// must open a shipped dashboard or a heading of docs/runbooks.md. It holds no code of its own;
// it lives in the tools module because the Prometheus parser must not reach the
// exporter's dependencies.
package dashboards
