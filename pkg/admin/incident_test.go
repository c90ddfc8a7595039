package admin

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

const summaryConfig = `
fleets:
  - name: gpu
    circuit_breaker: {enabled: true, failure_threshold: 1, cooldown_ms: 60000}
gateways:
  - id: g
    circuit_breaker: {enabled: true, failure_threshold: 1, cooldown_ms: 60000, max_ejection_percent: 50}
    models:
      - {name: m, routes: ["a:r:m", "b:r:m", "c:r:m"]}
    routes:
      - {key: "a:r:m", cluster: ca}
      - {key: "b:r:m", cluster: cb, fleet: gpu}
      - {key: "c:r:m", cluster: cc, fleet: gpu}
`

// TestSummaryTellsTheTruth (#37): the incident summary says what routing
// does, from the same verdicts (each route's breaker and its fleet's) and
// the same selection (plan.Select). Before, a model passing over an
// open route read "routing as usual", an open fleet left its routes
// counted healthy (3 of 3), and every route forced open read try_all while
// routing failed fast. Summary had no test.
func TestSummaryTellsTheTruth(t *testing.T) {
	ctx := context.Background()
	fail := breaker.Result{Kind: breaker.KindStatus, Status: 503}
	cases := []struct {
		name    string
		act     func(st breaker.Store, now int64, key func(breaker.ID) breaker.Key)
		healthy int
		skipped string
		degr    string
	}{
		{"all closed", func(breaker.Store, int64, func(breaker.ID) breaker.Key) {}, 3, "", ""},
		{"one route open, skipped", func(st breaker.Store, now int64, key func(breaker.ID) breaker.Key) {
			_, _ = st.Record(ctx, key(breaker.RouteID("g", "a:r:m")), now, breaker.Admission{Gen: 1}, fail)
		}, 2, "a:r:m", "skipping"},
		{"the fleet open: two routes unhealthy, the floor keeps one", func(st breaker.Store, now int64, key func(breaker.ID) breaker.Key) {
			_, _ = st.Record(ctx, key(breaker.FleetID("gpu")), now, breaker.Admission{Gen: 1}, fail)
		}, 1, "c:r:m", "floor"}, // b readmitted: ties go in routing order
		{"one route saturated: passed over, healthy", func(st breaker.Store, now int64, key func(breaker.ID) breaker.Key) {
			_, _ = st.Record(ctx, key(breaker.RouteID("g", "a:r:m")), now, breaker.Admission{Gen: 1},
				breaker.Result{Kind: breaker.KindAnswered, Status: 200, SaturateUntil: now + 30e9})
		}, 3, "", "saturated"},
		// #54: the model is try_all (the default), and forced routes are
		// left out of try_all: it fails fast, and the summary says why
		// (before: plain fail_fast on a try_all gateway).
		{"every route forced open: fail_fast_forced", func(st breaker.Store, now int64, key func(breaker.ID) breaker.Key) {
			for _, r := range []string{"a:r:m", "b:r:m", "c:r:m"} {
				_ = st.ForceOpen(ctx, key(breaker.RouteID("g", r)), now, 0)
			}
		}, 0, "a:r:m,b:r:m,c:r:m", "fail_fast_forced"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt, err := routes.Parse([]byte(summaryConfig), routes.Options{})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixNano()
			st := breaker.NewMemory(nil)
			specs := rt.BreakerSpecs()
			keys, _, err := st.Install(ctx, now, specs)
			if err != nil {
				t.Fatal(err)
			}
			byID := map[breaker.ID]breaker.Key{}
			for i, sp := range specs {
				byID[sp.ID] = keys[i]
			}
			tc.act(st, now, func(id breaker.ID) breaker.Key { return byID[id] })
			got := Summary(rt, st, now)
			if len(got) != 1 {
				t.Fatalf("%d summaries", len(got))
			}
			s := got[0]
			if s.Healthy != tc.healthy || strings.Join(s.Skipped, ",") != tc.skipped || s.Degradation != tc.degr {
				t.Fatalf("healthy %d/%d, skipped %v, degradation %q; want %d, %q, %q (unhealthy %v)",
					s.Healthy, s.Total, s.Skipped, s.Degradation, tc.healthy, tc.skipped, tc.degr, s.Unhealthy)
			}
		})
	}
}
