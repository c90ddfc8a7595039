package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/replay"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

const (
	exampleLog    = "../../deploy/replay/outage.log"
	exampleConfig = "../../deploy/replay/outage.fusebox.yaml"
)

// outageLog drives a scripted outage through envoysim and fusebox on the
// world's fake clock: two requests a second for 90 s, openai_us answering
// 503 from t=5 s to t=45 s. It returns the JSON access log (each line at
// the fake time of its request) and the transitions fusebox made.
func outageLog(t *testing.T) ([]byte, []map[string]any) {
	w := newWorld(t)
	p := w.proxy("default", nil)
	var mu sync.Mutex
	var marks []struct {
		wall time.Time
		fake float64
	}
	for sec := 0; sec < 90; sec++ {
		if sec == 5 {
			w.providers["openai_us"].SetFault(fakeprovider.Fault{Status: 503})
		}
		if sec == 45 {
			w.providers["openai_us"].SetFault(fakeprovider.Fault{})
		}
		for range 2 {
			mu.Lock()
			marks = append(marks, struct {
				wall time.Time
				fake float64
			}{time.Now(), float64(w.clk.Now().UnixNano()) / 1e9})
			mu.Unlock()
			chat(t, p, gpt, false)
		}
		w.clk.Advance(time.Second)
	}
	eventually(t, "every stream's end is recorded", func() bool { return len(p.Log()) == 180 })
	var buf bytes.Buffer
	at := func(wall time.Time) float64 {
		f := marks[0].fake
		for _, m := range marks {
			if !m.wall.After(wall) {
				f = m.fake
			}
		}
		return f
	}
	if err := p.WriteJSONLog(&buf, at); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + w.fusebox.AdminAddr() + "/admin/v1/transitions?limit=256")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var live []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&live); err != nil {
		t.Fatal(err)
	}
	// The journal is newest first.
	for i, j := 0, len(live)-1; i < j; i, j = i+1, j-1 {
		live[i], live[j] = live[j], live[i]
	}
	if os.Getenv("FUSEBOX_WRITE_EXAMPLE") != "" {
		if err := os.WriteFile(exampleLog, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes(), live
}

// TestReplayReproducesTheLiveRun (R-R1..R-R3): the log of a scripted outage,
// replayed under the config that ran it, gives the transitions the live run
// made (same routes, same order, times within a second); under a candidate
// with a shorter cooldown it reports more opens, and the requests it would
// have sent elsewhere, estimated.
func TestReplayReproducesTheLiveRun(t *testing.T) {
	raw, live := outageLog(t)
	path := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := replay.ReadFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Lines) != 180 || log.Malformed != 0 {
		t.Fatalf("%d lines, %d malformed", len(log.Lines), log.Malformed)
	}
	rt, err := routes.Parse([]byte(fuseboxConfig), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := replay.Run(rt, log)
	var replayed []replay.Transition
	var routesOf []string
	for _, rr := range rep.Routes {
		for _, tr := range rr.Transitions {
			replayed = append(replayed, tr)
			routesOf = append(routesOf, rr.Route)
		}
	}
	var liveDefault []map[string]any
	for _, e := range live {
		if e["gateway"] == "default" {
			liveDefault = append(liveDefault, e)
		}
	}
	if len(liveDefault) == 0 || len(replayed) != len(liveDefault) {
		t.Fatalf("live %d transitions %v, replayed %d %v", len(liveDefault), liveDefault, len(replayed), replayed)
	}
	for i, e := range liveDefault {
		at, _ := e["at"].(float64)
		if routesOf[i] != e["route"] || replayed[i].Change != e["transition"] || replayed[i].At-at > 1 || at-replayed[i].At > 1 {
			t.Fatalf("transition %d: live %v %v at %.3f, replayed %s %s at %.3f", i, e["route"], e["transition"], at, routesOf[i], replayed[i].Change, replayed[i].At)
		}
	}

	// A stricter candidate: cooldown 5 s instead of 30.
	strict, err := routes.Parse([]byte(strings.Replace(fuseboxConfig, "cooldown_ms: 30000", "cooldown_ms: 5000", 1)), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cand := replay.Run(strict, log)
	opens := func(r *replay.Report, route string) (int, int) {
		for _, rr := range r.Routes {
			if rr.Gateway == "default" && rr.Route == route {
				return rr.Opens, rr.Served
			}
		}
		return 0, 0
	}
	liveOpens, _ := opens(rep, "openai:us-east:gpt-4o-mini")
	candOpens, _ := opens(cand, "openai:us-east:gpt-4o-mini")
	rerouted := 0
	for _, rr := range cand.Routes {
		rerouted += rr.Rerouted
	}
	if candOpens <= liveOpens || rerouted == 0 || cand.ClientErrorsEstimated == 0 {
		t.Fatalf("the stricter candidate: %d opens (live %d), %d rerouted, %d estimated client errors", candOpens, liveOpens, rerouted, cand.ClientErrorsEstimated)
	}
	var text bytes.Buffer
	(&replay.Result{Candidate: cand, Baseline: rep}).WriteText(&text)
	t.Logf("\n%s", text.String())
}

// The example log shipped in deploy/replay (generated by outageLog with
// FUSEBOX_WRITE_EXAMPLE=1) ships with the config that ran it
// (outage.fusebox.yaml, the world's config: #37, before it was not shipped
// and a reader could not replay the example as the README says); it reads
// without a malformed line and, under that config, replays the outage: the
// failing route opens and closes again.
func TestShippedExampleLog(t *testing.T) {
	log, err := replay.ReadFiles(exampleLog)
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(shipped), strings.TrimPrefix(fuseboxConfig, "\n")) {
		t.Fatalf("%s is not the config that ran the example log (world_test.go fuseboxConfig)", exampleConfig)
	}
	rt, err := routes.Parse(shipped, routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := replay.Run(rt, log)
	if len(log.Lines) == 0 || log.Malformed != 0 || len(rep.Routes) == 0 {
		t.Fatalf("%d lines, %d malformed, %d routes", len(log.Lines), log.Malformed, len(rep.Routes))
	}
	var changes []string
	for _, rr := range rep.Routes {
		if rr.Route == "openai:us-east:gpt-4o-mini" {
			for _, tr := range rr.Transitions {
				changes = append(changes, tr.Change)
			}
		}
	}
	if len(changes) < 2 || changes[0] != "closed->open" || changes[len(changes)-1] != "half_open->closed" {
		t.Fatalf("the outage replays as %v", changes)
	}
}
