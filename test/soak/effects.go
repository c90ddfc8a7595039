package main

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
	dto "github.com/prometheus/client_model/go"
)

// evidence is what the harness can read of a fault's effect, taken before
// and after each step: a fault that met no traffic (a provider nobody
// routed to, a Redis stall while nothing was sent) proves nothing, and the
// soak says so instead of counting it as survived.
type evidence struct {
	tally        map[string]int64 // the faulted provider's
	connErrors   float64          // fusebox's connection_error outcomes on its route
	reloads      float64          // fusebox's successful config reloads
	storeErrors  float64          // fusebox's failed store operations
	delayed      int64            // Redis proxy chunks the latency delayed
	held         int64            // Redis proxy chunks a stall held
	adminStatus  int              // the force-open call's answer
	restartError error            // the fusebox or Redis restart's
}

func (r *rig) evidence(p *fakeprovider.Provider) evidence {
	fams := r.gatherAll()
	sum := func(name string, match func(route, class, reason, result string) bool) float64 {
		var s float64
		for _, f := range fams[name] {
			for _, m := range f.Metric {
				if match(label(m, "route"), label(m, "class"), label(m, "reason"), label(m, "result")) {
					s += m.GetCounter().GetValue()
				}
			}
		}
		return s
	}
	route := routeOf[p.Name]
	ev := evidence{
		tally: p.Tally(),
		connErrors: sum("aig_circuit_breaker_outcomes_total", func(rt, class, reason, _ string) bool {
			return rt == route && class == "failure" && reason == "connection_error"
		}),
		reloads:     sum("aig_config_reloads_total", func(_, _, _, result string) bool { return result == "success" }),
		storeErrors: sum("aig_store_errors_total", func(string, string, string, string) bool { return true }),
	}
	if r.rproxy != nil {
		ev.delayed, ev.held = r.rproxy.Delayed(), r.rproxy.Held()
	}
	return ev
}

// tookEffect says whether step, between before and after, did what it is
// for, and if not, what was missing. A reload is judged over the whole run
// (reloadsTookEffect): it applies once the file settles, after the step.
func tookEffect(step string, before, after evidence) (bool, string) {
	grew := func(kind string) (bool, string) {
		return after.tally[kind] > before.tally[kind], "the provider answered no " + kind
	}
	switch step {
	case "503_burst":
		return grew("status_503")
	case "429_retry_after":
		return grew("status_429")
	case "reset_mid_stream":
		return grew("reset_mid")
	case "slow_first_token":
		return grew("slow_first_token")
	case "refused":
		return after.connErrors > before.connErrors, "fusebox counted no connection error on the route"
	case "force_open":
		return after.adminStatus == 200, fmt.Sprintf("the force-open call answered %d", after.adminStatus)
	case "fusebox_restart":
		return after.restartError == nil, fmt.Sprintf("the restart failed: %v", after.restartError)
	case "redis_restart":
		if after.restartError != nil {
			return false, fmt.Sprintf("the restart failed: %v", after.restartError)
		}
		return after.storeErrors > before.storeErrors, "no store operation failed while Redis was down"
	case "redis_stall":
		return after.held > before.held, "the stall held nothing"
	case "redis_slow":
		return after.delayed > before.delayed, "the latency delayed nothing"
	case "redis_flushall":
		return after.restartError == nil, fmt.Sprintf("FLUSHALL failed: %v", after.restartError)
	}
	return true, ""
}

// faultTarget is which of primaryProviders the schedule's step i faults.
// A fault goes to a model's first route, which takes its traffic; the two
// alternate from step to step, and each cycle starts on the other one, so
// every fault meets both whatever the schedule's length. (i + cycle) did
// not: with an odd number of steps (the Redis soak's nine) every cycle
// began on the first provider, and each fault met one provider only.
func faultTarget(i, steps int) int {
	return (i%steps + i/steps) % len(primaryProviders)
}

// tally records one step's verdict. A provider fault the load's end cut
// short before any request met it had no traffic left to bite: it is
// listed as cut short, not judged. One that bit is judged either way, and
// one whose whole window passed without a request is a fault that never
// took effect.
func (rep *Report) tally(step, provider string, ok, cut bool, missing string) {
	if cut && !ok {
		rep.CutShort = append(rep.CutShort, step+" on "+provider)
		return
	}
	rep.Faults[step]++
	if ok {
		rep.FaultEffects[step]++
	} else {
		rep.NoEffect = append(rep.NoEffect, fmt.Sprintf("%s on %s: %s", step, provider, missing))
	}
}

// checkEffects: every injected fault was seen to take effect.
func (r *rig) checkEffects(rep *Report, fams map[string][]*dto.MetricFamily, add func(string, bool, string, ...any)) {
	for _, f := range fams["aig_config_reloads_total"] {
		for _, m := range f.Metric {
			if label(m, "result") == "success" {
				rep.ReloadsApplied += m.GetCounter().GetValue()
			}
		}
	}
	missing := append([]string(nil), rep.NoEffect...)
	if rep.ReloadsApplied < float64(rep.Faults["reload"]) {
		missing = append(missing, fmt.Sprintf("%d config changes, %v reloads applied", rep.Faults["reload"], rep.ReloadsApplied))
	}
	n := 0
	for _, c := range rep.Faults {
		n += c
	}
	// Only the schedule's last step can be cut short by the load's end.
	if len(rep.CutShort) > 1 {
		missing = append(missing, fmt.Sprintf("%d steps cut short, only the last can be: %v", len(rep.CutShort), rep.CutShort))
	}
	add("every injected fault took effect", len(missing) == 0, "%d injected; %s", n, firstFew(missing))
}

// checkClients: what the callers got is what the faults explain. A 429
// reaches a client only from a provider; a 5xx only from a provider's 503,
// a connection lost or refused before the headers, or fusebox's own
// rejection; a transport error only from a stream the provider broke.
func (r *rig) checkClients(rep *Report, fams map[string][]*dto.MetricFamily, add func(string, bool, string, ...any)) {
	tally := map[string]int64{}
	var lost int
	for name, p := range r.providers {
		for k, v := range p.Tally() {
			tally[k] += v
		}
		lost += lostBeforeHeaders(r.proxy.Stats(), name)
	}
	var rejected float64
	for _, f := range fams["aig_circuit_breaker_decisions_total"] {
		for _, m := range f.Metric {
			if label(m, "action") == "rejected" {
				rejected += m.GetCounter().GetValue()
			}
		}
	}
	client5xx, transport := 0, 0
	for status, n := range rep.ByStatus {
		if status >= 500 && status <= 599 {
			client5xx += n
		}
	}
	for e, n := range rep.Errors {
		if e != errHung.Error() {
			transport += n
		}
	}
	add("the clients' 429s are the providers' 429s, never more", int64(rep.ByStatus[429]) <= tally["status_429"],
		"%d answered the clients, %d by the providers", rep.ByStatus[429], tally["status_429"])
	explained := float64(tally["status_503"]+int64(lost)) + rejected
	add("the clients' 5xx answers are what the faults explain, never more", float64(client5xx) <= explained,
		"%d 5xx; the providers answered %d 503s, %d attempts were refused or lost their connection before the headers, fusebox rejected %v",
		client5xx, tally["status_503"], lost, rejected)
	add("the clients' transport errors are streams the providers broke, never more", int64(transport) <= tally["reset_mid"]+tally["cut"]+tally["cut_before_headers"],
		"%d transport errors; the providers reset %d streams and lost %d connections", transport, tally["reset_mid"], tally["cut"]+tally["cut_before_headers"])
}

// probesInFlight reads the probe slots taken from the admin API.
func (r *rig) probesInFlight() (int, error) {
	r.mu.Lock()
	in := r.fusebox
	r.mu.Unlock()
	if in == nil {
		return 0, errors.New("fusebox is not running")
	}
	resp, err := http.Get("http://" + in.AdminAddr() + "/admin/v1/gateways/default/routes")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("the routes answered %d", resp.StatusCode)
	}
	var rows []struct {
		Probes *int `json:"probes_in_flight"`
	}
	if err := jsonDecode(resp.Body, &rows); err != nil {
		return 0, err
	}
	if len(rows) == 0 {
		return 0, errors.New("no routes listed")
	}
	probes := 0
	for _, row := range rows {
		if row.Probes == nil {
			return 0, errors.New("a route without probes_in_flight")
		}
		probes += *row.Probes
	}
	return probes, nil
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

// untilGrows waits, up to 5 s, until count passes from: a Redis fault
// lasts until it met traffic. A replica that a stall left degraded tries
// Redis again only at its next refresh, so a 1 s slowness right after a
// stall could meet nothing at all (the fleet soak: "the latency delayed
// nothing"), and would prove nothing.
func untilGrows(count func() int64, from int64) {
	for deadline := time.Now().Add(5 * time.Second); count() <= from && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
}
