package collector

import "strings"

// labelValue makes s a valid label value: invalid UTF-8 (a SQL_ASCII database hands out
// any bytes) is replaced by U+FFFD. It reports whether it had to. Prometheus refuses a
// metric with an invalid label value, so one such row must not cost the others.
func labelValue(s string) (string, bool) {
	v := strings.ToValidUTF8(s, "\uFFFD")
	return v, v != s
}
