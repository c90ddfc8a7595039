package deploy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const root = "../.."

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// exported is every series fusebox exports.
func exported(t *testing.T) map[string]bool {
	m := metrics.New()
	m.InternalErrors.WithLabelValues("panic")
	m.StoreErrors.WithLabelValues("record")
	m.Transitions.WithLabelValues("g", "r", "p", "gateway", "closed->open", "x")
	m.State.WithLabelValues("g", "r", "p", "gateway")
	m.Outcomes.WithLabelValues("g", "r", "failure", "x", breaker.OriginLabel("failure", "x"))
	m.Decisions.WithLabelValues("g", "", "routed")
	m.ClusterNotFound.WithLabelValues("g", "c")
	m.MessageDuration.WithLabelValues("request_headers").Observe(0)
	m.BreakerMode.WithLabelValues("g", "r", "gateway", "prod")
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{"up": true}
	for _, f := range fams {
		out[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[f.GetName()+s] = true
			}
		}
	}
	return out
}

var seriesName = regexp.MustCompile(`\b(aig_[a-z_]+|fusebox_[a-z_]+|up)\b`)

func checkNames(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	names := seriesName.FindAllString(expr, -1)
	if len(names) == 0 {
		t.Errorf("%s: %q uses no fusebox series", where, expr)
	}
	for _, n := range names {
		if !known[n] {
			t.Errorf("%s: %q names %s, which fusebox does not export", where, expr, n)
		}
	}
}

func parseRules(b []byte) (*rulefmt.RuleGroups, []error) {
	return rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
}

// The alert rules parse with Prometheus's own parser (PromQL included) and
// cover what an operator must hear about.
func TestAlertRules(t *testing.T) {
	groups, errs := parseRules(read(t, "deploy/prometheus/alerts.yml"))
	if len(errs) > 0 {
		t.Fatalf("rulefmt: %v", errs)
	}
	known := exported(t)
	have := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			have[r.Alert] = true
			checkNames(t, r.Alert, r.Expr, known)
			if r.Annotations["summary"] == "" {
				t.Errorf("%s has no summary", r.Alert)
			}
		}
	}
	for _, a := range []string{"FuseboxBreakerOpenTooLong", "FuseboxModelAllRoutesOpen", "FuseboxFailFast", "FuseboxConfigReloadFailed", "FuseboxStoreErrors", "FuseboxClusterNotFound"} {
		if !have[a] {
			t.Errorf("no alert %s", a)
		}
	}
	// A broken rule is refused: the check can fail.
	bad := bytes.Replace(read(t, "deploy/prometheus/alerts.yml"), []byte("expr: increase(aig_config_reloads_total"), []byte("expr: increase(aig_config_reloads_total[[["), 1)
	if _, errs := parseRules(bad); len(errs) == 0 {
		t.Fatal("a broken expression was accepted")
	}
}

// The Grafana dashboard is valid JSON whose every query names series
// fusebox exports, with the panels an operator needs.
func TestGrafanaDashboard(t *testing.T) {
	var d struct {
		UID    string
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(read(t, "deploy/grafana/fusebox-dashboard.json"), &d); err != nil {
		t.Fatal(err)
	}
	known := exported(t)
	joined := ""
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkNames(t, p.Title, tg.Expr, known)
			joined += tg.Expr + "\n"
		}
	}
	for _, s := range []string{"aig_circuit_breaker_state", "aig_circuit_breaker_transitions_total", "aig_circuit_breaker_outcomes_total",
		"aig_circuit_breaker_decisions_total", "aig_extproc_message_duration_seconds_bucket", "aig_extproc_streams_active"} {
		if !strings.Contains(joined, s) {
			t.Errorf("the dashboard does not show %s", s)
		}
	}
	// #54: the datasource is a variable (before, uid "prometheus" was
	// hard-coded: the dashboard failed on any other Grafana).
	raw := string(read(t, "deploy/grafana/fusebox-dashboard.json"))
	if strings.Contains(raw, `"uid": "prometheus"`) || !strings.Contains(raw, `"type": "datasource"`) || !strings.Contains(raw, `"uid": "${datasource}"`) {
		t.Error("the dashboard's datasource is not the ${datasource} variable")
	}
	// Provisioned next to Prometheus in docker-compose.yaml.
	compose := string(read(t, "docker-compose.yaml"))
	if !strings.Contains(compose, "./deploy/grafana/fusebox-dashboard.json:") || !strings.Contains(compose, "./deploy/grafana/provisioning:") {
		t.Error("docker-compose.yaml does not provision the dashboard")
	}
}

// strict decodes a manifest into a Kubernetes API type, refusing unknown
// fields (a misspelt field would otherwise be silently dropped).
func strict(t *testing.T, b []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		t.Fatalf("%T: %v", into, err)
	}
}

func TestKubernetesManifests(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(root, "deploy/kubernetes/*.yaml"))
	if len(files) < 4 {
		t.Fatalf("manifests: %v", files)
	}
	var dep appsv1.Deployment
	configs := map[string]corev1.ConfigMap{}
	services := 0
	for _, f := range files {
		raw, _ := os.ReadFile(f)
		for _, b := range docs(t, map[string]string{f: string(raw)})["Service"] {
			var s corev1.Service
			strict(t, b, &s)
			services++
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(raw, &meta); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		b := raw
		switch meta.Kind {
		case "Deployment":
			strict(t, b, &dep)
		case "ConfigMap":
			var cm corev1.ConfigMap
			strict(t, b, &cm)
			configs[cm.Name] = cm
		case "Service":
			var s corev1.Service
			strict(t, b, &s)
		default:
			t.Errorf("%s: unexpected kind %q", f, meta.Kind)
		}
	}
	if services != 2 {
		t.Errorf("%d Services, want the gateway's and fusebox's admin", services)
	}
	if *dep.Spec.Replicas != 1 {
		t.Error("more than one pod on the memory store: each would keep its own breakers (use the Helm chart with Redis)")
	}
	// A misspelt field fails the strict decode.
	b := bytes.Replace(read(t, "deploy/kubernetes/deployment.yaml"), []byte("readinessProbe:"), []byte("readinesProbe:"), 1)
	if err := yaml.UnmarshalStrict(b, &appsv1.Deployment{}); err == nil {
		t.Fatal("a misspelt field was accepted")
	}

	// fusebox is a sidecar of Envoy on loopback, ready on /readyz, scraped.
	pod := dep.Spec.Template
	var fb, envoy *corev1.Container
	for i := range pod.Spec.Containers {
		switch pod.Spec.Containers[i].Name {
		case "fusebox":
			fb = &pod.Spec.Containers[i]
		case "envoy":
			envoy = &pod.Spec.Containers[i]
		}
	}
	if fb == nil || envoy == nil {
		t.Fatal("the pod must run envoy and fusebox")
	}
	sharesTheSocket(t, pod.Spec)
	if fb.ReadinessProbe == nil || fb.ReadinessProbe.HTTPGet == nil || fb.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("fusebox readiness must be /readyz")
	}
	if pod.Annotations["prometheus.io/scrape"] != "true" || pod.Annotations["prometheus.io/port"] != "8090" {
		t.Error("no scrape annotations")
	}
	for _, vm := range fb.VolumeMounts {
		if vm.MountPath == "/etc/fusebox" && vm.SubPath != "" {
			t.Error("the fusebox config must be mounted as a directory: a subPath mount never sees ConfigMap updates")
		}
	}
	tokenFromSecret := false
	for _, e := range fb.Env {
		if e.Name == "FUSEBOX_ADMIN_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			tokenFromSecret = true
		}
		if e.Value != "" && strings.Contains(strings.ToLower(e.Name), "token") {
			t.Error("a token written into the manifest")
		}
	}
	if !tokenFromSecret {
		t.Error("the admin token must come from a Secret")
	}

	// The fusebox config in the ConfigMap loads, with gRPC on loopback.
	rt, err := routes.Parse([]byte(configs["fusebox-config"].Data["fusebox.yaml"]), routes.Options{})
	if err != nil {
		t.Fatalf("fusebox-config: %v", err)
	}
	if rt.Listen.GRPC != "unix://"+podSocket {
		t.Errorf("ext_proc must listen on the pod's Unix socket %s, got %s", podSocket, rt.Listen.GRPC)
	}
	// Envoy's config is the shipped envoy.yaml with fusebox on that socket.
	want := strings.Replace(string(read(t, "envoy/envoy.yaml")), "socket_address: {address: fusebox, port_value: 50051}", "pipe: {path: "+podSocket+"}", 1)
	if got := configs["envoy-config"].Data["envoy.yaml"]; got != want {
		t.Error("deploy/kubernetes/envoy-config.yaml has drifted from envoy/envoy.yaml (regenerate it)")
	}
	// #54: the Secret the instructions create holds every credential file
	// Envoy reads (before, the Anthropic key was left out, and Envoy's
	// anthropic cluster waited for an SDS file that never came).
	instructions := string(read(t, "deploy/kubernetes/deployment.yaml"))
	for _, m := range regexp.MustCompile(`path_config_source: \{path: /etc/envoy/secrets/([a-z_]+\.yaml)\}`).FindAllStringSubmatch(want, -1) {
		if !strings.Contains(instructions, "--from-file="+m[1]) {
			t.Errorf("Envoy reads /etc/envoy/secrets/%s, which deployment.yaml's secret command does not create", m[1])
		}
	}
}

// TestComposeRedisPersists (R-ST15): the shipped compose Redis keeps what
// it holds across a restart (AOF on, its data dir on a volume), so
// acknowledged admin changes survive Redis and the fleet restarting
// together even before any replica's overlay cache is read. Before, it ran
// with --save "" --appendonly no.
func TestComposeRedisPersists(t *testing.T) {
	var compose struct {
		Services map[string]struct {
			Command []string `json:"command"`
			Volumes []string `json:"volumes"`
		} `json:"services"`
		Volumes map[string]any `json:"volumes"`
	}
	if err := yaml.Unmarshal(read(t, "docker-compose.yaml"), &compose); err != nil {
		t.Fatal(err)
	}
	r, ok := compose.Services["redis"]
	if !ok {
		t.Fatal("no redis service")
	}
	cmd := strings.Join(r.Command, " ")
	if !strings.Contains(cmd, "--appendonly yes") {
		t.Fatalf("redis runs without AOF: %q", cmd)
	}
	persisted := false
	for _, v := range r.Volumes {
		if name, dir, _ := strings.Cut(v, ":"); dir == "/data" {
			_, persisted = compose.Volumes[name]
		}
	}
	if !persisted {
		t.Fatalf("redis's /data is not a named volume: %v", r.Volumes)
	}
}

// podSocket is where the shipped sidecars put the ext_proc socket.
const podSocket = "/run/fusebox/extproc.sock"

// sharesTheSocket checks that a sidecar pod mounts one writable volume at
// the socket's directory in both containers, and that the volume is the
// pod's own (an emptyDir), not something another pod could reach.
func sharesTheSocket(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	dir := filepath.Dir(podSocket)
	vol := map[string]string{}
	for _, c := range pod.Containers {
		for _, m := range c.VolumeMounts {
			if m.MountPath == dir && !m.ReadOnly {
				vol[c.Name] = m.Name
			}
		}
	}
	if vol["envoy"] == "" || vol["envoy"] != vol["fusebox"] {
		t.Fatalf("envoy and fusebox must share a writable volume at %s: %v", dir, vol)
	}
	for _, v := range pod.Volumes {
		if v.Name == vol["fusebox"] && v.EmptyDir == nil {
			t.Errorf("the socket's volume %s must be the pod's own emptyDir", v.Name)
		}
	}
}
