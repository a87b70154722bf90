// Package alerts ships the Prometheus alerting rules for pg_liveness_exporter.
//
// The rules live in pg_liveness.rules.yml, which users load into Prometheus as is. Their
// runbooks are in docs/runbooks.md. Their tests are in the tools module (tools/alerts):
// they run the real promtool and Prometheus against the rules, so a broken rule fails
// "make test".
package alerts

import _ "embed"

// Rules is the content of pg_liveness.rules.yml.
//
//go:embed pg_liveness.rules.yml
var Rules []byte
