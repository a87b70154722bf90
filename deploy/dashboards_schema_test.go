//lint:file-ignore SA1019 The dashboards are classic JSON-model dashboards, which the Grafana sidecar provisions and Import takes; dashboardv2, which the SDK prefers, is the different format of Grafana's v2 dashboard resource.

package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
)

// The dashboards are checked against Grafana's own schema, as the Grafana Foundation SDK
// generates it into Go types. Grafana cannot run here, so this is as close to "Grafana
// accepts it" as a test gets: a field the schema does not have, a value of the wrong type
// or a required field that is missing is an error. The test lives in this module so that
// the SDK never becomes a requirement of the exporter's go.mod.

var registerGrafanaPlugins = sync.OnceFunc(plugins.RegisterDefaultPlugins)

// strictErr turns the SDK's empty error list (a typed nil that the strict decoders return
// when all is well) into nil.
func strictErr(err error) error {
	var be cog.BuildErrors
	if errors.As(err, &be) && len(be) == 0 {
		return nil
	}
	return err
}

// decodeDashboardStrict decodes a dashboard with dashboard.Dashboard.UnmarshalJSONStrict
// and closes the gaps that leaves:
//   - a panel's options and fieldConfig.defaults.custom are decoded strictly only when
//     the panel's type is a plugin the SDK knows; otherwise they land in an untyped map,
//     so an unknown panel type is an error here;
//   - a target is decoded strictly only when its data source type is known; otherwise it
//     lands in an untyped bag, so every target must decode into prometheus.Dataquery;
//   - the SDK reads a panel's fieldConfig with plain encoding/json, which ignores unknown
//     fields, so it is decoded again with dashboard.FieldConfigSource.UnmarshalJSONStrict.
//
// grafana.com's import header (__inputs, __requires) is no field of the dashboard's model:
// Grafana reads it on import and drops it, and so does this check, after checking that it
// is a list of objects each.
func decodeDashboardStrict(b []byte) (*dashboard.Dashboard, error) {
	registerGrafanaPlugins()
	b, err := withoutImportHeader(b)
	if err != nil {
		return nil, err
	}
	var d dashboard.Dashboard
	if err := strictErr(d.UnmarshalJSONStrict(b)); err != nil {
		return nil, err
	}
	var raw struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, err
	}
	var errs []error
	for i, p := range raw.Panels {
		errs = append(errs, checkPanel("panels["+strconv.Itoa(i)+"]", p)...)
	}
	return &d, errors.Join(errs...)
}

// withoutImportHeader returns the dashboard without __inputs and __requires, which must
// be there (grafana.com imports a dashboard by them) as lists of objects.
func withoutImportHeader(b []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, err
	}
	for _, k := range []string{"__inputs", "__requires"} {
		var list []map[string]any
		if err := json.Unmarshal(top[k], &list); err != nil || len(list) == 0 {
			return nil, fmt.Errorf("%s: want a list of objects, for grafana.com's import (%v)", k, err)
		}
		delete(top, k)
	}
	return json.Marshal(top)
}

func checkPanel(path string, raw json.RawMessage) []error {
	var p struct {
		Type        string            `json:"type"`
		FieldConfig json.RawMessage   `json:"fieldConfig"`
		Panels      []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return []error{fmt.Errorf("%s: %w", path, err)}
	}
	var errs []error
	if p.Type == "row" {
		var row dashboard.RowPanel
		if err := strictErr(row.UnmarshalJSONStrict(raw)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
		for i, c := range p.Panels {
			errs = append(errs, checkPanel(path+".panels["+strconv.Itoa(i)+"]", c)...)
		}
		return errs
	}
	cfg, known := cog.ConfigForPanelcfgVariant(p.Type)
	if !known || cfg.StrictOptionsUnmarshaler == nil {
		errs = append(errs, fmt.Errorf("%s: panel type %q is not a panel plugin known to Grafana's schema, so its options cannot be checked", path, p.Type))
	}
	var panel dashboard.Panel
	if err := strictErr(panel.UnmarshalJSONStrict(raw)); err != nil {
		// Already reported by the dashboard; here only the panel's own type matters.
		return append(errs, fmt.Errorf("%s: %w", path, err))
	}
	for i, t := range panel.Targets {
		if _, ok := t.(*prometheus.Dataquery); !ok {
			errs = append(errs, fmt.Errorf("%s.targets[%d]: decoded as %T, not as a Prometheus query: set its datasource type to prometheus", path, i, t))
		}
	}
	if p.FieldConfig != nil {
		var fc dashboard.FieldConfigSource
		if err := strictErr(fc.UnmarshalJSONStrict(p.FieldConfig)); err != nil {
			errs = append(errs, fmt.Errorf("%s.fieldConfig: %w", path, err))
		}
		// Panel plugins without custom field options (stat, for one) have no strict
		// decoder for them: anything there would go unchecked.
		var custom struct {
			Defaults struct {
				Custom json.RawMessage `json:"custom"`
			} `json:"defaults"`
		}
		if json.Unmarshal(p.FieldConfig, &custom) == nil && custom.Defaults.Custom != nil && known && cfg.StrictFieldConfigUnmarshaler == nil {
			errs = append(errs, fmt.Errorf("%s.fieldConfig.defaults.custom: panel type %q has no custom field options", path, p.Type))
		}
	}
	return errs
}

func dashboardFiles(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("../dashboards/*.json")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no dashboards in ../dashboards: %v", err)
	}
	return paths
}

func TestDashboardsDecodeStrictlyIntoGrafanaTypes(t *testing.T) {
	for _, path := range dashboardFiles(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			d, err := decodeDashboardStrict(b)
			if err != nil {
				t.Fatalf("%s does not match Grafana's dashboard schema:\n%v", path, err)
			}
			if d.Uid == nil || d.Title == nil || len(d.Panels) == 0 {
				t.Errorf("%s: decoded without uid, title or panels", path)
			}
		})
	}
}

// The check above must fail on each kind of mistake; each case breaks a copy of a real
// dashboard in one place and expects an error that names that place.
func TestDashboardSchemaCheckRejectsMistakes(t *testing.T) {
	src, err := os.ReadFile(dashboardFiles(t)[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeDashboardStrict(src); err != nil {
		t.Fatalf("the unbroken dashboard must decode: %v", err)
	}
	panelOfType := func(d map[string]any, typ string) map[string]any {
		for _, p := range d["panels"].([]any) {
			if p := p.(map[string]any); p["type"] == typ {
				return p
			}
		}
		t.Fatalf("no %s panel outside a row", typ)
		return nil
	}
	firstPanel := func(d map[string]any) map[string]any { return panelOfType(d, "stat") }
	for _, tc := range []struct {
		name   string
		mutate func(d map[string]any)
		want   string
	}{
		{"unknown dashboard field", func(d map[string]any) { d["refreshInterval"] = "30s" }, "refreshInterval"},
		{"no import inputs", func(d map[string]any) { delete(d, "__inputs") }, "__inputs"},
		{"import requirements not a list", func(d map[string]any) { d["__requires"] = "grafana" }, "__requires"},
		{"wrong type", func(d map[string]any) { d["title"] = 1 }, "title"},
		{"missing required field", func(d map[string]any) { delete(d, "schemaVersion") }, "schemaVersion"},
		{"unknown panel field", func(d map[string]any) { firstPanel(d)["descripton"] = "x" }, "descripton"},
		{"unknown option", func(d map[string]any) { firstPanel(d)["options"].(map[string]any)["colourMode"] = "value" }, "colourMode"},
		{"unknown fieldConfig default", func(d map[string]any) {
			firstPanel(d)["fieldConfig"].(map[string]any)["defaults"].(map[string]any)["units"] = "s"
		}, "units"},
		{"wrong type in a target", func(d map[string]any) {
			firstPanel(d)["targets"].([]any)[0].(map[string]any)["expr"] = 1
		}, "expr"},
		{"unknown target field", func(d map[string]any) {
			firstPanel(d)["targets"].([]any)[0].(map[string]any)["expression"] = "up"
		}, "expression"},
		{"query of another data source", func(d map[string]any) {
			p := firstPanel(d)
			p["datasource"].(map[string]any)["type"] = "graphite"
			p["targets"].([]any)[0].(map[string]any)["datasource"].(map[string]any)["type"] = "graphite"
		}, "not as a Prometheus query"},
		{"unknown panel type", func(d map[string]any) { firstPanel(d)["type"] = "graph-ng" }, "graph-ng"},
		{"unknown custom field option", func(d map[string]any) {
			panelOfType(d, "timeseries")["fieldConfig"].(map[string]any)["defaults"].(map[string]any)["custom"].(map[string]any)["lineWidht"] = 2
		}, "lineWidht"},
		{"custom field options on a panel type without them", func(d map[string]any) {
			firstPanel(d)["fieldConfig"].(map[string]any)["defaults"].(map[string]any)["custom"] = map[string]any{"lineWidth": 1}
		}, "has no custom field options"},
		{"unknown variable field", func(d map[string]any) {
			d["templating"].(map[string]any)["list"].([]any)[0].(map[string]any)["multiValue"] = true
		}, "multiValue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d map[string]any
			if err := json.Unmarshal(src, &d); err != nil {
				t.Fatal(err)
			}
			tc.mutate(d)
			b, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			_, err = decodeDashboardStrict(b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
