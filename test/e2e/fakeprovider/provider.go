package fakeprovider

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Fault is what the provider does wrong; the zero Fault answers normally.
type Fault struct {
	Status       int    `json:"status,omitempty"` // answer this status with an error body
	RetryAfter   string // Retry-After header on a Status answer
	RetryAfterMs string // retry-after-ms header
	// ResetBeforeHeaders closes the connection without answering.
	ResetBeforeHeaders bool
	// ResetMidStream sends headers and part of the body, then closes.
	ResetMidStream bool
	// SlowFirstToken delays the first visible token (streams) or the whole
	// answer.
	SlowFirstToken time.Duration
	// Hang delays the response headers (to hit Envoy's route timeout).
	Hang       time.Duration
	DeadTurn   bool // a clean stop with no visible text
	LengthCap  bool // finish_reason length with no visible text
	ErrorEvent bool // an error event inside the stream
	// StallAfterFirstToken holds a stream after its first token until the
	// channel is closed (or the client goes away): a stall mid-generation.
	StallAfterFirstToken chan struct{} `json:"-"`
	// Trailers ends every answer with an HTTP trailer (as gRPC-style and
	// some self-hosted servers do): the body's last data frame does not end
	// the stream.
	Trailers bool
	// OnRequest, when set, runs as each request arrives (a test moves a
	// fake clock with it: the time a hung request costs).
	OnRequest func() `json:"-"`
	// OnlyBodyContaining, when set, limits the fault to requests whose
	// body contains it (a poison request); the others are served as usual.
	OnlyBodyContaining string `json:"only_body_containing,omitempty"`
}

// Provider is one fake upstream (one Envoy cluster).
type Provider struct {
	Name string
	addr string

	mu     sync.Mutex
	tally  map[string]int64
	fault  Fault
	ln     net.Listener
	srv    *http.Server
	served atomic.Int64
	last   http.Header
	model  string
	path   string
	quota  *quotaState // SetQuota; nil: none
}

// Start listens on a free loopback port.
func Start(name string) (*Provider, error) {
	p := &Provider{Name: name}
	if err := p.listen("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Provider) listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ln, p.addr = ln, ln.Addr().String()
	p.srv = &http.Server{Handler: p}
	srv := p.srv
	p.mu.Unlock()
	go srv.Serve(ln)
	return nil
}

// Addr is host:port.
func (p *Provider) Addr() string { return p.addr }

// Down closes the listener: connections are refused.
func (p *Provider) Down() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// Refuse closes the listener, so that new connections are refused, and
// lets the requests in flight finish (for at most 2 s) before it closes
// what is left. Down closes every connection at once: a response the
// provider had written whole, and tallied complete, could still be lost
// in the RST before the proxy read it, so that the tally said one more
// success than the proxy ever saw (the fleet soak: 9,836 completed, 9,835
// counted).
func (p *Provider) Refuse() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if srv.Shutdown(ctx) != nil {
		srv.Close()
	}
}

// Up listens again on the same address.
func (p *Provider) Up() error {
	p.mu.Lock()
	up := p.srv != nil
	p.mu.Unlock()
	if up {
		return nil
	}
	var err error
	for i := 0; i < 50; i++ { // the port may linger briefly
		if err = p.listen(p.addr); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// Close stops the provider.
func (p *Provider) Close() { p.Down() }

// SetFault changes what the provider does from the next request on.
func (p *Provider) SetFault(f Fault) {
	p.mu.Lock()
	p.fault = f
	p.mu.Unlock()
}

// Tally counts what the provider answered: "complete" (a whole answer),
// "status_<code>" (an injected error status), "reset_mid" (a stream cut by
// the provider), "cut" (the connection went mid-stream, after the headers),
// "cut_before_headers" (it went before the client saw anything), and
// "slow_first_token" (an answer the fault slowed, besides how it ended).
func (p *Provider) Tally() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int64, len(p.tally))
	for k, v := range p.tally {
		out[k] = v
	}
	return out
}

func (p *Provider) count(kind string) {
	p.mu.Lock()
	if p.tally == nil {
		p.tally = map[string]int64{}
	}
	p.tally[kind]++
	p.mu.Unlock()
}

// Served counts the requests that reached the provider.
func (p *Provider) Served() int64 { return p.served.Load() }

// LastRequest returns the headers and model of the last request.
func (p *Provider) LastRequest() (http.Header, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last, p.model
}

// LastPath returns the path (with its query) of the last request.
func (p *Provider) LastPath() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.path
}

// FaultPath is the control endpoint: POST a Fault as JSON to change what
// the provider does (the demo and docker-compose use it).
const FaultPath = "/__fault"

func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == FaultPath && r.Method == http.MethodPost {
		var f Fault
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&f); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p.SetFault(f)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	p.served.Add(1)
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	p.mu.Lock()
	f := p.fault
	p.last, p.model, p.path = r.Header.Clone(), req.Model, r.URL.RequestURI()
	p.mu.Unlock()
	if f.OnlyBodyContaining != "" && !strings.Contains(string(body), f.OnlyBodyContaining) {
		f = Fault{}
	}

	if f.OnRequest != nil {
		f.OnRequest()
	}
	if f.ResetBeforeHeaders {
		hijackClose(w)
		return
	}
	w.Header().Set("X-Served-By", p.Name)
	if f.Trailers {
		w.Header().Set("Trailer", "X-Upstream-Done")
		defer w.Header().Set("X-Upstream-Done", "1")
	}
	if f.Hang > 0 {
		select {
		case <-time.After(f.Hang):
		case <-r.Context().Done():
			return
		}
	}
	if f.Status == 0 && !p.takeQuota(w, r) {
		return
	}
	if f.Status != 0 {
		if f.RetryAfter != "" {
			w.Header().Set("Retry-After", f.RetryAfter)
		}
		if f.RetryAfterMs != "" {
			w.Header().Set("retry-after-ms", f.RetryAfterMs)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.Status)
		fmt.Fprintf(w, `{"error":{"message":"injected %d","type":"server_error","code":null}}`, f.Status)
		p.count(fmt.Sprintf("status_%d", f.Status))
		return
	}
	switch {
	case strings.HasSuffix(r.URL.Path, "/v1/messages"):
		p.anthropic(w, r, req.Model, req.Stream, f)
	case strings.HasSuffix(r.URL.Path, "/v1/responses"):
		p.responses(w, r, req.Model, req.Stream, f)
	case strings.HasSuffix(r.URL.Path, "/chat/completions"):
		p.chat(w, r, req.Model, req.Stream, f)
	case r.URL.Path == "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","owned_by":%q}]}`, "fake", p.Name)
	default:
		http.NotFound(w, r)
	}
}

func hijackClose(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // RST, not FIN
			}
			c.Close()
		}
	}
}

func (p *Provider) answerText(f Fault) string {
	switch {
	case f.DeadTurn, f.LengthCap:
		return ""
	}
	return "Hello from " + p.Name
}

// done tallies a whole non-streamed answer, or one the connection lost.
// A non-streamed answer goes out headers and body together: lost, the
// client saw nothing (a reset before headers, which Envoy retries and
// fusebox judges a connection error). It is flushed before it is tallied:
// the encoder writes into the server's buffer, and a connection closed
// before the flush loses an answer that would have counted complete.
func (p *Provider) done(w http.ResponseWriter, err error) {
	if err == nil {
		err = http.NewResponseController(w).Flush()
	}
	if err != nil {
		p.count("cut_before_headers")
		return
	}
	p.count("complete")
}

func flush(w http.ResponseWriter) {
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
}

// sse writes the events of a stream, then resets or ends as the fault says.
func (p *Provider) sse(w http.ResponseWriter, r *http.Request, f Fault, events []string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(200)
	if err := http.NewResponseController(w).Flush(); err != nil {
		// The connection went before the headers did.
		p.count("cut_before_headers")
		return
	}
	for i, ev := range events {
		if i == 1 && f.SlowFirstToken > 0 {
			p.count("slow_first_token")
			select {
			case <-time.After(f.SlowFirstToken):
			case <-r.Context().Done():
				p.count("cut")
				return
			}
		}
		if i == 2 && f.StallAfterFirstToken != nil {
			select {
			case <-f.StallAfterFirstToken:
			case <-r.Context().Done():
				p.count("cut")
				return
			}
		}
		if f.ResetMidStream && i == len(events)/2 {
			hijackClose(w)
			p.count("reset_mid")
			return
		}
		if _, err := io.WriteString(w, ev); err != nil {
			p.count("cut")
			return
		}
		flush(w)
	}
	p.count("complete")
}

func jsonEvent(event string, v any) string {
	b, _ := json.Marshal(v)
	if event == "" {
		return "data: " + string(b) + "\n\n"
	}
	return "event: " + event + "\ndata: " + string(b) + "\n\n"
}

func (p *Provider) chat(w http.ResponseWriter, r *http.Request, model string, stream bool, f Fault) {
	text := p.answerText(f)
	finish := "stop"
	if f.LengthCap {
		finish = "length"
	}
	if !stream {
		if f.SlowFirstToken > 0 {
			p.count("slow_first_token")
			time.Sleep(f.SlowFirstToken)
		}
		w.Header().Set("Content-Type", "application/json")
		p.done(w, json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-fake", "object": "chat.completion", "model": model,
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "finish_reason": finish}},
		}))
		return
	}
	chunk := func(delta map[string]any, fin any) string {
		return jsonEvent("", map[string]any{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": fin}}})
	}
	events := []string{chunk(map[string]any{"role": "assistant", "content": ""}, nil)}
	for _, word := range strings.SplitAfter(text, " ") {
		events = append(events, chunk(map[string]any{"content": word}, nil))
	}
	if f.ErrorEvent {
		events = append(events, jsonEvent("", map[string]any{"error": map[string]any{"message": "injected", "type": "server_error"}}))
	}
	events = append(events, chunk(map[string]any{}, finish), "data: [DONE]\n\n")
	p.sse(w, r, f, events)
}

func (p *Provider) responses(w http.ResponseWriter, r *http.Request, model string, stream bool, f Fault) {
	text := p.answerText(f)
	status, incomplete := "completed", any(nil)
	if f.LengthCap {
		status, incomplete = "incomplete", map[string]any{"reason": "max_output_tokens"}
	}
	resp := map[string]any{"id": "resp_fake", "object": "response", "model": model, "status": status, "incomplete_details": incomplete,
		"output": []any{map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": text}}}}}
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		p.done(w, json.NewEncoder(w).Encode(resp))
		return
	}
	events := []string{jsonEvent("response.created", map[string]any{"type": "response.created", "response": map[string]any{"id": "resp_fake", "status": "in_progress", "output": []any{}}})}
	for _, word := range strings.SplitAfter(text, " ") {
		events = append(events, jsonEvent("response.output_text.delta", map[string]any{"type": "response.output_text.delta", "delta": word}))
	}
	if f.ErrorEvent {
		events = append(events, jsonEvent("error", map[string]any{"type": "error", "code": "server_error", "message": "injected"}))
	}
	end := "response.completed"
	if f.LengthCap {
		end = "response.incomplete"
	}
	events = append(events, jsonEvent(end, map[string]any{"type": end, "response": resp}))
	p.sse(w, r, f, events)
}

func (p *Provider) anthropic(w http.ResponseWriter, r *http.Request, model string, stream bool, f Fault) {
	text := p.answerText(f)
	stop := "end_turn"
	if f.LengthCap {
		stop = "max_tokens"
	}
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		p.done(w, json.NewEncoder(w).Encode(map[string]any{"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
			"content": []any{map[string]any{"type": "text", "text": text}}, "stop_reason": stop}))
		return
	}
	events := []string{
		jsonEvent("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_fake", "type": "message", "role": "assistant", "content": []any{}, "model": model,
			"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": 5, "output_tokens": 1}}}),
		jsonEvent("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}}),
	}
	for _, word := range strings.SplitAfter(text, " ") {
		events = append(events, jsonEvent("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": word}}))
	}
	if f.ErrorEvent {
		events = append(events, jsonEvent("error", map[string]any{"type": "error", "error": map[string]any{"type": "overloaded_error", "message": "Overloaded"}}))
	}
	events = append(events,
		jsonEvent("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}),
		jsonEvent("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
			"usage": map[string]any{"output_tokens": len(strings.Fields(text))}}),
		jsonEvent("message_stop", map[string]any{"type": "message_stop"}))
	p.sse(w, r, f, events)
}
