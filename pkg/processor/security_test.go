package processor

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/extproc"
)

// R-L2: a name a client sends is echoed at most 256 bytes long, and no
// error body exceeds 4 KiB, however large or hostile the name.
func TestEchoedNamesAreBounded(t *testing.T) {
	e := newEnv(t)
	huge := strings.Repeat("\x7f", 1<<20)
	cases := []struct {
		name string
		run  func(c *call) []byte
	}{
		{"model header", func(c *call) []byte {
			return c.reqHeaders(true, "x-fusebox-model", huge).GetImmediateResponse().GetBody()
		}},
		{"gateway header", func(c *call) []byte {
			return c.reqHeaders(true, "x-fusebox-gateway", huge, "x-fusebox-model", "gpt").GetImmediateResponse().GetBody()
		}},
		{"model in a 3 MiB body", func(c *call) []byte {
			c.reqHeaders(false, "content-type", "application/json")
			return c.reqBody(`{"model":"` + strings.Repeat("\\u007f", 3<<20/6) + `"}`).GetImmediateResponse().GetBody()
		}},
		{"residency", func(c *call) []byte {
			return c.reqHeaders(true, "x-fusebox-model", "gpt", "x-fusebox-residency", strings.Repeat("x,", 1<<19)).GetImmediateResponse().GetBody()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := e.open("")
			body := tc.run(c)
			c.end()
			if len(body) == 0 || len(body) > extproc.MaxErrorBody {
				t.Fatalf("error body of %d bytes", len(body))
			}
			var v struct {
				Error struct{ Message, Code string }
			}
			if err := json.Unmarshal(body, &v); err != nil || v.Error.Code == "" {
				t.Fatalf("not an OpenAI-style error: %s", body)
			}
			if !strings.Contains(v.Error.Message, "…") {
				t.Fatalf("the echoed name was not cut: %.200s", v.Error.Message)
			}
		})
	}
}

// R-L3: a body fusebox reads that names its model twice is refused:
// fusebox would route on one and the provider serve the other. (A declared
// non-JSON body is not read at all: it passes through, R-D4.)
func TestModelGivenTwiceIsRefused(t *testing.T) {
	e := newEnv(t)
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", ""} {
		c := e.open("")
		if ct != "" {
			c.reqHeaders(false, "content-type", ct)
		} else {
			c.reqHeaders(false)
		}
		r := c.reqBody(`{"model":"gpt","messages":[],"model":"cheap"}`)
		c.end()
		ir := r.GetImmediateResponse()
		if ir.GetStatus().GetCode() != 400 || !strings.Contains(string(ir.GetBody()), `"code":"invalid_request"`) {
			t.Fatalf("content-type %q: %v", ct, r)
		}
	}
}
