package status

import (
	"html/template"
	"net/url"
	"strconv"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// view is the Page with what only the HTML form needs: capped lists, links and the
// page's own style and script.
type view struct {
	Page
	CSS            template.CSS
	JS             template.JS
	Refresh        int // seconds; 0: never
	States         []string
	ShownServices  []ServiceView
	HiddenServices int
	ShownApps      []AppView
	HiddenApps     int
	Filtered       bool // instances are filtered by service or instance

	InstancesFrom, InstancesTo   int
	InstancesPrev, InstancesNext string
	LeasesFrom, LeasesTo         int
	LeasesPrev, LeasesNext       string
	JSONLink, AllLink            string

	HistoryHTML *historyHTML // nil when there is no history to show

	q      query
	onPage map[string]bool
}

func newView(p Page, q query) view {
	v := view{Page: p, CSS: template.CSS(pageCSS), JS: template.JS(pageJS), Refresh: int(q.refresh / time.Second), q: q,
		onPage: map[string]bool{}, Filtered: q.service != "" || p.Instances.InstanceID != ""}
	v.States = store.InstanceStates()
	v.ShownServices = p.Services
	if len(v.ShownServices) > maxServicesShown {
		v.ShownServices, v.HiddenServices = v.ShownServices[:maxServicesShown], len(p.Services)-maxServicesShown
	}
	if p.AdvisoryLocks != nil {
		v.ShownApps = p.AdvisoryLocks.Applications
		if len(v.ShownApps) > maxAppsShown {
			v.ShownApps, v.HiddenApps = v.ShownApps[:maxAppsShown], len(p.AdvisoryLocks.Applications)-maxAppsShown
		}
	}
	for _, i := range p.Instances.Rows {
		v.onPage[i.InstanceID] = true
	}
	v.InstancesFrom, v.InstancesTo = pageRange(q.page, InstancesPerPage, len(p.Instances.Rows))
	if q.page > 1 {
		v.InstancesPrev = v.link("page", strconv.Itoa(q.page-1))
	}
	if v.InstancesTo < p.Instances.Total {
		v.InstancesNext = v.link("page", strconv.Itoa(q.page+1))
	}
	v.LeasesFrom, v.LeasesTo = pageRange(q.leasePage, LeasesPerPage, len(p.Leases.Rows))
	if q.leasePage > 1 {
		v.LeasesPrev = v.link("lease_page", strconv.Itoa(q.leasePage-1))
	}
	if v.LeasesTo < p.Leases.Total {
		v.LeasesNext = v.link("lease_page", strconv.Itoa(q.leasePage+1))
	}
	if p.History != nil && p.History.Available {
		v.HistoryHTML = newHistoryHTML(p.History, v)
	}
	v.JSONLink = "status.json" + v.link()
	v.AllLink = v.link("service", "", "instance", "", "page", "")
	return v
}

func pageRange(page, size, rows int) (from, to int) {
	if rows == 0 {
		return 0, 0
	}
	from = (page-1)*size + 1
	return from, from + rows - 1
}

// link is the page's own query with the given name/value pairs changed ("" removes one).
func (v view) link(kv ...string) string {
	q := url.Values{}
	set := func(k, val string) {
		if val == "" {
			q.Del(k)
		} else {
			q.Set(k, val)
		}
	}
	set("service", v.q.service)
	set("lease", v.q.lease)
	if v.Page.Instances.InstanceID != "" {
		set("instance", v.Page.Instances.InstanceID)
	}
	if v.q.page > 1 {
		set("page", strconv.Itoa(v.q.page))
	}
	if v.q.leasePage > 1 {
		set("lease_page", strconv.Itoa(v.q.leasePage))
	}
	if v.q.refresh != DefaultRefresh {
		set("refresh", strconv.Itoa(int(v.q.refresh/time.Second)))
	}
	if v.q.history != DefaultHistoryWindow {
		set("history", windowText(v.q.history))
	}
	if v.q.historyPage > 1 {
		set("history_page", strconv.Itoa(v.q.historyPage))
	}
	for i := 0; i+1 < len(kv); i += 2 {
		set(kv[i], kv[i+1])
	}
	if len(q) == 0 {
		return "?"
	}
	return "?" + q.Encode()
}

// InstanceLink points at an instance's row: on this page, or on a page of its own.
func (v view) InstanceLink(id string) string {
	if v.onPage[id] {
		return "#i-" + id
	}
	return v.link("instance", id, "service", "", "page", "") + "#i-" + id
}

// ServiceLink shows one service's instances.
func (v view) ServiceLink(name string) string {
	return v.link("service", name, "instance", "", "page", "")
}
