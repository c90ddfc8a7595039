package deploy

import (
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/routes"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

// rendered is what a user installs: the manifests by kind, the fusebox
// and Envoy configs, the NOTES.
type rendered struct {
	byKind  map[string][][]byte
	fusebox string
	envoy   string
	notes   string
}

func renderChart(t *testing.T, values map[string]any) rendered {
	t.Helper()
	out, err := render(t, values)
	if err != nil {
		t.Fatal(err)
	}
	r := rendered{byKind: docs(t, out), notes: out["fusebox/templates/NOTES.txt"]}
	for _, d := range r.byKind["ConfigMap"] {
		var cm corev1.ConfigMap
		strict(t, d, &cm)
		switch cm.Name {
		case "gw-fusebox-config":
			r.fusebox = cm.Data["fusebox.yaml"]
		case "gw-fusebox-envoy":
			r.envoy = cm.Data["envoy.yaml"]
		}
	}
	return r
}

// envoyClusters maps each of an Envoy config's static clusters to its
// endpoint hosts and TLS SNI.
func envoyClusters(t *testing.T, envoy string) map[string][]string {
	t.Helper()
	var b struct {
		StaticResources struct {
			Clusters []map[string]any `json:"clusters"`
		} `json:"static_resources"`
	}
	if err := yaml.Unmarshal([]byte(envoy), &b); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, c := range b.StaticResources.Clusters {
		name, _ := c["name"].(string)
		hosts := []string{}
		for _, m := range regexp.MustCompile(`"address":"([^"]+)"|"sni":"([^"]+)"`).FindAllStringSubmatch(jsonOf(t, c), -1) {
			hosts = append(hosts, m[1]+m[2])
		}
		out[name] = hosts
	}
	return out
}

func jsonOf(t *testing.T, v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(j)
}

// fuseboxRoutes are the routes of a fusebox config: cluster and path.
func fuseboxRoutes(t *testing.T, cfg string) []map[string]any {
	t.Helper()
	if _, err := routes.Parse([]byte(cfg), routes.Options{}); err != nil {
		t.Fatalf("the rendered fusebox config does not load: %v\n%s", err, cfg)
	}
	var c struct {
		Gateways []struct {
			Routes []map[string]any `json:"routes"`
		} `json:"gateways"`
	}
	if err := yaml.Unmarshal([]byte(cfg), &c); err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, g := range c.Gateways {
		out = append(out, g.Routes...)
	}
	return out
}

// #54: the chart's sidecar mode deploys as written. Every cluster a route
// names exists in the rendered Envoy config; a route to an Azure OpenAI
// host carries the deployment path Azure needs (before, the chart's Azure
// route had none: after OpenAI's breaker opened, Azure answered 404 on
// /v1/chat/completions); every credential file Envoy reads is one the
// NOTES tell the user to put in the Secret; the provider hosts are
// values (before, placeholders with no way to set them), set through
// placeholders so a host given to another cluster is not replaced twice.
func TestHelmChartSidecarDeploysAsWritten(t *testing.T) {
	r := renderChart(t, map[string]any{"adminToken": map[string]any{"value": "x"}})
	clusters := envoyClusters(t, r.envoy)
	for _, rt := range fuseboxRoutes(t, r.fusebox) {
		cluster, _ := rt["cluster"].(string)
		hosts, ok := clusters[cluster]
		if !ok {
			t.Errorf("route %v names cluster %q, which the chart's Envoy config lacks", rt["key"], cluster)
		}
		for _, h := range hosts {
			if path, _ := rt["path"].(string); strings.HasSuffix(h, ".openai.azure.com") && !strings.HasPrefix(path, "/openai/deployments/") {
				t.Errorf("route %v goes to Azure (%s) with path %q: Azure answers 404 without its deployment path", rt["key"], h, path)
			}
		}
	}
	for _, m := range regexp.MustCompile(`path_config_source: \{path: /etc/envoy/secrets/([a-z_]+\.yaml)\}`).FindAllStringSubmatch(r.envoy, -1) {
		if !strings.Contains(r.notes, "--from-file="+m[1]) {
			t.Errorf("Envoy reads the credential file %s, which the NOTES' secret command does not create:\n%s", m[1], r.notes)
		}
	}

	// The hosts are values.
	r = renderChart(t, map[string]any{"adminToken": map[string]any{"value": "x"},
		"envoy": map[string]any{"providerHosts": map[string]any{"azure_eu_west": "api.openai.com", "openai_us_east": "openai.example.net"}}})
	clusters = envoyClusters(t, r.envoy)
	for cluster, want := range map[string]string{"azure_eu_west": "api.openai.com", "openai_us_east": "openai.example.net", "anthropic_us": "api.anthropic.com"} {
		hosts := clusters[cluster]
		sort.Strings(hosts)
		if len(hosts) != 2 || hosts[0] != want || hosts[1] != want {
			t.Errorf("cluster %s: address and SNI %v, want %s", cluster, hosts, want)
		}
	}
	for _, tc := range []struct {
		hosts map[string]any
		want  string
	}{
		{map[string]any{"azure_west": "x.openai.azure.com"}, "no such provider cluster"},
		{map[string]any{"azure_eu_west": "x.openai.azure.com, port_value: 1"}, "not a host name"},
	} {
		if _, err := render(t, map[string]any{"adminToken": map[string]any{"value": "x"}, "envoy": map[string]any{"providerHosts": tc.hosts}}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("providerHosts %v: %v, want an error containing %q", tc.hosts, err, tc.want)
		}
	}
}

// #54: deployment mode keeps others off the ext_proc port. A NetworkPolicy
// admits only the Envoys the values select to the gRPC port and the admin
// peers to the admin port (before, 0.0.0.0:50051 in plaintext reached by
// anyone in the cluster, while docs/security.md says whoever reaches it
// can report outcomes); with tls.secretName fusebox serves TLS from the
// Secret, asks for client certificates signed by its ca.crt, and the
// probes and ServiceMonitor speak HTTPS.
func TestHelmChartDeploymentIsClosed(t *testing.T) {
	base := func(extra map[string]any) map[string]any {
		v := map[string]any{"mode": "deployment", "adminToken": map[string]any{"value": "x"}, "serviceMonitor": map[string]any{"enabled": true}}
		for k, x := range extra {
			v[k] = x
		}
		return v
	}
	r := renderChart(t, base(nil))
	if len(r.byKind["NetworkPolicy"]) != 1 {
		t.Fatalf("%d NetworkPolicies in deployment mode", len(r.byKind["NetworkPolicy"]))
	}
	var np networkingv1.NetworkPolicy
	strict(t, r.byKind["NetworkPolicy"][0], &np)
	if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "fusebox" || len(np.Spec.Ingress) != 2 {
		t.Fatalf("the NetworkPolicy: %+v", np.Spec)
	}
	grpc := np.Spec.Ingress[0]
	if len(grpc.Ports) != 1 || grpc.Ports[0].Port.String() != "grpc" || len(grpc.From) == 0 || grpc.From[0].PodSelector == nil ||
		grpc.From[0].PodSelector.MatchLabels["app.kubernetes.io/managed-by"] != "envoy-gateway" {
		t.Errorf("the ext_proc port's rule: %+v", grpc)
	}
	if admin := np.Spec.Ingress[1]; len(admin.Ports) != 1 || admin.Ports[0].Port.String() != "admin" {
		t.Errorf("the admin port's rule: %+v", admin)
	}
	if len(renderChart(t, map[string]any{"adminToken": map[string]any{"value": "x"}}).byKind["NetworkPolicy"]) != 0 {
		t.Error("a NetworkPolicy in sidecar mode (fusebox is on the pod's socket there)")
	}
	if _, err := render(t, base(map[string]any{"networkPolicy": map[string]any{"envoy": []any{}}})); err == nil || !strings.Contains(err.Error(), "networkPolicy.envoy is empty") {
		t.Errorf("an empty envoy peer list: %v", err)
	}

	r = renderChart(t, base(map[string]any{"tls": map[string]any{"secretName": "fusebox-tls"}}))
	rt, err := routes.Parse([]byte(r.fusebox), routes.Options{})
	if err != nil {
		t.Fatalf("the rendered config: %v\n%s", err, r.fusebox)
	}
	tls := rt.Listen.TLS
	if tls.CertFile != "/etc/fusebox-tls/tls.crt" || tls.KeyFile != "/etc/fusebox-tls/tls.key" || tls.ClientCAFile != "/etc/fusebox-tls/ca.crt" {
		t.Fatalf("listen.tls: %+v", tls)
	}
	var dep appsv1.Deployment
	strict(t, r.byKind["Deployment"][0], &dep)
	mounted := false
	for _, v := range dep.Spec.Template.Spec.Volumes {
		mounted = mounted || v.Secret != nil && v.Secret.SecretName == "fusebox-tls"
	}
	c := dep.Spec.Template.Spec.Containers[0]
	for _, m := range c.VolumeMounts {
		mounted = mounted && (m.MountPath != "/etc/fusebox-tls" || m.ReadOnly)
	}
	if !mounted || !strings.Contains(jsonOf(t, c.VolumeMounts), "/etc/fusebox-tls") {
		t.Errorf("the TLS Secret is not mounted where listen.tls reads it: %+v", c.VolumeMounts)
	}
	if c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS || c.LivenessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Error("with TLS the admin listener serves HTTPS, and the probes speak HTTP")
	}
	if !strings.Contains(string(r.byKind["ServiceMonitor"][0]), "scheme: https") {
		t.Error("the ServiceMonitor scrapes HTTP from a TLS admin listener")
	}
	r = renderChart(t, base(map[string]any{"tls": map[string]any{"secretName": "fusebox-tls", "clientCA": false}}))
	if rt, _ := routes.Parse([]byte(r.fusebox), routes.Options{}); rt == nil || rt.Listen.TLS.ClientCAFile != "" || rt.Listen.TLS.CertFile == "" {
		t.Errorf("tls without clientCA: %s", r.fusebox)
	}
}
