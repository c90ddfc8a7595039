package envoysim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// jsonFormatKeys finds the access log's json_format in an Envoy config and
// returns its keys.
func jsonFormatKeys(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var keys []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				if m, ok := c.(map[string]any); ok && k == "json_format" {
					for f := range m {
						keys = append(keys, f)
					}
					continue
				}
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(doc)
	slices.Sort(keys)
	return keys
}

// The JSON line envoysim writes has exactly the fields of the shipped
// json_format (envoy/envoy.yaml), so a field the file adds or drops is
// one envoysim adds or drops: what replay reads from envoysim's lines is
// what it reads from Envoy's. A response's rate-limit headers reach the
// ratelimit_* fields, OpenAI's first, else Anthropic's (%RESP(A?B)%), and
// a field with no header is null.
func TestJSONLogIsTheShippedFormat(t *testing.T) {
	want := jsonFormatKeys(t, "../../../envoy/envoy.yaml")
	if !slices.Contains(want, "ratelimit_requests") {
		t.Fatalf("envoy.yaml's json_format lacks ratelimit_requests: %v", want)
	}
	quota := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("q") == "1" {
			w.Header().Set("x-ratelimit-remaining-tokens", "900")
			w.Header().Set("anthropic-ratelimit-requests-remaining", "4")
			w.Header().Set("anthropic-ratelimit-requests-reset", "2026-12-01T12:00:30Z")
		}
		w.WriteHeader(200)
	})
	r := newRig(t, plain, func(c *Config) { c.Clusters["default"].Addr = strings.TrimPrefix(quota.srv.URL, "http://") })
	for i, q := range []string{"0", "1"} {
		req, _ := http.NewRequest("POST", r.proxy.URL()+"/v1/chat/completions?q="+q, strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v %v", resp, err)
		}
		resp.Body.Close()
		// The entry is written once the request is done, as Envoy writes
		// it: the client can have its response first (a loaded machine
		// showed it), so the next request waits for this one's entry, or
		// the two lines may come in the other order (CI once read them so).
		if _, ok := r.proxy.WaitLogged(resp.Header.Get(RequestHeader), 5*time.Second); !ok {
			t.Fatalf("request %d was never logged", i)
		}
	}
	var buf bytes.Buffer
	if err := r.proxy.WriteJSONLog(&buf, nil); err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	var line, announced map[string]any
	if len(lines) != 2 || json.Unmarshal(lines[0], &line) != nil || json.Unmarshal(lines[1], &announced) != nil {
		t.Fatalf("lines %q", lines)
	}
	var got []string
	for k := range line {
		got = append(got, k)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("envoysim writes %v; envoy.yaml's json_format has %v", got, want)
	}
	if line["ratelimit_requests"] != nil {
		t.Fatalf("no header, yet ratelimit_requests %v", line["ratelimit_requests"])
	}
	if announced["ratelimit_requests"] != "4" || announced["ratelimit_requests_reset"] != "2026-12-01T12:00:30Z" ||
		announced["ratelimit_tokens"] != "900" || announced["ratelimit_tokens_reset"] != nil {
		t.Fatalf("the announced quota logged as %v", announced)
	}
}
