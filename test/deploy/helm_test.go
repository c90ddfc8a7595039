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
		if strings.HasSuffix(n, "NOTES.txt") {
			continue // text for the installer, not a manifest
		}
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
			if tc.sidecar {
				sharesTheSocket(t, dep.Spec.Template.Spec)
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
			if tc.sidecar != strings.Contains(args, "-grpc-addr unix://"+podSocket) {
				t.Errorf("ext_proc listener: %s", args)
			}
			redisEnv := false
			for _, e := range fb.Env {
				redisEnv = redisEnv || e.Name == "FUSEBOX_REDIS_URL" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
			}
			if !tc.sidecar && !redisEnv {
				t.Errorf("replicas without Redis (FUSEBOX_REDIS_URL from a Secret): %+v", fb.Env)
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
				want := strings.Replace(string(read(t, "envoy/envoy.yaml")), "socket_address: {address: fusebox, port_value: 50051}", "pipe: {path: "+podSocket+"}", 1)
				if got := configs["gw-fusebox-envoy"].Data["envoy.yaml"]; got != want {
					t.Error("deploy/helm/fusebox/files/envoy.yaml has drifted from envoy/envoy.yaml (regenerate it)")
				}
			} else {
				// #54: Istio builds a passthrough cluster for a headless
				// Service; the one the examples name is load-balanced, and
				// a headless one serves an Envoy's STRICT_DNS.
				if s := services["gw-fusebox"]; s.Spec.ClusterIP == "None" || len(s.Spec.Ports) == 0 || s.Spec.Ports[0].Port != 50051 {
					t.Errorf("the fusebox gRPC Service: %+v", s.Spec)
				}
				if s := services["gw-fusebox-headless"]; s.Spec.ClusterIP != "None" || len(s.Spec.Ports) == 0 || s.Spec.Ports[0].Port != 50051 {
					t.Errorf("the headless fusebox gRPC Service: %+v", s.Spec)
				}
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

// #37: the chart installs from the README alone. It merges the fleet
// key's file into the user's own store block (before, a second `store:`
// key was written above it, and fusebox refused the config); the Redis URL
// reaches fusebox from a Secret as FUSEBOX_REDIS_URL (before, in the pod's
// arguments, password and all); its NOTES say what is missing: an image
// with no registry (none is published) and, in sidecar mode, the provider
// credentials Secret with its keys.
func TestHelmChartInstallsFromTheREADME(t *testing.T) {
	cfg := "store: {redis: {op_timeout_ms: 80}}\n" +
		"gateways:\n  - id: default\n    models: [{name: m, routes: [\"a:r:m\", \"b:r:m\"]}]\n" +
		"    routes: [{key: \"a:r:m\", cluster: ca}, {key: \"b:r:m\", cluster: cb}]\n"
	out, err := render(t, map[string]any{
		"mode": "deployment", "replicas": 2, "adminToken": map[string]any{"value": "x"},
		"redis":  map[string]any{"url": "redis://:s3cret@redis:6379/0", "hmacKeySecret": "fleet-key"},
		"config": cfg,
	})
	if err != nil {
		t.Fatal(err)
	}
	byKind := docs(t, out)
	var cms []corev1.ConfigMap
	for _, d := range byKind["ConfigMap"] {
		var cm corev1.ConfigMap
		if err := yaml.UnmarshalStrict(d, &cm); err != nil {
			t.Fatal(err)
		}
		cms = append(cms, cm)
	}
	doc := cms[0].Data["fusebox.yaml"]
	if strings.Count(doc, "store:") != 1 {
		t.Fatalf("the config has %d store keys:\n%s", strings.Count(doc, "store:"), doc)
	}
	rt, err := routes.Parse([]byte(doc), routes.Options{})
	if err != nil {
		t.Fatalf("the rendered config does not load: %v\n%s", err, doc)
	}
	if rt.Store.Backend != routes.StoreRedis || rt.Store.Redis.HMACKeyFile != "/etc/fusebox-key/key" || rt.Store.Redis.OpTimeoutMs == nil || *rt.Store.Redis.OpTimeoutMs != 80 {
		t.Fatalf("the store block was not merged: %+v", rt.Store.Redis)
	}
	var dep appsv1.Deployment
	if err := yaml.UnmarshalStrict(byKind["Deployment"][0], &dep); err != nil {
		t.Fatal(err)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if strings.Contains(strings.Join(c.Args, " "), "s3cret") || strings.Contains(strings.Join(c.Args, " "), "redis://") {
		t.Fatalf("the Redis URL is in the pod's arguments: %v", c.Args)
	}
	found := false
	for _, e := range c.Env {
		if e.Name == "FUSEBOX_REDIS_URL" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Key == "url" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no FUSEBOX_REDIS_URL from a Secret: %+v", c.Env)
	}
	secretHoldsURL := false
	for _, d := range byKind["Secret"] {
		var s corev1.Secret
		if err := yaml.UnmarshalStrict(d, &s); err != nil {
			t.Fatal(err)
		}
		if s.StringData["url"] == "redis://:s3cret@redis:6379/0" {
			secretHoldsURL = true
		}
	}
	if !secretHoldsURL {
		t.Fatal("no Secret holds the Redis URL")
	}
	// The NOTES, sidecar mode with the default image.
	out, err = render(t, map[string]any{"adminToken": map[string]any{"value": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	notes := out["fusebox/templates/NOTES.txt"]
	for _, want := range []string{"No fusebox\nimage is published", "docker build --target fusebox", "create secret generic provider-credentials",
		"--from-file=openai_api_key.yaml"} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES lack %q:\n%s", want, notes)
		}
	}
	out, _ = render(t, map[string]any{"adminToken": map[string]any{"value": "x"}, "image": map[string]any{"repository": "ghcr.io/me/fusebox"}})
	if strings.Contains(out["fusebox/templates/NOTES.txt"], "No fusebox") {
		t.Error("NOTES warn about an image with a registry")
	}
}
