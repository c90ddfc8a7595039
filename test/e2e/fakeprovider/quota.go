package fakeprovider

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Quota is a rate limit the provider enforces and announces, as each real
// provider does on every response (SPEC R-H1): Requests per Window, the
// window starting with its first request. An OpenAI-style provider (every
// path but /v1/messages) sends x-ratelimit-limit-requests,
// x-ratelimit-remaining-requests and x-ratelimit-reset-requests (a
// duration such as "12.5s"); an Anthropic one (/v1/messages) sends
// anthropic-ratelimit-requests-limit, -remaining and -reset (RFC 3339).
// Past the quota it answers 429 with Retry-After, the remaining 0, until
// the window rolls. Now is the provider's clock (a test's fake clock;
// nil: the real one).
type Quota struct {
	Requests int
	Window   time.Duration
	Now      func() time.Time
}

// quotaState is a quota and its current window.
type quotaState struct {
	q     Quota
	start time.Time
	used  int
}

// SetQuota puts q in force from the next request (a zero Quota: none).
func (p *Provider) SetQuota(q Quota) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if q.Requests <= 0 {
		p.quota = nil
		return
	}
	if q.Now == nil {
		q.Now = time.Now
	}
	p.quota = &quotaState{q: q}
}

// takeQuota counts one request against the quota and announces what is
// left on w; it reports false when the quota is gone (the caller answers
// 429). With no quota it does nothing.
func (p *Provider) takeQuota(w http.ResponseWriter, r *http.Request) bool {
	p.mu.Lock()
	qs := p.quota
	if qs == nil {
		p.mu.Unlock()
		return true
	}
	now := qs.q.Now()
	if qs.start.IsZero() || !now.Before(qs.start.Add(qs.q.Window)) {
		qs.start, qs.used = now, 0
	}
	ok := qs.used < qs.q.Requests
	if ok {
		qs.used++
	}
	left, reset := qs.q.Requests-qs.used, qs.start.Add(qs.q.Window)
	p.mu.Unlock()
	h := w.Header()
	if strings.HasSuffix(r.URL.Path, "/v1/messages") {
		h.Set("anthropic-ratelimit-requests-limit", strconv.Itoa(qs.q.Requests))
		h.Set("anthropic-ratelimit-requests-remaining", strconv.Itoa(left))
		h.Set("anthropic-ratelimit-requests-reset", reset.UTC().Format(time.RFC3339))
	} else {
		h.Set("x-ratelimit-limit-requests", strconv.Itoa(qs.q.Requests))
		h.Set("x-ratelimit-remaining-requests", strconv.Itoa(left))
		h.Set("x-ratelimit-reset-requests", reset.Sub(now).String())
	}
	if !ok {
		h.Set("Retry-After", strconv.Itoa(int((reset.Sub(now)+time.Second-1)/time.Second)))
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`)
		p.count("status_429")
	}
	return ok
}
