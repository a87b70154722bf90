package fleetsim

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logtest"
)

// The fleet's logger and each instance's remove passwords from every line, whatever
// logger the caller gave. Nothing connects: the pool is lazy and its server is not there.
func TestLoggersRemovePasswords(t *testing.T) {
	var buf bytes.Buffer
	cfg := DefaultConfig()
	cfg.DSN, cfg.Logger = "host=127.0.0.1 port=1 user=u password="+logtest.Password+" dbname=d",
		slog.New(slog.NewTextHandler(&buf, nil))
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	f := &Fleet{cfg: cfg}
	inst, err := f.newInstance(0, "host")
	if err != nil {
		t.Fatal(err)
	}
	defer inst.close()
	for name, l := range map[string]*slog.Logger{"fleet": f.cfg.Logger, "instance": inst.log} {
		buf.Reset()
		logtest.LogPasswords(l)
		if leak, problem := logtest.Leak(buf.String()); leak != "" || problem != "" {
			t.Errorf("%s: leaked %q (%s):\n%s", name, leak, problem, buf.String())
		}
	}
}
