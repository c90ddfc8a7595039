package deploy

import (
	"bytes"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/routes"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// render renders deploy/helm/fusebox with Helm's own loader and engine.
func render(t *testing.T, values map[string]any) (map[string]string, error) {
	t.Helper()
	chrt, err := loader.Load(filepath.Join(root, "deploy/helm/fusebox"))
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(chrt, values, chartutil.ReleaseOptions{Name: "gw", Namespace: "llm", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	return engine.Render(chrt, vals)
}

// docs splits every rendered manifest into its documents, by kind.
func docs(t *testing.T, out map[string]string) map[string][][]byte {
	t.Helper()
	byKind := map[string][][]byte{}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, d := range bytes.Split([]byte(out[n]), []byte("\n---")) {
			if len(bytes.TrimSpace(d)) == 0 || bytes.Equal(bytes.TrimSpace(d), []byte("---")) {
				continue
			}
			var meta struct{ Kind string }
			if err := yaml.Unmarshal(d, &meta); err != nil {
				t.Fatalf("%s: %v\n%s", n, err, d)
			}
			if meta.Kind == "" {
				continue // only comments
			}
			byKind[meta.Kind] = append(byKind[meta.Kind], d)
		}
	}
	return byKind
}

// The chart renders in both modes into manifests that decode strictly as
// Kubernetes' own types: the config loads as fusebox's, the token comes
// from a Secret, probes are /readyz and /healthz, an admin Service exists,
// a ServiceMonitor only when asked; in sidecar mode Envoy's config is the
// shipped envoy.yaml with fusebox on loopback; in deployment mode N
// replicas on Redis behind a headless gRPC Service.
func TestHelmChart(t *testing.T) {
	cases := []struct {
		name     string
		values   map[string]any
		replicas int32
		sidecar  bool
		monitor  bool
	}{
		{"sidecar", map[string]any{"adminToken": map[string]any{"value": "t0ken"}}, 1, true, false},
		{"deployment on redis", map[string]any{"mode": "deployment", "replicas": 3, "redis": map[string]any{"url": "redis://redis:6379/0", "hmacKeySecret": "fleet-key"},
			"adminToken": map[string]any{"existingSecret": "fusebox-admin"}, "serviceMonitor": map[string]any{"enabled": true}}, 3, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := render(t, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			byKind := docs(t, out)
			var dep appsv1.Deployment
			strict(t, byKind["Deployment"][0], &dep)
			if *dep.Spec.Replicas != tc.replicas {
				t.Errorf("replicas %d", *dep.Spec.Replicas)
			}
			configs := map[string]corev1.ConfigMap{}
			for _, d := range byKind["ConfigMap"] {
				var cm corev1.ConfigMap
				strict(t, d, &cm)
				configs[cm.Name] = cm
			}
			if _, err := routes.Parse([]byte(configs["gw-fusebox-config"].Data["fusebox.yaml"]), routes.Options{}); err != nil {
				t.Fatalf("the rendered fusebox config: %v", err)
			}
			var fb *corev1.Container
			names := []string{}
			for i, c := range dep.Spec.Template.Spec.Containers {
				names = append(names, c.Name)
				if c.Name == "fusebox" {
					fb = &dep.Spec.Template.Spec.Containers[i]
				}
			}
			if want := map[bool]string{true: "envoy,fusebox", false: "fusebox"}[tc.sidecar]; strings.Join(names, ",") != want {
				t.Fatalf("containers %v, want %s", names, want)
			}
			if fb.ReadinessProbe.HTTPGet.Path != "/readyz" || fb.LivenessProbe.HTTPGet.Path != "/healthz" {
				t.Error("probes")
			}
			if fb.Env[0].ValueFrom == nil || fb.Env[0].ValueFrom.SecretKeyRef == nil {
				t.Error("the admin token must come from a Secret")
			}
			// R-ST15: the overlay cache lands on the writable state volume.
			cacheHome := ""
			for _, e := range fb.Env {
				if e.Name == "XDG_CACHE_HOME" {
					cacheHome = e.Value
				}
			}
			onVolume := false
			for _, m := range fb.VolumeMounts {
				onVolume = onVolume || (cacheHome != "" && m.MountPath == cacheHome && !m.ReadOnly)
			}
			if !onVolume {
				t.Errorf("the overlay cache (XDG_CACHE_HOME %q) is not on a writable volume: the root filesystem is read-only", cacheHome)
			}
			args := strings.Join(fb.Args, " ")
			if tc.sidecar != strings.Contains(args, "-grpc-addr 127.0.0.1:50051") {
				t.Errorf("ext_proc listener: %s", args)
			}
			if !tc.sidecar && !strings.Contains(args, "-redis-url") {
				t.Errorf("replicas without Redis: %s", args)
			}
			services := map[string]corev1.Service{}
			for _, d := range byKind["Service"] {
				var s corev1.Service
				strict(t, d, &s)
				services[s.Name] = s
			}
			if _, ok := services["gw-fusebox-admin"]; !ok {
				t.Errorf("no admin Service: %v", services)
			}
			if tc.sidecar {
				want := strings.Replace(string(read(t, "envoy/envoy.yaml")), "socket_address: {address: fusebox, port_value: 50051}", "socket_address: {address: 127.0.0.1, port_value: 50051}", 1)
				if got := configs["gw-fusebox-envoy"].Data["envoy.yaml"]; got != want {
					t.Error("deploy/helm/fusebox/files/envoy.yaml has drifted from envoy/envoy.yaml (regenerate it)")
				}
			} else if s := services["gw-fusebox"]; s.Spec.ClusterIP != "None" || s.Spec.Ports[0].Port != 50051 {
				t.Errorf("the fusebox gRPC Service: %+v", s.Spec)
			}
			if (len(byKind["ServiceMonitor"]) == 1) != tc.monitor {
				t.Errorf("ServiceMonitor rendered: %d", len(byKind["ServiceMonitor"]))
			}
		})
	}
}

// The chart refuses what would not work: replicas without Redis (each
// would keep its own breakers), no admin token, an unknown mode.
func TestHelmChartRefuses(t *testing.T) {
	cases := []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"replicas on memory", map[string]any{"replicas": 2, "adminToken": map[string]any{"value": "x"}}, "needs redis.url"},
		{"no token", map[string]any{}, "adminToken"},
		{"bad mode", map[string]any{"mode": "daemonset", "adminToken": map[string]any{"value": "x"}}, "mode must be"},
	}
	for _, tc := range cases {
		if _, err := render(t, tc.values); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
