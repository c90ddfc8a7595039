// Package simulate tries an operator's own config without Envoy (extproc
// simulate): the real fusebox on that config, envoysim playing the shipped
// envoy.yaml, and one fake provider per route of one model. It drives a
// scripted outage of the model's first route on a simulated clock and
// prints the per-second timeline `make demo` prints: what each route
// served, the first route's breaker, each transition.
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
	args := []string{"-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-grace-period", "0s"}
	if o.Config != "" {
		args = append(args, "-config", o.Config)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fb, err := mainlib.Start(ctx, args, logs, mainlib.WithClock(clk))
	if err != nil {
		return err
	}
	defer func() { cancel(); _ = fb.Wait() }()

	b, err := envoyconfig.Parse(envoy.Default)
	if err != nil {
		return err
	}
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
	for name, p := range providers {
		cfg.Clusters[name] = &envoysim.Cluster{Addr: p.Addr(), MaxRequests: 1024}
	}
	cfg.ServeDefaultsFrom(envoysim.Cluster{Addr: providers["fallback"].Addr(), MaxRequests: 1024})
	proxy, err := envoysim.New(cfg)
	if err != nil {
		return err
	}
	if err := proxy.Start("127.0.0.1:0"); err != nil {
		return err
	}
	defer proxy.Close()

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
	fmt.Fprintf(out, "outage of %s (503) from t=%ds to t=%ds; %d requests a second; simulated clock (envoysim plays envoy/envoy.yaml)\n\n",
		first.Cluster, o.OutageAt, o.RecoverAt, o.PerSecond)
	head := fmt.Sprintf("%-6s", "t")
	for _, c := range clusters {
		head += fmt.Sprintf(" %-16s", c)
	}
	fmt.Fprintf(out, "%s %-10s %s\n", head, "breaker", "transitions")
	seenLog, errors := 0, 0
	for sec := 0; sec < o.Duration; sec++ {
		if sec == o.OutageAt {
			providers[first.Cluster].SetFault(fakeprovider.Fault{Status: 503})
		}
		if sec == o.RecoverAt {
			providers[first.Cluster].SetFault(fakeprovider.Fault{})
		}
		counts := map[string][2]int{}
		for i := 0; i < o.PerSecond; i++ {
			code, by := request(proxy.URL(), model.Name, model.API == routes.APIAnthropic)
			c := counts[by]
			if code == 200 {
				c[0]++
			} else {
				c[1]++
				errors++
			}
			counts[by] = c
		}
		row := fmt.Sprintf("t+%02ds ", sec)
		for _, c := range clusters {
			row += fmt.Sprintf(" %-16s", count(counts[c]))
		}
		row += fmt.Sprintf(" %-10s", state(fb.AdminAddr(), gw.ID, first.Key))
		lines := logs.Lines()
		var trans []string
		for _, ln := range lines[seenLog:] {
			if i := strings.Index(ln, "transition="); i >= 0 && strings.Contains(ln, "[circuit_breaker]") && strings.Contains(ln, first.Key) {
				f := strings.Fields(ln[i:])
				trans = append(trans, strings.TrimPrefix(f[0], "transition=")+" ("+strings.TrimPrefix(f[1], "reason=")+")")
			}
		}
		seenLog = len(lines)
		fmt.Fprintln(out, strings.TrimRight(row+" "+strings.Join(trans, ", "), " "))
		clk.Advance(time.Second)
	}
	fmt.Fprintf(out, "\n%d of %d requests failed at the client.\n", errors, o.Duration*o.PerSecond)
	return nil
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

func request(base, model string, anthropic bool) (int, string) {
	path, body := "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model)
	if anthropic {
		path, body = "/v1/messages", fmt.Sprintf(`{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`, model)
	}
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "?"
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Served-By")
}

func state(admin, gw, route string) string {
	resp, err := http.Get("http://" + admin + "/admin/v1/gateways/" + gw + "/circuit-breaker")
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	var v map[string]struct {
		State string `json:"state"`
	}
	if json.NewDecoder(resp.Body).Decode(&v) != nil {
		return "?"
	}
	if s, ok := v[route]; ok {
		return s.State
	}
	return "closed"
}
