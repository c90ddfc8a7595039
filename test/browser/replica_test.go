package browser

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/fusebox-llm/fusebox/pkg/extproc"
	"github.com/fusebox-llm/fusebox/pkg/judge"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// refused sends one request of gateway gw whose attempt Envoy could not
// connect for (UF, connection_failure: a failure of local origin, R-FD1).
func refused(t *testing.T, conn *grpc.ClientConn, gw string) {
	t.Helper()
	attrs := map[string]*structpb.Struct{extproc.AttrKey: {Fields: map[string]*structpb.Value{
		"response.flags":        structpb.NewNumberValue(judge.FlagUF),
		"response.code_details": structpb.NewStringValue("upstream_reset_before_response_started{connection_failure}"),
	}}}
	answerAttrs(t, conn, gw, "503", nil, []string{"content-type", "text/plain"}, attrs)
}

// metricOf reads one series from an admin listener's /metrics (-1: none).
func metricOf(t *testing.T, admin, series string) string {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile("(?m)^" + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// TestReplicaScopedRouteInDashboard (R-FD3 in the dashboard, #53): two
// replicas share a Redis; replica A's Envoy cannot connect to OpenAI.
// Replica A's dashboard draws the route apart, closed for the fleet and
// open on this replica (its egress), and its summary marks the route
// "this replica only"; replica B's draws it closed, with no such cell.
func TestReplicaScopedRouteInDashboard(t *testing.T) {
	exe := chromium(t)
	if _, err := exec.LookPath("redis-server"); err != nil && os.Getenv("CI") != "true" {
		t.Skip("redis-server is not on PATH")
	}
	shots := artifacts(t)
	srv := redistest.Start(t)
	cfg := "store: {backend: redis, redis: {url: \"redis://" + srv.Addr + "/0\"}}\n" + incidentConfig
	a, connA := startOn(t, cfg)
	b, _ := startOn(t, cfg)
	deadline := time.Now().Add(20 * time.Second)
	for metricOf(t, a.AdminAddr(), "fusebox_replicas_alive") != "2" || metricOf(t, b.AdminAddr(), "fusebox_replicas_alive") != "2" {
		if time.Now().After(deadline) {
			t.Fatal("the two replicas did not see each other alive through Redis")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for range 3 {
		refused(t, connA, "default")
	}
	const route = "openai:us-east:gpt-4o-mini"
	card := `section.gateway[data-gateway="default"]`
	row := card + ` tr[data-route="` + route + `"]`
	bctx, shot := newBrowser(t, t.Context(), exe, shots, "replica-")
	var state, summaryText string
	must(t, chromedp.Run(bctx,
		chromedp.Navigate("http://"+a.AdminAddr()+"/dashboard"),
		chromedp.WaitVisible(card+` summary`, chromedp.ByQuery),
		// A card with an unhealthy route opens by itself: opened, not toggled.
		chromedp.Evaluate(`document.querySelector('`+card+` summary').parentElement.open = true`, nil),
		chromedp.WaitVisible(row+` td.state-replica`, chromedp.ByQuery),
		chromedp.Text(row+` td.state`, &state, chromedp.ByQuery),
		chromedp.Text(`body`, &summaryText, chromedp.ByQuery),
		shot("1-replica-a"),
	), "replica A's dashboard")
	if !strings.Contains(state, "closed for the fleet; open on replica") || !strings.Contains(state, "connection_error") {
		t.Fatalf("replica A's route reads %q", state)
	}
	if !strings.Contains(summaryText, route+" (this replica only)") {
		t.Fatalf("replica A's summary does not mark the route as this replica's only:\n%s", summaryText)
	}
	var cells int
	must(t, chromedp.Run(bctx,
		chromedp.Navigate("http://"+b.AdminAddr()+"/dashboard"),
		chromedp.WaitVisible(card+` summary`, chromedp.ByQuery),
		// A card with an unhealthy route opens by itself: opened, not toggled.
		chromedp.Evaluate(`document.querySelector('`+card+` summary').parentElement.open = true`, nil),
		chromedp.WaitVisible(row+` td.state`, chromedp.ByQuery),
		chromedp.Text(row+` td.state`, &state, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('td.state-replica').length`, &cells),
		shot("2-replica-b"),
	), "replica B's dashboard")
	if cells != 0 || !strings.Contains(state, "closed") {
		t.Fatalf("replica B draws %d replica cells, its route reads %q: one pod's egress reached another's view", cells, state)
	}
}
