package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
	dto "github.com/prometheus/client_model/go"
)

// Report is what a run found.
type Report struct {
	Store       string // memory | redis
	Requests    int
	Duration    time.Duration
	ByStatus    map[int]int
	Errors      map[string]int // transport errors by cause
	Outcomes    map[string]float64
	Transitions int
	Faults      map[string]int
	// FaultEffects counts the steps seen to take effect (effects.go), and
	// NoEffect says what each of the others lacked.
	FaultEffects map[string]int
	NoEffect     []string
	// CutShort lists the provider faults the load's end cut short before
	// any request met them (at most the schedule's last step): with no
	// traffic left they could not bite, so they are neither injected nor
	// judged (tally).
	CutShort []string
	// BrokenChain is the log around the first broken transition chain
	// (checkTransitions), printed with the report.
	BrokenChain []string
	// ReloadsApplied counts fusebox's successful reloads over the run.
	ReloadsApplied                         float64
	DecisionP50, DecisionP99, DecisionP999 time.Duration
	LongestWait                            time.Duration // Envoy's longest wait for a request-path reply
	EnvoyGaveUp                            int           // ext_proc message timeouts (Envoy went on without fusebox)
	PeakRSS                                int64
	PeakGoroutines                         int
	// The warm-up's peak, and the goroutines run at once before the
	// baseline (raiseGoroutineMark): a load peaking below the mark makes
	// no goroutine descriptor the baseline lacks.
	WarmupPeakGoroutines, GoroutineMark int
	MarkBytes                           int64 // what the mark's descriptors added to the heap
	// The measuring points before and after the load.
	Before, After point
	Invariants    []Check
}

// Check is one invariant and whether it held.
type Check struct {
	Name   string
	Held   bool
	Detail string
}

// Failed lists the invariants that broke.
func (r *Report) Failed() []Check {
	var out []Check
	for _, c := range r.Invariants {
		if !c.Held {
			out = append(out, c)
		}
	}
	return out
}

// Run drives one campaign.
func Run(opts Options) (*Report, error) {
	dir, err := os.MkdirTemp("", "fusebox-soak-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	r, err := newRig(opts, dir)
	if err != nil {
		return nil, err
	}
	defer r.close()
	rep := &Report{ByStatus: map[int]int{}, Errors: map[string]int{}, Faults: map[string]int{}, FaultEffects: map[string]int{}, Store: "memory"}
	if opts.Redis {
		rep.Store = "redis"
	}
	if opts.Replicas > 1 {
		rep.Store = fmt.Sprintf("redis, %d replicas (one %v skewed)", opts.Replicas, opts.Skew)
	}

	// Warm up at the same concurrency (connection pools reach their
	// steady size), then take the baseline of goroutines and memory. With
	// WarmupFaults the warm-up also runs the fault schedule once, so that
	// what a fault costs the first time only (a code path's lazy set-up, a
	// second fusebox's allocations, the allocator's spans after a restart)
	// is in the baseline, and the comparison measures what the load
	// accumulates.
	var mu sync.Mutex
	warm := samplePeak()
	r.drive(max(2000, 50*opts.Concurrency), opts.Concurrency, 0, nil, nil)
	if opts.Faults && opts.WarmupFaults {
		done := make(chan struct{})
		go func() { defer close(done); r.faults(nil, opts.FaultEvery, rep, &mu, 1) }()
		r.drive(math.MaxInt, opts.Concurrency, opts.Rate, nil, done)
		for _, p := range r.providers {
			p.SetFault(fakeprovider.Fault{})
			_ = p.Up()
		}
		time.Sleep(4 * time.Second) // probes time out, breakers settle
	}
	r.proxy.ResetLog() // the harness's access log is not fusebox's memory
	rep.WarmupPeakGoroutines = warm.end()
	rep.GoroutineMark = max(4096, 4*rep.WarmupPeakGoroutines) // a busy machine's load peaked at 916, its warm-up at 323
	rep.MarkBytes = raiseGoroutineMark(rep.GoroutineMark)
	rep.Before = r.settle()

	record := func(status int, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			rep.Errors[err.Error()]++
			return
		}
		rep.ByStatus[status]++
	}
	stopPeak := make(chan struct{})
	var peakWG sync.WaitGroup
	peakWG.Add(1)
	go func() {
		defer peakWG.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopPeak:
				return
			case <-t.C:
				r.proxy.ResetLog()
				r.sampleCounts(&r.counts)
				mu.Lock()
				rep.PeakGoroutines = max(rep.PeakGoroutines, runtime.NumGoroutine())
				rep.PeakRSS = max(rep.PeakRSS, memory())
				mu.Unlock()
			}
		}
	}()
	stopFaults := make(chan struct{})
	var faultWG sync.WaitGroup
	if opts.Faults {
		faultWG.Add(1)
		go func() { defer faultWG.Done(); r.faults(stopFaults, opts.FaultEvery, rep, &mu, 0) }()
	}
	load := samplePeak()
	start := time.Now()
	r.drive(opts.Requests, opts.Concurrency, opts.Rate, record, nil)
	rep.Duration = time.Since(start)
	rep.Requests = opts.Requests
	close(stopFaults)
	faultWG.Wait()
	close(stopPeak)
	peakWG.Wait()
	rep.PeakGoroutines = max(rep.PeakGoroutines, load.end())
	// Every fault cleared: let probes time out and breakers settle.
	for _, p := range r.providers {
		p.SetFault(fakeprovider.Fault{})
		_ = p.Up()
	}
	time.Sleep(4 * time.Second)
	r.proxy.ResetLog()
	rep.After = r.settle()
	r.check(rep)
	return rep, nil
}

// drive sends n requests over conc workers, or until stop is closed (nil:
// never); record (may be nil) is told of each answer.
func (r *rig) drive(n, conc, rate int, record func(int, error), stop <-chan struct{}) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var tokens <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Second / time.Duration(rate))
		defer t.Stop()
		tokens = t.C
	}
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > n {
					return
				}
				select {
				case <-stop:
					return
				default:
				}
				if tokens != nil {
					<-tokens
				}
				r.gate.RLock()
				r.inflight.Add(1)
				status, err := r.request(i)
				r.inflight.Add(-1)
				r.gate.RUnlock()
				if record != nil {
					record(status, err)
				}
			}
		}()
	}
	wg.Wait()
}

// faults runs the schedule until stop, or for cycles full cycles (0 = no
// limit).
func (r *rig) faults(stop <-chan struct{}, every time.Duration, rep *Report, mu *sync.Mutex, cycles int) {
	// The reload comes early: it applies once the file settles (two
	// seconds), and a fusebox restart before then reads the new file at
	// start, a reload that never happened.
	steps := []string{"503_burst", "reload", "refused", "reset_mid_stream", "slow_first_token", "429_retry_after", "force_open", "fusebox_restart"}
	if r.redis != nil {
		steps = append(steps, "redis_restart")
	}
	if r.rproxy != nil {
		steps = append(steps, "redis_stall", "redis_slow", "redis_flushall")
	}
	for i := 0; ; i++ {
		if cycles > 0 && i >= cycles*len(steps) {
			return
		}
		select {
		case <-stop:
			return
		case <-time.After(every):
		}
		step := steps[i%len(steps)]
		// A fault goes to a model's first route, which takes its traffic
		// (the others see only what fails over): a 429 on a second route
		// met no request, and the soak counted it survived. The two
		// alternate by step and by cycle, so each fault meets both
		// (faultTarget).
		p := r.providers[primaryProviders[faultTarget(i, len(steps))]]
		before := r.evidence(p)
		var after evidence
		redisFault := strings.HasPrefix(step, "redis_")
		if redisFault {
			// The fault's window, and a second after it (the resync):
			// held against the rest of the run (check).
			r.proxy.Stats().MarkWindow(true)
		}
		switch step {
		case "503_burst":
			p.SetFault(fakeprovider.Fault{Status: 503})
		case "refused":
			// New connections refused; the requests in flight end as
			// they would (fakeprovider.Refuse: Down's RST could lose a
			// response the provider had tallied complete).
			p.Refuse()
		case "reset_mid_stream":
			p.SetFault(fakeprovider.Fault{ResetMidStream: true})
		case "slow_first_token":
			p.SetFault(fakeprovider.Fault{SlowFirstToken: 300 * time.Millisecond})
		case "429_retry_after":
			p.SetFault(fakeprovider.Fault{Status: 429, RetryAfter: "1"})
		case "reload":
			// Alternate the policy: the reload applies after the file
			// settles (two seconds).
			r.threshold = 7 - r.threshold // 3 ↔ 4
			_ = r.writeConfig(strings.TrimSuffix(r.cfgPath, "/fusebox.yaml"))
		case "force_open":
			after.adminStatus = r.admin("POST", "/admin/v1/gateways/default/routes/"+routeOf[p.Name]+"/force-open", `{"duration_sec": 2}`)
		case "redis_restart":
			// Redis killed under load (its data is lost: a cache-only
			// Redis), down for a while, restarted: fusebox decides and
			// records on local state meanwhile, then resyncs.
			r.epoch.Add(1)
			r.redis.Stop()
			// Redis answers nothing more of its old state: the shared
			// transitions' chain begins again (checkTransitions).
			r.logs.Write([]byte("=== redis restarted\n"))
			time.Sleep(every)
			if err := r.redis.Restart(); err != nil {
				after.restartError = err
				r.logs.Write([]byte("=== redis restart failed: " + err.Error() + "\n"))
			}
			r.epoch.Add(1)
		case "redis_stall":
			// Redis accepts and answers nothing for 2 s (a fork, a
			// failover, CLIENT PAUSE): no decision may wait for it.
			r.rproxy.Stall(true)
			time.Sleep(2 * time.Second)
			untilGrows(r.rproxy.Held, before.held)
			r.rproxy.Stall(false)
		case "redis_slow":
			r.rproxy.Latency(5*time.Millisecond, 5*time.Millisecond)
			time.Sleep(every)
			untilGrows(r.rproxy.Delayed, before.delayed)
			r.rproxy.Latency(0, 0)
		case "redis_flushall":
			// Every key gone at once (an emptied or replaced Redis).
			r.epoch.Add(1)
			after.restartError = r.rdb.FlushAll(context.Background()).Err()
			r.epoch.Add(1)
			r.logs.Write([]byte("=== redis flushed\n"))
		case "fusebox_restart":
			// Quiesce (nothing in flight), kill fusebox, serve a while
			// without it (failure_mode_allow), restart.
			r.gate.Lock()
			// In the observer profile the clients are done before fusebox
			// has read what was observed: the side streams still carry the
			// responses' tails (one way, never waited for). A kill then
			// loses an outcome fusebox was never given time to see, which
			// the count check read as one success short (7,588 of 7,589,
			// both cores busy). Nothing is in flight until they end too.
			for deadline := time.Now().Add(5 * time.Second); r.proxy.ObserversOpen() > 0 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			r.epoch.Add(1)
			r.stopFusebox()
			r.gate.Unlock()
			time.Sleep(every / 2)
			r.gate.Lock()
			after.restartError = r.startFusebox()
			r.epoch.Add(1)
			r.gate.Unlock()
		}
		if redisFault {
			time.AfterFunc(time.Second, func() { r.proxy.Stats().MarkWindow(false) })
		}
		held := !strings.HasPrefix(step, "redis_") && step != "reload" && step != "force_open" && step != "fusebox_restart"
		// cut: the load ended within the fault's window.
		cut := false
		if held { // the provider's fault lasts a pause
			select {
			case <-stop:
				cut = true
			case <-time.After(every):
			}
			// ...and longer, up to five pauses more, while no request met
			// it: on a loaded machine a route the last fault opened or
			// blocked may take no request in one pause (the loaded CI run
			// at 00d19b9: a 429 on anthropic_us answered nobody). A fault
			// that never bites in six pauses is still reported.
			for extra := time.Now().Add(5 * every); time.Now().Before(extra); {
				if ok, _ := tookEffect(step, before, r.evidence(p)); ok {
					break
				}
				select {
				case <-stop:
					extra, cut = time.Time{}, true
				case <-time.After(every / 4):
				}
			}
		}
		got := r.evidence(p)
		got.adminStatus, got.restartError = after.adminStatus, after.restartError
		ok, missing := tookEffect(step, before, got)
		if held {
			p.SetFault(fakeprovider.Fault{})
			_ = p.Up()
		}
		mu.Lock()
		rep.tally(step, p.Name, ok, cut, missing)
		mu.Unlock()
	}
}

func (r *rig) admin(method, path, body string) int {
	r.mu.Lock()
	in := r.fusebox
	r.mu.Unlock()
	if in == nil {
		return 0
	}
	req, _ := http.NewRequest(method, "http://"+in.AdminAddr()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// check evaluates every invariant into rep.
func (r *rig) check(rep *Report) {
	add := func(name string, held bool, detail string, args ...any) {
		rep.Invariants = append(rep.Invariants, Check{Name: name, Held: held, Detail: fmt.Sprintf(detail, args...)})
	}
	hung := rep.Errors[errHung.Error()]
	add("every request ends within its deadline", hung == 0, "%d of %d hung", hung, rep.Requests)

	// Outcomes, per route, against the providers' own tally. Both count
	// from the start (warm-up included), fusebox over all its lifetimes.
	fams := r.gatherAll()
	got := map[string]float64{} // route|class|reason
	rep.Outcomes = map[string]float64{}
	for _, f := range fams["aig_circuit_breaker_outcomes_total"] {
		for _, m := range f.Metric {
			got[label(m, "route")+"|"+label(m, "class")+"|"+label(m, "reason")] += m.GetCounter().GetValue()
			rep.Outcomes[label(m, "class")] += m.GetCounter().GetValue()
		}
	}
	// Envoy stops talking to fusebox about a request whose reply took
	// longer than message_timeout (failure_mode_allow: the request goes on
	// unprocessed). Each such timeout is an event with a known outcome
	// (R-DL14; envoysim keeps them, timeouts.go), counted exactly:
	// expected holds what fusebox counts instead of the providers' tally.
	gaveUp := r.proxy.Stats().Get("message_timeouts")
	rep.EnvoyGaveUp = gaveUp
	expected, unplaced := timeoutOutcomes(r.proxy.Timeouts(), r.observer())
	var bad, connOver, connAll []string
	stats := r.proxy.Stats()
	off := 0.0
	diff := func(counted, tally float64) {
		if counted != tally {
			off += math.Abs(counted - tally)
		}
	}
	excess := 0.0 // neithers past the tally on a route: a timeout fusebox's route was not seen for
	for prov, route := range routeOf {
		t := r.providers[prov].Tally()
		sum := func(prefix string) float64 {
			var s float64
			for k, v := range got {
				if strings.HasPrefix(k, prefix) {
					s += v
				}
			}
			return s
		}
		adj := expected[route]
		if s, c := sum(route+"|success|"), float64(t["complete"])+adj.success; s != c {
			diff(s, c)
			bad = append(bad, fmt.Sprintf("%s: %v successes counted, provider completed %v (%+v for Envoy's message timeouts)", route, s, c, adj.success))
		}
		if s, c := got[route+"|failure|provider_5xx"], float64(t["status_503"]); s != c {
			diff(s, c)
			bad = append(bad, fmt.Sprintf("%s: %v provider_5xx counted, provider answered 503 %v times", route, s, c))
		}
		s, c := sum(route+"|neither|"), float64(t["status_429"]+t["reset_mid"]+t["cut"])+adj.neither
		switch {
		case s < c:
			diff(s, c)
			bad = append(bad, fmt.Sprintf("%s: %v neither counted, provider answered %v 429s, resets and cuts (%+v for Envoy's message timeouts)", route, s, c, adj.neither))
		case s > c:
			excess += s - c
		}
		// A connection lost before the headers is a connection error to
		// fusebox (Envoy's local reply after its retry), never less.
		if s, c := got[route+"|failure|connection_error"], float64(t["cut_before_headers"]); s < c {
			diff(s, c)
			bad = append(bad, fmt.Sprintf("%s: %v connection errors counted, provider lost %v connections before its headers", route, s, c))
		}
		// And never more than the attempts that never had a connection or
		// lost it before the headers, as Envoy's counters give them
		// (lostBeforeHeaders): a refused connection, or one Linux reset
		// from the backlog of a listener the refused fault closed, leaves
		// the provider no tally. An error fusebox made up would pass
		// the bound.
		if s, c := got[route+"|failure|connection_error"], float64(lostBeforeHeaders(stats, prov)); s > c {
			connOver = append(connOver, fmt.Sprintf("%s: %v connection errors counted, %v attempts lost or refused their connection", route, s, c))
		} else if c > 0 {
			connAll = append(connAll, fmt.Sprintf("%s %v of %v", route, s, c))
		}
	}
	if excess > float64(unplaced) {
		diff(excess, float64(unplaced))
		bad = append(bad, fmt.Sprintf("%v neithers past the tallies, and only %d message timeouts whose route Envoy never heard of", excess, unplaced))
	}
	connDetail := strings.Join(connOver, "; ")
	if len(connOver) == 0 {
		connDetail = "counted of lost or refused: " + strings.Join(connAll, ", ")
	}
	add("no route counts more connection errors than its attempts lost or were refused", len(connOver) == 0, "%s", connDetail)
	detail := ""
	if off != 0 {
		detail = "; " + explainOutcomes(r.proxy.Timeouts(), got)
	}
	add("every attempt's outcome counted exactly once, per class, against the providers' tally and Envoy's message timeouts",
		off == 0, "%d message timeouts (%d whose route Envoy never heard of, %v neithers past the tallies); %s%s", gaveUp, unplaced, excess, strings.Join(bad, "; "), detail)

	r.checkClients(rep, fams, add)
	r.checkEffects(rep, fams, add)

	// Transitions: legal, in order, per breaker, each chain on its own.
	wrong, excerpt := checkTransitions(r.logs.String(), r.redis != nil, &rep.Transitions)
	rep.BrokenChain = excerpt
	if dir := os.Getenv("SOAK_PROFILE_DIR"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, "fusebox.log"), []byte(r.logs.String()), 0o644) // the chains as logged
	}
	add("transitions are legal and in order, per breaker", len(wrong) == 0, "%d transitions; %s", rep.Transitions, strings.Join(first(wrong, 5), "; "))

	// fusebox's own goroutines: the harness's (envoysim's streams, the
	// Redis proxy's two per pooled connection, the callers' clients) vary
	// with what the load left open, not with what fusebox leaked; so do
	// the one fusebox serves each access log stream envoysim holds open
	// (Envoy keeps one per worker for its life), counted apart and held to
	// exactly that. The rest: within 10 %, as the product promises (it
	// carried 10 more, 43 % of the 23 measured, which hid this).
	own := func(p point) int { return p.own - p.serving }
	add("fusebox's goroutines return within 10 % after the load", own(rep.After) <= own(rep.Before)*11/10,
		"%d before, %d after, besides %d and %d serving access log streams (with the harness's: %d, %d)",
		own(rep.Before), own(rep.After), rep.Before.serving, rep.After.serving, rep.Before.goroutines, rep.After.goroutines)
	// One: on fusebox's own transport (the soak's) the stream's handler
	// serves it, its lifetime bounds on a timer (grpcwire.EndFunc); on
	// grpc-go's server a second goroutine watched them.
	add("fusebox serves each access log stream envoysim holds open with one goroutine, and no other",
		rep.Before.serving == rep.Before.logStreams && rep.After.serving == rep.After.logStreams,
		"%d and %d goroutines for %d and %d streams", rep.Before.serving, rep.After.serving, rep.Before.logStreams, rep.After.logStreams)

	// The live heap after a collection, in both builds: RSS says what the
	// allocator and (under -race) the race detector's shadow memory keep,
	// not what fusebox holds. The bound is the product's promise, 10 %,
	// with nothing added: what a load leaves the first time only (lazy
	// set-up, metric series) is in the baseline by the warm-up, the
	// runtime's goroutine descriptors are raised to a mark above the load's
	// peak before the baseline and left out of the 10 % (goroutines.go),
	// and the harness keeps what it measures in a fixed size (gathered.go).
	// Before those, the check carried 512 KiB of slack and still failed in
	// CI (4.7 -> 5.7 MiB): the harness's per-restart metrics and the
	// descriptors of a load that peaked above its warm-up. The Redis
	// connections' buffers (64 KiB each in go-redis, 64 more in the fault
	// proxy) are left out of both measures as the idle HTTP connections
	// are closed before them: a pool, whose size the check below bounds.
	// Counted in, the fleet soak failed in CI at 13.93 -> 15.86 MiB: the
	// pools held 15 connections more after the load than after the
	// warm-up, nothing else.
	// The record keys (R-DL11) are kept for their life, at least 10
	// minutes, by design: counted apart, to the byte (recordKeys). With
	// them counted in, the observer soak measured 4.99 -> 5.75 MiB.
	base := float64(rep.Before.heap - rep.MarkBytes - rep.Before.pool - rep.Before.keys)
	after := float64(rep.After.heap - rep.MarkBytes - rep.After.pool - rep.After.keys)
	// "Returns" is a promise about what the load leaves for good: state
	// that drains on its own a little later than the measuring point's
	// waits allow for (on a loaded CI machine the fleet soak once measured
	// 13.02 -> 14.48 MiB and never did on an idle one, with the decision
	// tables empty) is not a leak, and a leak is still there ten seconds
	// on. So a first measure above the bound is taken again then, and
	// both are reported.
	again := ""
	if after > 1.1*base {
		first := after
		time.Sleep(10 * time.Second)
		p := r.settle()
		after = float64(p.heap - rep.MarkBytes - p.pool - p.keys)
		again = fmt.Sprintf(" (at the first measure %.2f MiB; this one 10 s later)", first/(1<<20))
		if after > 1.1*base {
			// What grew, by allocation site (sampled, runtime.MemProfileRate),
			// and what each store still owes Redis.
			again += "; the stores' backlogs (pending/unsent/capacity): " + r.backlogs() + "; the sites that grew most:" + growth(rep.Before.sites, p.sites, 12)
		}
	}
	add("memory (the live Go heap after a collection) returns within 10 % after the load",
		after <= 1.1*base,
		"%.2f MiB before, %.2f MiB after%s, each besides %.2f MiB of goroutine descriptors, %.2f / %.2f MiB of Redis connection buffers and %.2f / %.2f MiB of record keys; goroutines peaked at %d in the load, %d in the warm-up, mark %d (RSS %.1f / %.1f MiB)",
		base/(1<<20), after/(1<<20), again, float64(rep.MarkBytes)/(1<<20), float64(rep.Before.pool)/(1<<20), float64(rep.After.pool)/(1<<20),
		float64(rep.Before.keys)/(1<<20), float64(rep.After.keys)/(1<<20),
		rep.PeakGoroutines, rep.WarmupPeakGoroutines, rep.GoroutineMark,
		float64(rep.Before.rss)/(1<<20), float64(rep.After.rss)/(1<<20))
	// What the 10 % compares must be what the load left behind, and the
	// decisions a replica remembers for a late access log entry go two
	// access_log.wait_ms generations after the last one settled: settle
	// waits for that. One still kept then is a decision the table never
	// lets go, unless a message timeout explains it: in the observer
	// profile a decision whose route Envoy never heard of waits
	// decision_wait_sec (300 s, R-DL3) for an observer that never comes,
	// past the run (waitingPastTheRun). Two suites at once on a loaded
	// machine made such timeouts, and 11 such decisions failed this check
	// when it wanted none (#54).
	add("every replica lets go of its decisions after the load", rep.Before.decisions <= rep.Before.waiting && rep.After.decisions <= rep.After.waiting,
		"%d and %d decisions kept at the two measures, %d and %d of them explained by message timeouts (each waits decision_wait_sec for an observer Envoy never opened)",
		rep.Before.decisions, rep.After.decisions, rep.Before.waiting, rep.After.waiting)
	if rep.After.poolConns != nil {
		most := slices.Max(rep.After.poolConns)
		add("each replica's Redis pool keeps at most IdleConns connections after the load", most <= redisstore.IdleConns,
			"%v connections (bound %d)", rep.After.poolConns, redisstore.IdleConns)
	}
	if rep.PeakGoroutines >= rep.GoroutineMark {
		// Then the load made descriptors the baseline lacks: the heap
		// check above may fail for that alone, and says so here.
		add("the load's goroutines stay below the mark raised before the baseline", false,
			"peaked at %d, mark %d", rep.PeakGoroutines, rep.GoroutineMark)
	}

	// No probe slot outlives the probe timeout (3 s; we waited 4). The
	// check fails when it cannot read the slots: before, an HTTP or JSON
	// error read as no slot taken.
	probes, probeErr := r.probesInFlight()
	add("no probe slot stays taken past the probe timeout", probeErr == nil && probes == 0, "%d slots taken%s", probes, errSuffix(probeErr))

	// A failure count goes down only by a close, a window roll, or state
	// thrown away on purpose (failcount.go).
	r.counts.mu.Lock()
	drops, samples := r.counts.drops, r.counts.n
	r.counts.mu.Unlock()
	add("a failure count never goes down without a close or a window roll", len(drops) == 0 && samples > 0,
		"%d drops in %d samples%s", len(drops), samples, firstFew(drops))

	logs := r.logs.String()
	leak := strings.Contains(logs, promptMarker) || strings.Contains(logs, completionMarker)
	add("no log line holds a prompt or a completion", !leak, "%d bytes of logs", len(logs))

	// Decision latency from the processor's histogram (all lifetimes).
	rep.DecisionP50, rep.DecisionP99, rep.DecisionP999 = quantiles(fams["aig_extproc_message_duration_seconds"], "request_body")

	// What Envoy waited for each request-path reply (R-ST7): a stalled or
	// slow Redis must not hold a decision past the store's op timeout
	// (op_timeout_ms + 20 ms), let alone 200 ms. A machine under load
	// pauses goroutines that long with Redis nowhere in it: on a 2-core
	// machine with both cores kept busy by another process, 139 of 26,786
	// replies passed 70 ms and 22 passed 200 ms (#37), in an idle CI run 3
	// of ~27,700 did. So the waits of replies begun in a Redis fault's
	// window (the fault, and one second after it: marked by faults()) are
	// held against the others of the same run, on the same machine at the
	// same time: no more than 4 times the others' rate past the bound less
	// the op timeout, plus 5. Less the op timeout: a decision in a fault
	// may wait that long by the promise itself (a probe's slot), and then
	// meets the same pauses as any other, so its noise is the others'
	// past 20 ms, not past 70 (held against those, a busy CI run failed
	// with 12 of 2,930 past 70 ms, allowed 11.9: the others' rate past
	// 70 ms, 0.06 %, is no measure of what 20 ms of noise does). The fault
	// it guards against holds every decision of a 2 s stall (~1,000 of
	// them), or each call its own op timeout in turn: a third or more of
	// the window's replies. So the bound also admits 2 % of the window's
	// replies, fifteen times below what the fault does: a fault window
	// is where the machine works hardest (Redis killed and restarted,
	// every client reconnecting), and on a 2-core machine at load 4–16 the
	// window's own pauses gave 18 past the bound where the rest of the run
	// allowed 14 (#54).
	if r.redis != nil {
		st := r.proxy.Stats()
		op := time.Duration(routes.DefaultOpTimeoutMs) * time.Millisecond
		for _, bound := range []time.Duration{op + 20*time.Millisecond, hardWait} {
			nOut, outLonger, longestOut := st.RequestPathWaits(bound - op)
			nIn, inLonger, longestIn := st.MarkedWaits(bound)
			rep.LongestWait = max(rep.LongestWait, longestOut, longestIn)
			allowed := 5.0 + float64(nIn)/50
			if nOut > 0 {
				allowed += 4 * float64(outLonger) / float64(nOut) * float64(nIn)
			}
			add(fmt.Sprintf("no more decisions wait past %v in Redis's faults than the rest of the run's noise", bound),
				nIn > 0 && float64(inLonger) <= allowed,
				"in the faults' windows %d of %d request-path replies waited past %v (allowed %.1f), the longest %v; elsewhere %d of %d past %v, the longest %v",
				inLonger, nIn, bound, allowed, longestIn, outLonger, nOut, bound-op, longestOut)
		}
	}
}

// hardWait is the wait no request-path reply may reach.
const hardWait = 200 * time.Millisecond

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// field reads key=value from a text log line.
func field(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return strings.Trim(v, `"`)
}

// quantiles estimates p50/p99/p999 of one phase from merged histograms
// (linear within a bucket).
func quantiles(fams []*dto.MetricFamily, phase string) (p50, p99, p999 time.Duration) {
	counts := map[float64]uint64{}
	var total uint64
	for _, f := range fams {
		for _, m := range f.Metric {
			if label(m, "phase") != phase {
				continue
			}
			h := m.GetHistogram()
			total += h.GetSampleCount()
			for _, b := range h.Bucket {
				counts[b.GetUpperBound()] += b.GetCumulativeCount()
			}
		}
	}
	if total == 0 {
		return
	}
	bounds := make([]float64, 0, len(counts))
	for b := range counts {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	q := func(p float64) time.Duration {
		target := p * float64(total)
		prevB, prevC := 0.0, 0.0
		for _, b := range bounds {
			c := float64(counts[b])
			if c >= target {
				frac := 1.0
				if c > prevC {
					frac = (target - prevC) / (c - prevC)
				}
				return time.Duration((prevB + frac*(b-prevB)) * 1e9)
			}
			prevB, prevC = b, c
		}
		return time.Duration(math.Inf(1))
	}
	return q(0.5), q(0.99), q(0.999)
}

// firstFew lists up to three of xs, for a detail line.
func firstFew(xs []string) string {
	if len(xs) == 0 {
		return ""
	}
	return ": " + strings.Join(xs[:min(3, len(xs))], "; ")
}
