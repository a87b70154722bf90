package targets

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A discovered database's page path, served by the pattern the binary registers, gives
// back its entry and its name, whatever the name: a '/', a '%', '?' and '#', the current
// and the parent folder (which clients and the server's path cleaning would otherwise
// take as such), and the '~' that marks them.
func TestStatusPathGivesBackTheDatabase(t *testing.T) {
	for _, name := range []string{"plain", "with/slash", ".", "..", "100%", "a?b#c", "~tilde", "~.", "~~", "a b"} {
		db := Database{Server: "s 1/x", Name: name}
		var got Database
		mux := http.NewServeMux()
		mux.HandleFunc("/targets/{entry}/{database}/status", func(w http.ResponseWriter, r *http.Request) {
			got = Database{Server: r.PathValue("entry"), Name: DatabaseName(r.PathValue("database"))}
		})
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, db.StatusPath(), nil))
		if rec.Code != http.StatusOK || got != db {
			t.Errorf("%q: %s answered %d for %+v, want 200 for %+v", name, db.StatusPath(), rec.Code, got, db)
		}
	}
}

// /targets lists the exporter's own database, each target with its page and its /probe,
// and each discovered database with its page, those over --discover.max-series marked
// and counted; names are escaped.
func TestListPage(t *testing.T) {
	cfg := &Config{targets: map[string]Target{"b": {Name: "b"}, "a<": {Name: "a<"}}}
	pools, err := NewPools(cfg, Options{MaxConns: 4, MaxConnsPerTarget: 2, IdleTimeout: time.Minute, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pools.Close()
	discovered := []Listed{{Database: Database{"s1", "orders"}}, {Database: Database{"s1", ".."}, Dropped: true}}
	get := func(main string, found []Listed) (*httptest.ResponseRecorder, string) {
		rec := httptest.NewRecorder()
		ListPage(main, pools, func() ([]Listed, int) { return found, 1234 }).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/targets", nil))
		body, _ := io.ReadAll(rec.Body)
		return rec, string(body)
	}
	rec, body := get("host=db user=u", discovered)
	if ct, csp := rec.Header().Get("Content-Type"), rec.Header().Get("Content-Security-Policy"); ct != "text/html; charset=utf-8" || csp != "default-src 'none'" {
		t.Errorf("Content-Type %q, Content-Security-Policy %q", ct, csp)
	}
	for _, want := range []string{
		`<p><a href="/status">host=db user=u</a> (this exporter's own, on <code>/metrics</code>)</p>`,
		`<li><a href="/targets/a%3c/status">a&lt;</a> (<a href="/probe?target=a%3c">metrics</a>)</li><li><a href="/targets/b/status">b</a>`,
		`<li><a href="/targets/s1/orders/status">s1/orders</a></li>`,
		`<li><a href="/targets/s1/~../status">s1/..</a> (series dropped: over <code>--discover.max-series</code>)</li>`,
		`<strong>1 of them over <code>--discover.max-series</code> (1234)</strong>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/targets lacks %s:\n%s", want, body)
		}
	}
	_, body = get("", nil)
	if strings.Contains(body, `href="/status"`) || strings.Contains(body, "discover entries") {
		t.Errorf("/targets without a database of its own or discovered ones:\n%s", body)
	}
}
