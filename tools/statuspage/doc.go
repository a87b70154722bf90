// Package statuspage tests the exporter's status page as Chromium renders it, served by
// the real binary (built from the root module) under TLS and basic auth against a real
// PostgreSQL. It holds no code of its own; it lives in the tools module because chromedp
// must not reach the exporter's dependencies.
package statuspage
