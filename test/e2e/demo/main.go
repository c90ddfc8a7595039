// Command demo shows fusebox at work without Envoy: fusebox on its embedded
// default config, the Envoy-playing proxy and two fake providers, twice side
// by side: configured from envoy/envoy.yaml (no failover) and from
// envoy/envoy-failover.yaml (Envoy >= 1.40, failover.max_attempts 2). It
// drives traffic through an outage of the first route and its recovery and
// prints a per-second timeline of both.
//
//	make demo            real time (about 45 s: the default cooldown is 30 s)
//	go run ./test/e2e/demo -fast   the same timeline on a simulated clock
//	go run ./test/e2e/demo -headroom [-fast]   a provider's quota routed
//	                     around before it runs out (rate-limit headroom)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/fusebox-llm/fusebox/cmd/extproc/mainlib"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/test/e2e/envoyconfig"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
	"github.com/fusebox-llm/fusebox/test/e2e/logbuf"
)

func main() {
	fast := flag.Bool("fast", false, "run the timeline on a simulated clock (seconds pass instantly)")
	headroom := flag.Bool("headroom", false, "show the rate-limit headroom instead: a provider's quota routed around before it runs out")
	serve := flag.String("serve", "", "keep a fusebox running with its outage repeating, its dashboard on this admin address (e.g. 127.0.0.1:8090), until interrupted")
	flag.Parse()
	if *serve != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := runServe(ctx, os.Stdout, options{serve: *serve}); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
		return
	}
	if *headroom {
		if _, _, err := runHeadroom(os.Stdout, options{fast: *fast}); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
		return
	}
	if _, err := run(os.Stdout, options{fast: *fast}); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type options struct {
	fast        bool
	outageAt    int // second the first provider starts failing
	recoverAt   int // second it is healthy again
	duration    int // seconds of traffic
	perSecond   int // requests per second
	envoyConfig string
	// serve: the admin address of a fusebox kept running with its
	// incident repeating, for the dashboard (serve.go); "" = the timeline.
	serve string
}

// summary is what the demo measured.
type summary struct {
	clientErrors     int
	requests         int
	transitions      []string
	servedBy         map[string]int
	backOnFirstRoute bool
	// rampSeconds counts the seconds after the close in which both routes
	// served: the first one earning its traffic back (R-D8).
	rampSeconds int
}

func repoFile(rel string) string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "..", "..", rel)
}

// lane is one deployment under the same outage: fusebox, envoysim playing
// an Envoy config, and the two providers.
type lane struct {
	name          string
	first, second *fakeprovider.Provider
	fb            *mainlib.Instance
	proxy         *envoysim.Proxy
	fake          *breaker.FakeClock
	logs          *logbuf.Buffer
	seenLog       int
	s             *summary
	stop          func()
}

func run(out io.Writer, o options) (*summary, error) {
	plain, withFailover, err := runBoth(out, o)
	_ = withFailover
	return plain, err
}

// runBoth runs the outage twice at once, on the shipped deployment
// (envoy/envoy.yaml, no failover) and on the failover one
// (envoy/envoy-failover.yaml, failover.max_attempts 2 set through the admin
// API), and prints them side by side.
func runBoth(out io.Writer, o options) (plain, failover *summary, err error) {
	if o.outageAt == 0 {
		// The close comes at about t+35 s (a 30 s cooldown); the ramp
		// then runs 20 s.
		o.outageAt, o.recoverAt, o.duration, o.perSecond = 4, 20, 58, 4
	}
	if o.envoyConfig == "" {
		o.envoyConfig = repoFile("envoy/envoy.yaml")
	}
	a, err := startLane("without failover", o, o.envoyConfig, false)
	if err != nil {
		return nil, nil, err
	}
	defer a.stop()
	b, err := startLane("with failover", o, repoFile("envoy/envoy-failover.yaml"), true)
	if err != nil {
		return nil, nil, err
	}
	defer b.stop()
	lanes := []*lane{a, b}

	fmt.Fprintf(out, "fusebox demo: gateway \"default\", model gpt-4o-mini, routes openai:us-east (first) and azure:eu-west\n")
	fmt.Fprintf(out, "breaker: failure_threshold 5 in 60 s, cooldown 30 s (the embedded default config), recovery ramp 20 s from 25 %%\n")
	fmt.Fprintf(out, "outage of openai_us_east from t=%ds to t=%ds; %d requests a second to each deployment\n", o.outageAt, o.recoverAt, o.perSecond)
	fmt.Fprintf(out, "left: envoy/envoy.yaml (no failover); right: envoy/envoy-failover.yaml with failover.max_attempts 2\n\n")
	fmt.Fprintf(out, "%-5s | %-16s %-16s %-10s | %-16s %-16s %-10s %s\n", "t", "openai_us_east", "azure_eu_west", "breaker",
		"openai_us_east", "azure_eu_west", "breaker", "transitions (left / right)")
	start := time.Now()
	for sec := 0; sec < o.duration; sec++ {
		for _, l := range lanes {
			if sec == o.outageAt {
				l.first.SetFault(fakeprovider.Fault{Status: 503})
			}
			if sec == o.recoverAt {
				l.first.SetFault(fakeprovider.Fault{})
			}
		}
		row := fmt.Sprintf("t+%02ds ", sec)
		var trans []string
		for _, l := range lanes {
			counts := map[string][2]int{} // provider → ok, errors
			for i := 0; i < o.perSecond; i++ {
				code, by := request(l.proxy.URL(), i%2 == 0)
				l.s.requests++
				c := counts[by]
				if code == 200 {
					c[0]++
					l.s.servedBy[by]++
				} else {
					c[1]++
					l.s.clientErrors++
				}
				counts[by] = c
				if !o.fast {
					time.Sleep(time.Second / time.Duration(2*o.perSecond+1))
				}
			}
			// With failover the client only sees the route that answered;
			// the attempts the first route failed are in envoysim's log.
			failed := 0
			for _, at := range l.proxy.Attempts() {
				if at.Cluster == "openai_us_east" && at.Status != 200 {
					failed++
				}
			}
			first := fmtCount(counts["openai_us_east"])
			if failed > 0 && counts["openai_us_east"][1] == 0 {
				first = fmt.Sprintf("%d retried", failed)
			}
			if sec >= o.recoverAt+2 && counts["openai_us_east"][0] > 0 {
				l.s.backOnFirstRoute = true
				if counts["azure_eu_west"][0] > 0 {
					l.s.rampSeconds++ // both served: the first route on its ramp
				}
			}
			row += fmt.Sprintf("| %-16s %-16s %-10s ", first, fmtCount(counts["azure_eu_west"]), breakerState(l.fb.AdminAddr()))
			var t []string
			lines := l.logs.Lines()
			for _, ln := range lines[l.seenLog:] {
				if i := strings.Index(ln, "transition="); i >= 0 && strings.Contains(ln, "[circuit_breaker]") {
					f := strings.Fields(ln[i:])
					tr := strings.TrimPrefix(f[0], "transition=") + " (" + strings.TrimPrefix(f[1], "reason=") + ")"
					t = append(t, tr)
					l.s.transitions = append(l.s.transitions, tr)
				}
			}
			l.seenLog = len(lines)
			trans = append(trans, strings.Join(t, ", "))
		}
		if trans[0] != "" || trans[1] != "" {
			row += strings.Join(trans, " / ")
		}
		fmt.Fprintln(out, strings.TrimRight(row, " "))
		nextSecond(lanes, o, start, sec)
	}
	fmt.Fprintf(out, "\n%s\n\n%s\n", explain(a.s, o), explainFailover(b.s, a.s))
	return a.s, b.s, nil
}

// startLane starts fusebox (embedded default config), envoysim playing
// envoyYAML and two providers; with failover, the gateway's
// failover.max_attempts is set to 2 through the admin API.
func startLane(name string, o options, envoyYAML string, failover bool, edits ...func(string) string) (*lane, error) {
	l := &lane{name: name, logs: &logbuf.Buffer{}, s: &summary{servedBy: map[string]int{}}}
	var closers []func()
	l.stop = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	var err error
	if l.first, err = fakeprovider.Start("openai_us_east"); err != nil {
		return nil, err
	}
	closers = append(closers, l.first.Close)
	if l.second, err = fakeprovider.Start("azure_eu_west"); err != nil {
		l.stop()
		return nil, err
	}
	closers = append(closers, l.second.Close)
	var opts []mainlib.Option
	if o.fast {
		l.fake = breaker.NewFakeClock(time.Now())
		opts = append(opts, mainlib.WithClock(l.fake))
	}
	adminAddr := "127.0.0.1:0"
	if o.serve != "" && !failover {
		adminAddr = o.serve
	}
	args := []string{"-grpc-addr", "127.0.0.1:0", "-admin-addr", adminAddr, "-grace-period", "0s"}
	// The embedded default config with a recovery ramp (R-D8: after the
	// probe closes the breaker the route earns its traffic back over 20 s
	// from 25 %), and, with failover, told that the attempt role runs
	// (envoy.failover, R-X8).
	dir, err := os.MkdirTemp("", "fusebox-demo")
	if err != nil {
		l.stop()
		return nil, err
	}
	closers = append(closers, func() { os.RemoveAll(dir) })
	doc := strings.Replace(string(routes.DefaultConfig()), "    cooldown_ms: 30000\n", "    cooldown_ms: 30000\n    recovery_ramp_sec: 20\n    recovery_ramp_start_percent: 25\n", 1)
	if failover {
		doc = "envoy: {failover: true}\n" + doc
	}
	for _, e := range edits {
		doc = e(doc)
	}
	path := filepath.Join(dir, "fusebox.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		l.stop()
		return nil, err
	}
	args = append(args, "-config", path)
	ctx, cancel := context.WithCancel(context.Background())
	l.fb, err = mainlib.Start(ctx, args, l.logs, opts...)
	if err != nil {
		cancel()
		l.stop()
		return nil, err
	}
	fb := l.fb
	closers = append(closers, func() { cancel(); _ = fb.Wait() })
	if failover {
		req, _ := http.NewRequest(http.MethodPatch, "http://"+fb.AdminAddr()+"/admin/v1/gateways/default", strings.NewReader(`{"failover": {"max_attempts": 2}}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			l.stop()
			return nil, err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			l.stop()
			return nil, fmt.Errorf("setting failover.max_attempts: %s", resp.Status)
		}
	}
	b, err := envoyconfig.Load(envoyYAML)
	if err != nil {
		l.stop()
		return nil, err
	}
	cfg, err := envoyconfig.Harness(b)
	if err != nil {
		l.stop()
		return nil, err
	}
	cfg.ExtProc.Addr = fb.GRPCAddr()
	if cfg.AccessLog != nil {
		cfg.AccessLog.Addr = fb.GRPCAddr()
	}
	if cfg.Failover != nil {
		fo := *cfg.Failover
		fo.Attempt.Addr = fb.GRPCAddr()
		cfg.Failover = &fo
	}
	cfg.Clusters["openai_us_east"].Addr = l.first.Addr()
	cfg.Clusters["azure_eu_west"].Addr = l.second.Addr()
	if l.proxy, err = envoysim.New(cfg); err != nil {
		l.stop()
		return nil, err
	}
	if err := l.proxy.Start("127.0.0.1:0"); err != nil {
		l.stop()
		return nil, err
	}
	closers = append(closers, l.proxy.Close)
	return l, nil
}

func explainFailover(f, plain *summary) string {
	return fmt.Sprintf(`With failover (right): the same outage cost clients %d errors instead of %d. Each request that
openai_us_east failed was retried by Envoy, within the same client request, on the next route of
fusebox's chain (azure_eu_west, with its own path, model and credential); fusebox's attempt role
recorded each failed attempt against openai:us-east, so the breaker still opened at the 5th
failure and from then on no attempt went to the failing provider. Transitions: %s.

Limits: a request makes at most max_attempts attempts (here 2, through x-envoy-max-retries); the
retry budget in envoy-failover.yaml admits a retry for every request in flight (a fixed
max_retries of 3 would leave all but three unretried during an outage); when every route of the
chain fails, the client gets the last attempt's answer (that provider's error, or Envoy's 503
when it could not connect).`,
		f.clientErrors, plain.clientErrors, strings.Join(f.transitions, "; "))
}

func fmtCount(c [2]int) string {
	if c[0] == 0 && c[1] == 0 {
		return "-"
	}
	if c[1] == 0 {
		return fmt.Sprintf("%d ok", c[0])
	}
	return fmt.Sprintf("%d ok, %d errors", c[0], c[1])
}

func request(base string, stream bool) (int, string) {
	body := fmt.Sprintf(`{"model":"gpt-4o-mini","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "?"
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Served-By")
}

func breakerState(admin string) string {
	resp, err := http.Get("http://" + admin + "/admin/v1/gateways/default/circuit-breaker")
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, st := range []string{"half_open", "open"} {
		if strings.Contains(string(b), `"openai:us-east:gpt-4o-mini":{`) && strings.Contains(string(b), `"state":"`+st+`"`) {
			return st
		}
	}
	return "closed"
}

func explain(s *summary, o options) string {
	names := make([]string, 0, len(s.servedBy))
	for n := range s.servedBy {
		names = append(names, n)
	}
	sort.Strings(names)
	var served []string
	for _, n := range names {
		served = append(served, fmt.Sprintf("%s %d", n, s.servedBy[n]))
	}
	return fmt.Sprintf(`What happened: at t=%ds openai_us_east began answering 503. fusebox counted each 503 as a
failure of route openai:us-east:gpt-4o-mini and, at the 5th failure in the window, opened its
breaker; from then on it wrote azure_eu_west into x-fusebox-cluster before Envoy dispatched, so
clients stopped seeing errors (%d of %d requests failed in all — the five that tripped the breaker).
After the 30 s cooldown the breaker went half-open and let one probe through; the provider had
recovered at t=%ds, the probe succeeded and the breaker closed. Traffic then returned to the first
route gradually (recovery_ramp_sec 20: from 25 %% of its share to all of it, the rest still on
azure_eu_west, %d seconds with both serving), so a provider that came back half-healthy is not
flooded at once (%s). Transitions: %s.`,
		o.outageAt, s.clientErrors, s.requests, o.recoverAt, s.rampSeconds, strings.Join(served, ", "), strings.Join(s.transitions, "; "))
}

// nextSecond ends second sec of the timeline: a simulated clock moves on
// by a second, a real one is waited for.
func nextSecond(lanes []*lane, o options, start time.Time, sec int) {
	for _, l := range lanes {
		if o.fast {
			l.fake.Advance(time.Second)
		}
	}
	if !o.fast {
		if wait := time.Until(start.Add(time.Duration(sec+1) * time.Second)); wait > 0 {
			time.Sleep(wait)
		}
	}
}
