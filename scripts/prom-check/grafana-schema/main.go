// grafana-schema checks Grafana dashboard JSON files against the dashboard schema the Grafana foundation SDK
// (github.com/grafana/grafana-foundation-sdk, Apache-2.0; Go types generated from Grafana's own schemas)
// publishes: strict decoding (an unknown or mistyped field in the dashboard, a panel's options or field config,
// a variable, a Prometheus query is an error) and the SDK's Validate(). Grafana itself (AGPL) is not used.
//
//	grafana-schema FILE.json...
package main

import (
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: grafana-schema FILE.json...")
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins() // panel options and data queries by panel type and data source type
	bad := false
	for _, path := range os.Args[1:] {
		raw, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		var d dashboard.Dashboard
		if err := noErrors(d.UnmarshalJSONStrict(raw)); err != nil {
			fmt.Fprintf(os.Stderr, "%s: not a dashboard of the SDK's schema:\n%v\n", path, err)
			bad = true
			continue
		}
		if err := noErrors(d.Validate()); err != nil {
			fmt.Fprintf(os.Stderr, "%s: refused by the SDK's Validate:\n%v\n", path, err)
			bad = true
			continue
		}
		fmt.Printf("%s: a valid dashboard (%d panels, %d variables)\n", path, len(d.Panels), len(d.Templating.List))
	}
	if bad {
		os.Exit(1)
	}
}

// noErrors: the SDK returns an empty cog.BuildErrors (a non-nil error value) from some paths that found nothing.
func noErrors(err error) error {
	if be, ok := err.(cog.BuildErrors); ok && len(be) == 0 {
		return nil
	}
	return err
}
