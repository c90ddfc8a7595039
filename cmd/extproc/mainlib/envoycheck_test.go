package mainlib

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const checkFusebox = `gateways:
  - id: default
    models:
      - {name: m, routes: ["a:r:m", "b:r:m"]}
    routes:
      - {key: "a:r:m", cluster: provider_a}
      - {key: "b:r:m", cluster: provdier_b}
`

const checkEnvoy = `static_resources:
  listeners:
    - name: l
      filter_chains:
        - filters:
            - typed_config:
                http_filters:
                  - typed_config:
                      grpc_service:
                        envoy_grpc: {cluster_name: fusebox}
                route_config:
                  virtual_hosts:
                    - routes:
                        - route: {cluster: fallback}
  clusters:
    - name: fusebox
      load_assignment: {cluster_name: fusebox}
    - name: fallback
    - name: provider_a
      load_assignment: {cluster_name: provider_a}
    - name: provider_b
`

// TestValidateEnvoyNamesMissingClusters (#37, SPEC §10): validate -envoy
// names every route whose cluster the Envoy config lacks, with its line,
// and every provider cluster no route names, with its line; Envoy's own
// clusters (the ext_proc gRPC cluster, a route's fixed one) are not
// "unused". Before, a typo in a cluster name passed validate and showed
// only at run time, as Envoy's NC.
func TestValidateEnvoyNamesMissingClusters(t *testing.T) {
	dir := t.TempDir()
	fb, ev := filepath.Join(dir, "fusebox.yaml"), filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(fb, []byte(checkFusebox), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ev, []byte(checkEnvoy), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err := Main(context.Background(), []string{"validate", "-config", fb, "-envoy", ev}, &out, &errb)
	if err == nil {
		t.Fatalf("a route to a cluster Envoy lacks validated: %s", out.String())
	}
	text := out.String()
	for _, want := range []string{
		fb + `:7: gateways[0].routes[1].cluster: cluster "provdier_b": ` + ev + " has no such cluster",
		// #54: Envoy's NC is a 503 (it said 404), and a typo gets the
		// cluster it likely meant.
		`503 NC, cluster_not_found); did you mean "provider_b"?`,
		"warning: " + ev + `:21: cluster "provider_b": no route of ` + fb + " names it",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}
	for _, own := range []string{`"fusebox"`, `"fallback"`, `"provider_a"`} {
		if strings.Contains(text, own) {
			t.Errorf("%s reported:\n%s", own, text)
		}
	}
	// The same pair with the typo fixed validates, the unused warning gone.
	if err := os.WriteFile(fb, []byte(strings.ReplaceAll(checkFusebox, "provdier_b", "provider_b")), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Main(context.Background(), []string{"validate", "-config", fb, "-envoy", ev}, &out, &errb); err != nil || strings.Contains(out.String(), "warning") {
		t.Fatalf("%v: %s", err, out.String())
	}
}

// TestExampleAgreesWithEnvoy (#37): the documented example config and the
// shipped Envoy configs it is meant for name the same clusters, both ways.
// Before, deploy/fusebox.example.yaml named four clusters envoy/envoy.yaml
// lacked, so those routes failed only at run time, as Envoy's NC.
func TestExampleAgreesWithEnvoy(t *testing.T) {
	fb, err := os.ReadFile("../../../deploy/fusebox.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"envoy.yaml", "envoy-1.36.yaml", "envoy-observer.yaml"} {
		ev, err := os.ReadFile(filepath.Join("../../../envoy", f))
		if err != nil {
			t.Fatal(err)
		}
		ec, err := CheckEnvoyClusters(fb, "deploy/fusebox.example.yaml", ev, "envoy/"+f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range append(ec.Missing, ec.Unused...) {
			t.Error(p)
		}
	}
}
