package processor

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The attempt role (SPEC §11, R-X2/R-X3): an ext_proc in each provider
// cluster's upstream filter chain sees every attempt Envoy makes for a
// request. The route role hands it the failover chain in one request header
// (AttemptHeader); the attempt learns its number from x-envoy-attempt-count.
// It applies that attempt's route rewrites and records exactly one outcome
// for the attempt, against the route that served it, with the generation
// (and, for a probe, the slot) the route role took when it made the chain.
//
// Why a request header: upstream filters of every attempt decode the same
// request header map, and the upstream header_mutation that strips
// fusebox's other headers runs on that same map, so a header removed in
// attempt 1 is gone in attempt 2 (docs/envoy.md, "In-request failover").
// The chain header therefore stays on the request for every attempt and
// reaches the provider: its value is opaque (base64 of route keys and
// generations) and holds no prompt, no credential and no client data
// beyond the model name and path the provider receives anyway.

// AttemptHeader carries the chain from the route role to the attempt role.
const AttemptHeader = "x-fusebox-attempt"

const (
	attemptCountHeader = "x-envoy-attempt-count"
	requestIDHeader    = "x-request-id"
	// maxTokenBytes bounds what the attempt role decodes: ten groups of
	// route keys fit many times over.
	maxTokenBytes = 8 << 10
)

// attemptToken is the chain as the route role wrote it.
type attemptToken struct {
	V int `json:"v"`
	// Decision is the route role's decision id: attempts of one request
	// are tied together by it, and the access log entry names it.
	Decision string         `json:"d,omitempty"`
	Gateway  string         `json:"g"`
	Model    string         `json:"m"` // the client's model name
	Path     string         `json:"p"` // the client's :path
	Chain    []attemptGroup `json:"c"`
}

// attemptGroup is one route of the chain with the admission the route role
// took for it: generations, and the probe slot of the first group.
type attemptGroup struct {
	Route      string `json:"r"`
	RouteGen   uint64 `json:"rg"`
	RouteLease uint64 `json:"rl,omitempty"`
	FleetGen   uint64 `json:"fg,omitempty"`
	FleetLease uint64 `json:"fl,omitempty"`
}

func (t *attemptToken) encode() string {
	b, _ := json.Marshal(t) // plain strings and numbers always marshal
	return base64.RawURLEncoding.EncodeToString(b)
}

var errToken = errors.New("not a fusebox attempt token")

// parseAttemptToken reads the header value; anything else than what the
// route role writes is refused.
func parseAttemptToken(s string) (attemptToken, error) {
	var t attemptToken
	if len(s) == 0 || len(s) > maxTokenBytes {
		return t, errToken
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return t, errToken
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil || dec.More() {
		return t, errToken
	}
	if t.V != 1 || len(t.Chain) == 0 || len(t.Chain) > 10 || t.Gateway == "" {
		return attemptToken{}, errToken
	}
	for _, g := range t.Chain {
		if g.Route == "" {
			return attemptToken{}, errToken
		}
	}
	return t, nil
}

// group returns the chain group of attempt n (1-based): Envoy's
// priority_group specifier picks min(n-1, groups-1).
func (t *attemptToken) group(n int) int {
	return min(max(n, 1)-1, len(t.Chain)-1)
}

// chainToken builds the route role's token for the chain idx of cands; the
// first group carries the stream's admission, later groups an admission
// taken now (closed routes: a generation, no slot).
func (st *stream) chainToken(groups []chainGroup) string {
	t := attemptToken{V: 1, Decision: st.decisionID, Gateway: st.gw.ID, Model: st.modelName, Path: st.path}
	for _, g := range groups {
		t.Chain = append(t.Chain, attemptGroup{Route: g.route.Key, RouteGen: g.adm.Route.Gen, RouteLease: g.adm.Route.Lease,
			FleetGen: g.adm.Fleet.Gen, FleetLease: g.adm.Fleet.Lease})
	}
	return t.encode()
}

// onAttemptHeaders resolves the attempt's route from the chain and applies
// its header rewrites. It never answers with an immediate response: in the
// upstream chain that would end the request without a retry.
func (st *stream) onAttemptHeaders(h *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	st.startNs = st.now()
	st.rt = st.s.cfg.Load()
	st.comp = st.s.compiledFor(st.rt)
	var token, path string
	n := 1
	if h.Headers != nil {
		for _, hv := range h.Headers.Headers {
			switch hv.Key {
			case AttemptHeader:
				token = headerValue(hv)
			case attemptCountHeader:
				if v, err := strconv.Atoi(headerValue(hv)); err == nil && v > 0 {
					n = v
				}
			case requestIDHeader:
				st.requestID = headerValue(hv)
			case ":path":
				path = headerValue(hv)
			}
		}
	}
	st.attemptN = n
	t, err := parseAttemptToken(token)
	if err != nil {
		if token != "" {
			st.s.metrics.InternalErrors.WithLabelValues("attempt_token").Inc()
		}
		return headersReply(nil)
	}
	st.decisionID = t.Decision
	gw, ok := st.rt.Gateway(t.Gateway)
	if !ok {
		return headersReply(nil)
	}
	g := t.Chain[t.group(n)]
	route, ok := gw.Routes[g.Route]
	if !ok {
		return headersReply(nil) // removed by a reload since the chain was made
	}
	st.gw, st.chosen, st.target = gw, route, st.comp.targets[route]
	if st.target == nil {
		return headersReply(nil)
	}
	st.adm = breaker.TargetAdmission{Route: breaker.Admission{Gen: g.RouteGen, Lease: g.RouteLease},
		Fleet: breaker.Admission{Gen: g.FleetGen, Lease: g.FleetLease}}
	if n > 1 {
		// The first group's slot belongs to attempt 1 only.
		st.adm.Route.Lease, st.adm.Fleet.Lease = 0, 0
	}
	st.tracked = !st.target.Peek(context.Background(), st.s.store, st.startNs).Off
	// A previous attempt of this request that ended before any response
	// headers was retried by Envoy: its connection failed or was reset.
	st.s.parked.retried(st.parkKey(), n)

	// Per-attempt rewrites (R-X2): the header map is shared by every
	// attempt, so :path is set on each one, back to the client's when the
	// route has none; the body is the route role's (route 1's), so its
	// model is rewritten when this route wants another.
	want := route.Path
	if want == "" {
		want = t.Path
	}
	var cr *extprocv3.CommonResponse
	if want != "" && want != path {
		cr = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
			SetHeaders: []*corev3.HeaderValueOption{setHeader(":path", want)}}}
	}
	st.attemptModel = route.UpstreamModel
	if st.attemptModel == "" {
		st.attemptModel = t.Model
	}
	st.rewriteBody = !h.EndOfStream && st.attemptModel != ""
	return headersReply(cr)
}

// onAttemptBody rewrites the body's model for this attempt's route when it
// differs from what the body holds.
func (st *stream) onAttemptBody(b *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if !st.rewriteBody || !st.bodyComplete(b) {
		return bodyReply(nil)
	}
	st.rewriteBody = false
	f, err := scanModel(b.Body)
	if err != nil || !f.Found || f.Name == st.attemptModel {
		return bodyReply(nil)
	}
	nb := rewriteModel(b.Body, f, st.attemptModel)
	return bodyReply(&extprocv3.CommonResponse{
		HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-length", strconv.Itoa(len(nb)))}},
		BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: nb}},
	})
}

// parkedAttempts holds attempts whose stream ended before any response
// headers: a connect failure, a reset, a per-try timeout — or a client
// that went away. Envoy says nothing to an upstream filter about which.
// When the next attempt of the same request arrives, Envoy retried: the
// parked one failed (connection_error). Otherwise, after parkFor, it is a
// neither (R-O8), which frees its probe slot.
type parkedAttempts struct {
	mu sync.Mutex
	m  map[string]*parked
	// early holds access log entries that named a decision no parked
	// attempt had yet: the entry and the attempt's stream end race.
	early map[string]earlyEntry
	ttl   time.Duration
	max   int
	// later holds, per request, the latest attempt number seen when no
	// earlier attempt was parked yet: Envoy resets attempt k's stream and
	// starts attempt k+1's concurrently, so k+1 may reach fusebox before
	// k's stream has ended.
	later  map[string]laterAttempt
	pruned time.Time
}

type laterAttempt struct {
	n  int
	at time.Time
}

type parked struct {
	st    *stream
	n     int
	timer *time.Timer
}

const parkFor = 5 * time.Second

func newParkedAttempts() *parkedAttempts {
	return &parkedAttempts{m: map[string]*parked{}, later: map[string]laterAttempt{}, early: map[string]earlyEntry{}, ttl: parkFor, max: 10000}
}

// parkKey ties the attempts of one request together: the decision id the
// route role put in the chain (x-request-id only for a chain written
// without one).
func (st *stream) parkKey() string {
	if st.decisionID != "" {
		return st.decisionID
	}
	return st.requestID
}

// park keeps st until its request's next attempt, its access log entry or
// the timeout.
func (p *parkedAttempts) park(st *stream) {
	key := st.parkKey()
	p.mu.Lock()
	if key == "" || len(p.m) >= p.max {
		p.mu.Unlock()
		st.recordNeither()
		return
	}
	if out, ok := p.early[key]; ok && out.matches(st) {
		// Envoy's entry for this attempt came first (R-AL5).
		delete(p.early, key)
		p.mu.Unlock()
		st.recordEntry(out.entryOutcome)
		st.s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
		return
	}
	if l, ok := p.later[key]; ok && l.n > st.attemptN {
		// The next attempt already arrived: Envoy retried this one.
		delete(p.later, key)
		p.mu.Unlock()
		st.recordConnError()
		return
	}
	if old, ok := p.m[key]; ok {
		// Attempts of one request run one after the other; an older
		// parked one is over.
		delete(p.m, key)
		old.timer.Stop()
		defer old.st.recordNeither()
	}
	e := &parked{st: st, n: st.attemptN}
	id := key
	e.timer = time.AfterFunc(p.ttl, func() {
		p.mu.Lock()
		if cur, ok := p.m[id]; !ok || cur != e {
			p.mu.Unlock()
			return
		}
		delete(p.m, id)
		p.mu.Unlock()
		e.st.recordNeither()
	})
	p.m[id] = e
	p.mu.Unlock()
}

// retried records the parked attempt of request id as a connection failure
// when attempt n is a later one.
func (p *parkedAttempts) retried(id string, n int) {
	if id == "" {
		return
	}
	p.mu.Lock()
	e, ok := p.m[id]
	if !ok {
		if n > 1 {
			p.noteLater(id, n)
		}
		p.mu.Unlock()
		return
	}
	if e.n >= n {
		p.mu.Unlock()
		return
	}
	delete(p.m, id)
	e.timer.Stop()
	p.mu.Unlock()
	e.st.recordConnError()
}

// noteLater remembers that request id reached attempt n, for a parking of
// an earlier attempt that is still on its way. Entries older than the park
// time are dropped when the map is full; at most max are kept.
func (p *parkedAttempts) noteLater(id string, n int) {
	now := time.Now()
	// Most retries follow an attempt that got its headers (a 503), so
	// most entries are never claimed: they are dropped once stale, at most
	// once per park time.
	if len(p.later) >= 1024 && now.Sub(p.pruned) > p.ttl || len(p.later) >= p.max {
		p.pruned = now
		for k, v := range p.later {
			if now.Sub(v.at) > p.ttl {
				delete(p.later, k)
			}
		}
		if len(p.later) >= p.max {
			return
		}
	}
	if l, ok := p.later[id]; !ok || l.n < n {
		p.later[id] = laterAttempt{n: n, at: now}
	}
}

// earlyEntry is an access log entry waiting for its attempt to park.
type earlyEntry struct {
	entryOutcome
	at time.Time
}

// matches reports whether an entry speaks for st: the attempt it counted
// (when it says) and the cluster that attempt used (when a host was
// picked).
func (o entryOutcome) matches(st *stream) bool {
	return (o.attempt == 0 || int(o.attempt) == st.attemptN) && (o.cluster == "" || o.cluster == st.chosen.Cluster)
}

// entry applies an access log entry to the parked attempt of decision id
// (R-AL5: the failover deployment's last attempt, which no ext_proc stream
// shows failing). An entry for no parked attempt is kept for one park time
// in case the attempt's stream end is still on its way; ok is false then.
func (p *parkedAttempts) entry(id string, out entryOutcome) (result string, ok bool) {
	p.mu.Lock()
	e, found := p.m[id]
	if !found {
		now := time.Now()
		if len(p.early) >= 4096 {
			for k, v := range p.early {
				if now.Sub(v.at) > p.ttl {
					delete(p.early, k)
				}
			}
		}
		if len(p.early) < 4096 {
			p.early[id] = earlyEntry{entryOutcome: out, at: now}
		}
		p.mu.Unlock()
		return "", false
	}
	if !out.matches(e.st) {
		p.mu.Unlock()
		return EntryClusterMismatch, true
	}
	delete(p.m, id)
	e.timer.Stop()
	p.mu.Unlock()
	e.st.recordEntry(out)
	return EntryRecorded, true
}

func (st *stream) recordConnError() {
	now := st.now()
	st.record(st.timed(breaker.Result{Kind: breaker.KindConnError, Reason: breaker.ReasonConnection}, now), now)
}

// len reports how many attempts are parked (tests).
func (p *parkedAttempts) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

func (st *stream) recordNeither() {
	st.record(breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonClientCancel, ElapsedMs: -1}, st.now())
}
