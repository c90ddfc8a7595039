// Command demo shows fusebox at work without Envoy: fusebox on its embedded
// default config, the Envoy-playing proxy configured from envoy/envoy.yaml,
// and two fake providers. It drives traffic through an outage of the first
// route and its recovery and prints a per-second timeline.
//
//	make demo            real time (about 45 s: the default cooldown is 30 s)
//	go run ./test/e2e/demo -fast   the same timeline on a simulated clock
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/fusebox-llm/fusebox/cmd/extproc/mainlib"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/test/e2e/envoyconfig"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
	"github.com/fusebox-llm/fusebox/test/e2e/logbuf"
)

func main() {
	fast := flag.Bool("fast", false, "run the timeline on a simulated clock (seconds pass instantly)")
	flag.Parse()
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
}

// summary is what the demo measured.
type summary struct {
	clientErrors     int
	requests         int
	transitions      []string
	servedBy         map[string]int
	backOnFirstRoute bool
}

func repoFile(rel string) string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "..", "..", rel)
}

func run(out io.Writer, o options) (*summary, error) {
	if o.outageAt == 0 {
		o.outageAt, o.recoverAt, o.duration, o.perSecond = 4, 20, 42, 4
	}
	if o.envoyConfig == "" {
		o.envoyConfig = repoFile("envoy/envoy.yaml")
	}
	// Providers for the embedded config's two clusters.
	first, err := fakeprovider.Start("openai_us_east")
	if err != nil {
		return nil, err
	}
	defer first.Close()
	second, err := fakeprovider.Start("azure_eu_west")
	if err != nil {
		return nil, err
	}
	defer second.Close()

	// fusebox on its embedded default config.
	var clk breaker.Clock
	var fake *breaker.FakeClock
	opts := []mainlib.Option{}
	if o.fast {
		fake = breaker.NewFakeClock(time.Now())
		clk = fake
		opts = append(opts, mainlib.WithClock(clk))
	}
	logs := &logbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	fb, err := mainlib.Start(ctx, []string{"-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-grace-period", "0s"}, logs, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	defer func() { cancel(); _ = fb.Wait() }()

	// Envoy, played by envoysim from envoy/envoy.yaml.
	b, err := envoyconfig.Load(o.envoyConfig)
	if err != nil {
		return nil, err
	}
	cfg, err := envoyconfig.Harness(b)
	if err != nil {
		return nil, err
	}
	cfg.ExtProc.Addr = fb.GRPCAddr()
	cfg.Clusters["openai_us_east"].Addr = first.Addr()
	cfg.Clusters["azure_eu_west"].Addr = second.Addr()
	proxy, err := envoysim.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := proxy.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	defer proxy.Close()

	fmt.Fprintf(out, "fusebox demo: gateway \"default\", model gpt-4o-mini, routes openai:us-east (first) and azure:eu-west\n")
	fmt.Fprintf(out, "breaker: failure_threshold 5 in 60 s, cooldown 30 s (the embedded default config)\n")
	fmt.Fprintf(out, "outage of openai_us_east from t=%ds to t=%ds; %d requests a second\n\n", o.outageAt, o.recoverAt, o.perSecond)
	fmt.Fprintf(out, "%-6s %-22s %-22s %-12s %s\n", "t", "openai_us_east", "azure_eu_west", "breaker", "transitions")

	s := &summary{servedBy: map[string]int{}}
	seenLog := 0
	start := time.Now()
	for sec := 0; sec < o.duration; sec++ {
		if sec == o.outageAt {
			first.SetFault(fakeprovider.Fault{Status: 503})
		}
		if sec == o.recoverAt {
			first.SetFault(fakeprovider.Fault{})
		}
		counts := map[string][2]int{} // provider → ok, errors
		for i := 0; i < o.perSecond; i++ {
			code, by := request(proxy.URL(), i%2 == 0)
			s.requests++
			c := counts[by]
			if code == 200 {
				c[0]++
				s.servedBy[by]++
			} else {
				c[1]++
				s.clientErrors++
			}
			counts[by] = c
			if !o.fast {
				time.Sleep(time.Second / time.Duration(o.perSecond+1))
			}
		}
		if sec >= o.recoverAt+2 && counts["openai_us_east"][0] > 0 {
			s.backOnFirstRoute = true
		}
		state := breakerState(fb.AdminAddr())
		var trans []string
		lines := logs.Lines()
		for _, l := range lines[seenLog:] {
			if i := strings.Index(l, "transition="); i >= 0 && strings.Contains(l, "[circuit_breaker]") {
				f := strings.Fields(l[i:])
				t := strings.TrimPrefix(f[0], "transition=") + " (" + strings.TrimPrefix(f[1], "reason=") + ")"
				trans = append(trans, t)
				s.transitions = append(s.transitions, t)
			}
		}
		seenLog = len(lines)
		fmt.Fprintf(out, "t+%02ds  %-22s %-22s %-12s %s\n", sec, fmtCount(counts["openai_us_east"]), fmtCount(counts["azure_eu_west"]), state, strings.Join(trans, ", "))
		if o.fast {
			fake.Advance(time.Second)
		} else if wait := time.Until(start.Add(time.Duration(sec+1) * time.Second)); wait > 0 {
			time.Sleep(wait)
		}
	}
	fmt.Fprintf(out, "\n%s\n", explain(s, o))
	return s, nil
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
recovered at t=%ds, the probe succeeded and the breaker closed, so traffic returned to the first
route (%s). Transitions: %s.`,
		o.outageAt, s.clientErrors, s.requests, o.recoverAt, strings.Join(served, ", "), strings.Join(s.transitions, "; "))
}
