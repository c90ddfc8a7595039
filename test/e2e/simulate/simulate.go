// Package simulate tries an operator's own config without Envoy (extproc
// simulate): the real fusebox on that config, envoysim playing the shipped
// envoy.yaml, and one fake provider per route of one model. It drives a
// scripted scenario on a simulated clock and prints the per-second
// timeline `make demo` prints: what each route served, the first route's
// breaker, each transition. The scenarios (-scenario):
//   - outage: the model's first route answers 503 to everyone;
//   - poison: it answers 500 to one request only, which its client's SDK
//     retries twice, every second (request faults, R-FD4);
//   - egress: two replicas sharing a Redis, each behind its own Envoy;
//     the first replica's egress to the first route refuses connections
//     (one pod's broken egress, R-FD2, R-FD3; egress.go).
package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fusebox-llm/fusebox/cmd/extproc/mainlib"
	"github.com/fusebox-llm/fusebox/envoy"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/test/e2e/envoyconfig"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
	"github.com/fusebox-llm/fusebox/test/e2e/logbuf"
)

// Options of one simulation.
type Options struct {
	Config    string // the operator's fusebox config ("" = the embedded default)
	Gateway   string // "" = the config's first gateway
	Envoy     string // the operator's Envoy config, for the cluster check ("" = none)
	Model     string // "" = the gateway's first model with two routes or more
	OutageAt  int    // second the first route starts answering 503
	RecoverAt int    // second it is healthy again
	Duration  int    // seconds of traffic
	PerSecond int    // requests a second
	// Scenario is outage (default), poison or egress; Redis the URL the
	// egress scenario's replicas share ("" = a redis-server it starts).
	Scenario string
	Redis    string
}

// Main is `extproc simulate`: flags, then Run.
func Main(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("extproc simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o Options
	fs.StringVar(&o.Config, "config", "", "your fusebox config (default: the embedded default)")
	fs.StringVar(&o.Gateway, "gateway", "", "the gateway to drive (default: the first)")
	fs.StringVar(&o.Model, "model", "", "the model to drive (default: the first with two routes or more)")
	fs.IntVar(&o.OutageAt, "outage-at", 4, "second the first route starts answering 503")
	fs.IntVar(&o.RecoverAt, "recover-at", 0, "second it recovers (default: outage-at + 16)")
	fs.IntVar(&o.Duration, "duration", 0, "seconds of traffic (default: long enough to see the cooldown end and the route return)")
	fs.IntVar(&o.PerSecond, "rate", 4, "requests a second")
	fs.StringVar(&o.Envoy, "envoy", "", "your Envoy config, to check the clusters of the routes simulated against (default: no check)")
	fs.StringVar(&o.Scenario, "scenario", "outage", "outage (the first route answers 503), poison (it answers 500 to one request, retried twice) or egress (one of two replicas cannot reach it)")
	fs.StringVar(&o.Redis, "redis", "", "Redis URL the egress scenario's two replicas share (default: a redis-server from PATH)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return Run(stdout, o)
}

// checkClusters is validate -envoy's check (mainlib.CheckEnvoyClusters),
// when -envoy names the operator's Envoy config: a route the simulation
// drives whose cluster that config lacks would run here and fail in
// production, as Envoy's NC, so it is refused, named with its line; a
// route it does not drive is a warning. Without -envoy nothing is checked:
// the simulation gives every route its own provider and needs no Envoy
// config (#54: before, a config naming any cluster the shipped envoy.yaml
// lacks was refused, routes not driven included, so a newcomer had to
// write an Envoy config before trying a policy).
func checkClusters(out io.Writer, o Options, driven []*routes.Route) error {
	if o.Envoy == "" {
		fmt.Fprintln(out, "note: clusters not checked against an Envoy config (-envoy names yours); each route gets its own simulated provider")
		return nil
	}
	fb, err := routes.ReadFile(o.Config)
	if err != nil {
		return err
	}
	ev, err := os.ReadFile(o.Envoy)
	if err != nil {
		return err
	}
	cfgName := o.Config
	if cfgName == "" {
		cfgName = "embedded default config"
	}
	ec, err := mainlib.CheckEnvoyClusters(fb, cfgName, ev, o.Envoy)
	if err != nil {
		return err
	}
	for _, w := range ec.Unused {
		fmt.Fprintln(out, "warning:", w)
	}
	refused := 0
	for _, m := range ec.Missing {
		drives := false
		for _, r := range driven {
			drives = drives || strings.Contains(m, fmt.Sprintf("cluster %q:", r.Cluster))
		}
		if !drives {
			fmt.Fprintln(out, "warning:", m, "(a route this simulation does not drive)")
			continue
		}
		fmt.Fprintln(out, m)
		refused++
	}
	if refused > 0 {
		return fmt.Errorf("%d route(s) the simulation drives name a cluster %s lacks", refused, o.Envoy)
	}
	return nil
}

// pod is one Envoy with its fusebox: the egress scenario runs two.
type pod struct {
	name  string
	fb    *mainlib.Instance
	proxy *envoysim.Proxy
}

// Run runs one simulation and prints its timeline.
func Run(out io.Writer, o Options) error {
	rt, err := routes.LoadFile(o.Config)
	if err != nil {
		return err
	}
	gw, model, err := pick(rt, o.Gateway, o.Model)
	if err != nil {
		return err
	}
	switch o.Scenario {
	case "", "outage", "poison", "egress":
	default:
		return fmt.Errorf("no scenario %q: outage, poison or egress", o.Scenario)
	}
	if err := checkClusters(out, o, model.Candidates(nil)); err != nil {
		return err
	}
	first := model.Candidates(nil)[0]
	cooldown := time.Duration(first.Policy.CooldownMs) * time.Millisecond
	if o.RecoverAt == 0 {
		o.RecoverAt = o.OutageAt + 16
	}
	if o.Duration == 0 {
		o.Duration = o.RecoverAt + int(cooldown/time.Second) + 8
	}
	if o.PerSecond <= 0 {
		o.PerSecond = 4
	}

	dir, err := os.MkdirTemp("", "fusebox-simulate")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	providers := map[string]*fakeprovider.Provider{}
	defer func() {
		for _, p := range providers {
			p.Close()
		}
	}()
	for _, r := range append(append([]*routes.Route(nil), model.Candidates(nil)...), &routes.Route{Cluster: "fallback"}) {
		if providers[r.Cluster] != nil {
			continue
		}
		p, err := fakeprovider.Start(r.Cluster)
		if err != nil {
			return err
		}
		providers[r.Cluster] = p
	}

	clk := breaker.NewFakeClock(time.Now())
	logs := &logbuf.Buffer{}
	args := []string{"-admin-addr", "127.0.0.1:0", "-grace-period", "0s"}
	if o.Config != "" {
		args = append(args, "-config", o.Config)
	}
	npods := 1
	var gate *egressGate
	if o.Scenario == "egress" {
		npods = 2
		url, stop, err := fleetRedis(o.Redis, dir)
		if err != nil {
			return err
		}
		defer stop()
		args = append(args, "-redis-url", url)
		if gate, err = newEgressGate(providers[first.Cluster].Addr()); err != nil {
			return err
		}
		defer gate.close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := envoyconfig.Parse(envoy.Default)
	if err != nil {
		return err
	}
	var pods []*pod
	defer func() {
		cancel()
		for _, p := range pods {
			if p.proxy != nil {
				p.proxy.Close()
			}
			_ = p.fb.Wait()
		}
	}()
	for i := range npods {
		fb, err := mainlib.Start(ctx, append([]string{"-grpc-addr", "127.0.0.1:0"}, args...), logs, mainlib.WithClock(clk), mainlib.WithOverlayCache(""))
		if err != nil {
			return err
		}
		p := &pod{name: string(rune('A' + i)), fb: fb}
		pods = append(pods, p)
		cfg, err := envoyconfig.Harness(b)
		if err != nil {
			return err
		}
		cfg.Gateway = gw.ID
		cfg.ExtProc.Addr = fb.GRPCAddr()
		if cfg.AccessLog != nil {
			cfg.AccessLog.Addr = fb.GRPCAddr()
		}
		cfg.Clusters = map[string]*envoysim.Cluster{}
		for name, pr := range providers {
			cfg.Clusters[name] = &envoysim.Cluster{Addr: pr.Addr(), MaxRequests: 1024}
		}
		if gate != nil && i == 0 {
			// Pod A reaches the first route through its egress (the gate).
			cfg.Clusters[first.Cluster] = &envoysim.Cluster{Addr: gate.addr(), MaxRequests: 1024}
		}
		cfg.ServeDefaultsFrom(envoysim.Cluster{Addr: providers["fallback"].Addr(), MaxRequests: 1024})
		if p.proxy, err = envoysim.New(cfg); err != nil {
			return err
		}
		if err := p.proxy.Start("127.0.0.1:0"); err != nil {
			return err
		}
	}
	if npods > 1 {
		// The quorum counts replicas alive through the store (R-FD2).
		if err := waitAlive(pods, npods); err != nil {
			return err
		}
	}

	var clusters []string
	seen := map[string]bool{}
	for _, r := range model.Candidates(nil) {
		if !seen[r.Cluster] {
			seen[r.Cluster] = true
			clusters = append(clusters, r.Cluster)
		}
	}
	fmt.Fprintf(out, "fusebox simulate: %s, gateway %q, model %q, routes %s\n", nameOr(o.Config), gw.ID, model.Name, keys(model.Candidates(nil)))
	fmt.Fprintf(out, "first route %s: breaker %s\n", first.Key, describe(first.Policy))
	switch o.Scenario {
	case "poison":
		fmt.Fprintf(out, "a poison request: %s answers 500 to one request only from t=%ds to t=%ds, which its client's SDK retries twice, each second beside %d other requests; request_fault_ttl_sec %d; simulated clock (envoysim plays envoy/envoy.yaml)\n\n",
			first.Cluster, o.OutageAt, o.RecoverAt, o.PerSecond, first.Policy.RequestFaultTTLSec)
	case "egress":
		fmt.Fprintf(out, "one pod's egress: pods A and B (an Envoy and a fusebox each) share a Redis; pod A cannot reach %s (connection refused) from t=%ds to t=%ds, pod B can; %d requests a second on each pod; local_origin_quorum %d; simulated clock (envoysim plays envoy/envoy.yaml)\n\n",
			first.Cluster, o.OutageAt, o.RecoverAt, o.PerSecond, first.Policy.LocalOriginQuorum)
	default:
		fmt.Fprintf(out, "outage of %s (503) from t=%ds to t=%ds; %d requests a second; simulated clock (envoysim plays envoy/envoy.yaml)\n\n",
			first.Cluster, o.OutageAt, o.RecoverAt, o.PerSecond)
	}
	head := fmt.Sprintf("%-6s", "t")
	for _, p := range pods {
		for _, c := range clusters {
			head += fmt.Sprintf(" %-16s", column(p, npods, c))
		}
	}
	fmt.Fprintf(out, "%s %-10s %s\n", head, "breaker", "transitions")
	seenLog, errors, sent, poisonFailed := 0, 0, 0, 0
	for sec := 0; sec < o.Duration; sec++ {
		if sec == o.OutageAt {
			switch o.Scenario {
			case "poison":
				providers[first.Cluster].SetFault(fakeprovider.Fault{Status: 500, OnlyBodyContaining: poisonMark})
			case "egress":
				gate.cut(true)
			default:
				providers[first.Cluster].SetFault(fakeprovider.Fault{Status: 503})
			}
		}
		if sec == o.RecoverAt {
			providers[first.Cluster].SetFault(fakeprovider.Fault{})
			if gate != nil {
				gate.cut(false)
			}
		}
		row := fmt.Sprintf("t+%02ds ", sec)
		for _, p := range pods {
			counts := map[string][2]int{}
			for i := 0; i < o.PerSecond; i++ {
				code, by := request(p.proxy.URL(), model.Name, model.API == routes.APIAnthropic, fmt.Sprintf("hi %d %d", sec, i), -1)
				sent++
				tally(counts, by, first.Cluster, code, &errors)
			}
			if o.Scenario == "poison" {
				// One request, its SDK's two retries after it.
				for try := 0; try < 3; try++ {
					code, by := request(p.proxy.URL(), model.Name, model.API == routes.APIAnthropic, poisonMark, try)
					sent++
					if code != 200 {
						poisonFailed++
					}
					tally(counts, by, first.Cluster, code, &errors)
					if code == 200 {
						break
					}
				}
			}
			for _, c := range clusters {
				row += fmt.Sprintf(" %-16s", count(counts[c]))
			}
		}
		row += fmt.Sprintf(" %-10s", state(pods, gw.ID, first.Key))
		lines := logs.Lines()
		var trans []string
		for _, ln := range lines[seenLog:] {
			if i := strings.Index(ln, "transition="); i >= 0 && strings.Contains(ln, "[circuit_breaker]") && strings.Contains(ln, first.Key) {
				f := strings.Fields(ln[i:])
				t := strings.TrimPrefix(f[0], "transition=") + " (" + strings.TrimPrefix(f[1], "reason=")
				if strings.Contains(ln, "scope=replica") {
					t += ", one replica's own view"
				}
				trans = append(trans, t+")")
			}
		}
		seenLog = len(lines)
		fmt.Fprintln(out, strings.TrimRight(row+" "+strings.Join(trans, ", "), " "))
		clk.Advance(time.Second)
	}
	fmt.Fprintf(out, "\n%d of %d requests failed at the client.\n", errors, sent)
	if o.Scenario == "poison" {
		fmt.Fprintf(out, "the poison request failed %d times; %0.f of its failures were judged its own (fusebox_request_faults_total) and counted for no route.\n",
			poisonFailed, metric(pods, `fusebox_request_faults_total{gateway="`+gw.ID+`",model="`+model.Name+`"}`))
	}
	return nil
}

// poisonMark is in the poison request's body alone.
const poisonMark = "poison: a tool schema this provider cannot parse"

// column names a timeline column: the cluster, with its pod when there
// are two.
func column(p *pod, npods int, cluster string) string {
	if npods == 1 {
		return cluster
	}
	return p.name + ":" + cluster
}

// tally counts one request under the cluster that served it; one no
// provider answered (a refused connection: Envoy's own reply names no
// cluster) under the first route's, where it was sent.
func tally(counts map[string][2]int, by, first string, code int, errors *int) {
	if by == "" || by == "?" {
		by = first
	}
	c := counts[by]
	if code == 200 {
		c[0]++
	} else {
		c[1]++
		*errors++
	}
	counts[by] = c
}

func pick(rt *routes.Runtime, gwID, modelName string) (*routes.Gateway, *routes.Model, error) {
	if gwID == "" {
		gwID = rt.GatewayIDs[0]
	}
	gw, ok := rt.Gateway(gwID)
	if !ok {
		return nil, nil, fmt.Errorf("no gateway %q in the config", gwID)
	}
	for _, name := range gw.ModelNames {
		m := gw.Models[name]
		if (modelName == "" && len(m.Candidates(nil)) >= 2) || name == modelName {
			return gw, m, nil
		}
	}
	if modelName != "" {
		return nil, nil, fmt.Errorf("gateway %q has no model %q", gwID, modelName)
	}
	return nil, nil, errors.New("the gateway has no model with two routes or more: an outage of its only route has nowhere to go")
}

func describe(p *breaker.Policy) string {
	if !p.Enabled {
		return "disabled"
	}
	return fmt.Sprintf("failure_threshold %d in %d s, cooldown %d ms, mode %s", p.FailureThreshold, p.WindowSec, p.CooldownMs, p.Mode)
}

func keys(rs []*routes.Route) string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Key)
	}
	return strings.Join(out, ", ")
}

func nameOr(path string) string {
	if path == "" {
		return "the embedded default config"
	}
	return filepath.Base(path)
}

func count(c [2]int) string {
	switch {
	case c[0] == 0 && c[1] == 0:
		return "-"
	case c[1] == 0:
		return fmt.Sprintf("%d ok", c[0])
	}
	return fmt.Sprintf("%d ok, %d errors", c[0], c[1])
}

// request sends one request of content; retry ≥ 0 sends the OpenAI
// SDK's retry count header (its tries after the first are retries).
func request(base, model string, anthropic bool, content string, retry int) (int, string) {
	path, body := "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, content)
	if anthropic {
		path, body = "/v1/messages", fmt.Sprintf(`{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":%q}]}`, model, content)
	}
	req, err := http.NewRequest("POST", base+path, strings.NewReader(body))
	if err != nil {
		return 0, "?"
	}
	req.Header.Set("content-type", "application/json")
	if retry >= 0 {
		req.Header.Set("x-stainless-retry-count", strconv.Itoa(retry))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "?"
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Served-By")
}

// state is the first route's breaker: the first pod's view of the fleet's,
// and each pod's own view where one opened it (scope replica, R-FD3).
func state(pods []*pod, gw, route string) string {
	fleet := "closed"
	var own []string
	for i, p := range pods {
		resp, err := http.Get("http://" + p.fb.AdminAddr() + "/admin/v1/gateways/" + gw + "/circuit-breaker")
		if err != nil {
			return "?"
		}
		var v map[string]struct {
			State        string `json:"state"`
			ReplicaScope *struct {
				State string `json:"state"`
			} `json:"replica_scope"`
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil {
			return "?"
		}
		s, ok := v[route]
		if i == 0 && ok {
			fleet = s.State
		}
		if ok && s.ReplicaScope != nil && s.ReplicaScope.State != "closed" {
			own = append(own, p.name+" own: "+s.ReplicaScope.State)
		}
	}
	if len(own) == 0 {
		return fleet
	}
	return fleet + " (" + strings.Join(own, ", ") + ")"
}

// metric sums one series over the pods' /metrics.
func metric(pods []*pod, series string) float64 {
	var sum float64
	for _, p := range pods {
		resp, err := http.Get("http://" + p.fb.AdminAddr() + "/metrics")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, ln := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(ln, series+" "); ok {
				f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
				sum += f
			}
		}
	}
	return sum
}
