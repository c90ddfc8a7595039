package processor

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func firstRoute(t *testing.T, e *env) string {
	t.Helper()
	fams, err := e.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "fusebox_route_headroom" && len(f.Metric) > 0 {
			for _, l := range f.Metric[0].Label {
				if l.GetName() == "route" {
					return l.GetValue()
				}
			}
		}
	}
	t.Fatal("no fusebox_route_headroom series")
	return ""
}

func (e *env) headroom(route, kind string) float64 {
	return testutil.ToFloat64(e.metrics.RouteHeadroom.WithLabelValues("default", route, kind))
}

// R-H1, R-H4: what a provider announces is read from the response in
// whichever role sees it, and shown per route; a value not trusted is
// counted (R-H6) and leaves the last one shown.
func TestHeadroomIsShownPerRoute(t *testing.T) {
	t.Run("route role", func(t *testing.T) {
		e := newEnv(t)
		e.roundTrip("gpt", "200", nil, "x-ratelimit-remaining-requests", "2", "x-ratelimit-remaining-tokens", "1500")
		route := firstRoute(t, e)
		if got := e.headroom(route, "requests"); got != 2 {
			t.Fatalf("requests left %v on %s, want 2", got, route)
		}
		if got := e.headroom(route, "tokens"); got != 1500 {
			t.Fatalf("tokens left %v, want 1500", got)
		}
		e.roundTrip("gpt", "200", nil, "x-ratelimit-remaining-requests", "-1")
		if got := e.headroom(route, "requests"); got != 2 {
			t.Fatalf("a negative count replaced the last one: %v", got)
		}
		if n := testutil.ToFloat64(e.metrics.HeadroomIgnored.WithLabelValues("negative")); n != 1 {
			t.Fatalf("%v negative values counted", n)
		}
	})
	t.Run("observer", func(t *testing.T) {
		e := newObserverEnv(t)
		c := e.open("")
		d := c.chat("gpt")
		c.end()
		e.observeWith(fuseboxMetadata(t, d), []string{":status", "200", "content-type", "application/json", "x-ratelimit-remaining-tokens", "77"},
			`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`)
		if got := e.headroom(firstRoute(t, e), "tokens"); got != 77 {
			t.Fatalf("tokens left %v, want 77", got)
		}
	})
	t.Run("attempt role", func(t *testing.T) {
		e := newFailoverEnv(t)
		tok := e.routeRole()
		c, _, _ := e.attempt(tok, "r-1", 1, "/v1/chat/completions")
		c.respHeaders("200", false, nil, "content-type", "application/json",
			"anthropic-ratelimit-requests-remaining", "4", "anthropic-ratelimit-requests-reset", time.Unix(0, e.clk.Now().UnixNano()).Add(time.Minute).UTC().Format(time.RFC3339))
		c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
		c.end()
		if got := e.headroom("openai:us:gpt", "requests"); got != 4 {
			t.Fatalf("requests left %v on the attempt's route, want 4", got)
		}
	})
}
