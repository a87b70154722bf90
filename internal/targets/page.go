package targets

// /targets: the databases an exporter with --config.file answers for, one status page
// each; and the path of a discovered database's page.

import (
	_ "embed"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// Listed is a database that discovery found, as /targets lists it.
type Listed struct {
	Database
	Dropped bool // left out of the last /metrics answer by --discover.max-series
}

//go:embed targets.html
var listHTML string

// listTemplate is parsed at the first request for /targets, as the status page's.
var listTemplate = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("targets").Parse(listHTML))
})

// ListPage serves /targets: main, the database of the exporter's own DSN ("" for none,
// else described without its password), the targets of the configuration in force, and
// what discovered returns: the databases found now and --discover.max-series.
func ListPage(main string, pools *Pools, discovered func() ([]Listed, int)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'none'")
		w.Header().Set("Cache-Control", "no-store")
		type link struct {
			Label, Path string
			Dropped     bool
		}
		var found []link
		dropped := 0
		listed, maxSeries := discovered()
		for _, db := range listed {
			found = append(found, link{Label: db.Label(), Path: db.StatusPath(), Dropped: db.Dropped})
			if db.Dropped {
				dropped++
			}
		}
		_ = listTemplate().Execute(w, struct {
			Main               string
			Targets            []string
			Discovered         []link
			Dropped, MaxSeries int
		}{main, pools.Config().Names(), found, dropped, maxSeries})
	})
}

// StatusPath is the path of the database's status page, /targets/ENTRY/SEGMENT/status:
// SEGMENT is its name path-escaped (a '/' as %2F, a '%' as %25), except that "." and
// "..", which every client and the server's own path cleaning take for the current and
// the parent folder (a browser even when written %2E), and names that start with '~', are
// written with a '~' before them. DatabaseName reads SEGMENT.
func (d Database) StatusPath() string {
	name := d.Name
	if name == "." || name == ".." || strings.HasPrefix(name, "~") {
		name = "~" + name
	}
	return "/targets/" + url.PathEscape(d.Server) + "/" + url.PathEscape(name) + "/status"
}

// DatabaseName is the database name of a status page's path segment (already
// unescaped): one leading '~' is dropped.
func DatabaseName(segment string) string {
	return strings.TrimPrefix(segment, "~")
}
