package compose

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

const root = "../.."

func load(t *testing.T, content []byte) (*types.Project, error) {
	t.Helper()
	return loadEnv(t, content, types.Mapping{"FUSEBOX_ADMIN_TOKEN": "0123456789abcdef0123456789abcdef"})
}

func loadEnv(t *testing.T, content []byte, env types.Mapping) (*types.Project, error) {
	t.Helper()
	abs, _ := filepath.Abs(root)
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  abs,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(abs, "docker-compose.yaml"), Content: content}},
		Environment: env,
	}, func(o *loader.Options) { o.SetProjectName("fusebox", true) })
}

func TestComposeFileIsValid(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "docker-compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := load(t, raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"envoy", "fusebox", "redis", "providers", "prometheus", "grafana", "otel-collector"} {
		if _, err := p.GetService(name); err != nil {
			t.Errorf("service %s: %v", name, err)
		}
	}
	envoy, _ := p.GetService("envoy")
	if !strings.HasPrefix(envoy.Image, "envoyproxy/envoy:v") || strings.HasSuffix(envoy.Image, ":latest") {
		t.Errorf("envoy image must be pinned, got %q", envoy.Image)
	}
	// Two fusebox replicas, built from the Dockerfile's fusebox target, on
	// the Redis store (the mounted config says backend: redis) and the
	// compose network's Redis, each with its own admin port.
	ports := map[uint32]bool{}
	for _, name := range []string{"fusebox", "fusebox-2"} {
		fb, err := p.GetService(name)
		if err != nil {
			t.Errorf("replica %s: %v", name, err)
			continue
		}
		if fb.Build == nil || fb.Build.Target != "fusebox" {
			t.Errorf("%s must be built from the Dockerfile's fusebox target", name)
		}
		if url := fb.Environment["FUSEBOX_REDIS_URL"]; url == nil || *url != "redis://redis:6379/0" {
			t.Errorf("%s: FUSEBOX_REDIS_URL %v", name, url)
		}
		if _, ok := fb.DependsOn["redis"]; !ok {
			t.Errorf("%s does not wait for redis", name)
		}
		// Traces (#55): both replicas export to the compose collector, the
		// one envoy-compose.yaml's tracer sends Envoy's spans to.
		if e := fb.Environment["OTEL_TRACES_EXPORTER"]; e == nil || *e != "otlp" {
			t.Errorf("%s: tracing is off (OTEL_TRACES_EXPORTER %v)", name, e)
		}
		if e := fb.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]; e == nil || !strings.Contains(*e, "otel-collector:4317") {
			t.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT %v, not the compose collector", name, e)
		}
		cfg := ""
		for i, a := range fb.Command {
			if a == "-config" && i+1 < len(fb.Command) {
				cfg = fb.Command[i+1]
			}
		}
		redisBackend := false
		for _, v := range fb.Volumes {
			if v.Target == cfg {
				b, err := os.ReadFile(v.Source)
				redisBackend = err == nil && strings.Contains(string(b), "backend: redis")
			}
		}
		if !redisBackend {
			t.Errorf("%s: -config %q is not a mounted config with backend: redis", name, cfg)
		}
		for _, pc := range fb.Ports {
			if n, _ := strconv.Atoi(pc.Published); n != 0 {
				if ports[uint32(n)] {
					t.Errorf("%s publishes port %d twice", name, n)
				}
				ports[uint32(n)] = true
			}
		}
	}
	// Every bind-mounted file exists in the repository.
	for _, s := range p.Services {
		for _, v := range s.Volumes {
			if v.Type == types.VolumeTypeBind {
				if _, err := os.Stat(v.Source); err != nil {
					t.Errorf("%s mounts %s: %v", s.Name, v.Source, err)
				}
			}
		}
	}
}

func TestComposeMisspeltFieldFails(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "docker-compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ old, new string }{
		{"    image: envoyproxy/envoy", "    imag: envoyproxy/envoy"},
		{"    depends_on:\n      redis:", "    depend_on:\n      redis:"},
		{"condition: service_healthy", "condition: service_healty"},
	} {
		bad := strings.Replace(string(raw), tc.old, tc.new, 1)
		if bad == string(raw) {
			t.Fatalf("fixture %q not found", tc.old)
		}
		if _, err := load(t, []byte(bad)); err == nil {
			t.Errorf("misspelling %q → %q was accepted", tc.old, tc.new)
		}
	}
}

// R-L5: every published port is bound to loopback, and fusebox does not
// start without an admin token chosen by the operator.
func TestComposeExposesNothingBeyondTheHost(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "docker-compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := load(t, raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Services {
		for _, port := range s.Ports {
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes %s on %q, not 127.0.0.1", s.Name, port.Published, port.HostIP)
			}
		}
	}
	fb, _ := p.GetService("fusebox")
	if tok := fb.Environment["FUSEBOX_ADMIN_TOKEN"]; tok == nil || *tok == "change-me" {
		t.Fatalf("token %v", tok)
	}
	if strings.Contains(string(raw), "change-me") {
		t.Fatal("a default token is still in the compose file")
	}
	if _, err := loadEnv(t, raw, types.Mapping{}); err == nil || !strings.Contains(err.Error(), "FUSEBOX_ADMIN_TOKEN") {
		t.Fatalf("compose started without a token: %v", err)
	}
}
