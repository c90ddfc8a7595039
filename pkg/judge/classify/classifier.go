package classify

import (
	"bytes"
	"strings"
)

// MaxJSONBytes bounds a non-streaming body kept for parsing. A larger body
// cannot be judged and is Unparseable (a neither: it never trips a breaker
// and never closes one).
const MaxJSONBytes = 8 << 20

// API values, as the route's `api` field.
const (
	APIOpenAI    = "openai"
	APIAnthropic = "anthropic"
)

// Classifier judges one 2xx response body. Feed it every chunk in order,
// then call Finish at the body's clean end. Not safe for concurrent use.
type Classifier struct {
	anthropic  bool
	selfHosted bool // dead turns fail only on self-hosted routes (R-O4)
	// TrackGaps makes the classifier note every token delta, not only the
	// first, for stall_ms (R-T5); off, the skipped deltas cost nothing.
	TrackGaps bool
	format    uint8
	t         tally
	sse       sseParser
	buf       []byte
	tooLarge  bool
	now       int64
}

const (
	formatOther uint8 = iota
	formatSSE
	formatJSON
)

// New returns a classifier for a route speaking api whose response has
// content type ct.
func New(api, ct string) *Classifier {
	return NewForRoute(api, ct, false)
}

// NewForRoute is New for a route that may be self-hosted.
func NewForRoute(api, ct string, selfHosted bool) *Classifier {
	c := &Classifier{anthropic: api == APIAnthropic, selfHosted: selfHosted}
	ct = strings.ToLower(strings.TrimSpace(ct))
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = strings.TrimSpace(ct[:i])
	}
	switch {
	case ct == "text/event-stream":
		c.format = formatSSE
		c.sse.onEvent = c.onEvent
	case ct == "application/json" || strings.HasSuffix(ct, "+json"):
		c.format = formatJSON
	}
	return c
}

// Streaming reports whether the body is an event stream.
func (c *Classifier) Streaming() bool { return c.format == formatSSE }

func (c *Classifier) onEvent(event, data []byte) {
	hasError, hasUsage := scanKeys(data)
	if hasUsage {
		c.t.noteUsage(data)
	}
	if (c.t.visible || c.t.toolCall) && !hasError && c.skippable(event, data) {
		c.t.events++
		if c.TrackGaps && c.tokenDelta(event, data) {
			c.t.progress(c.now)
		}
		return
	}
	if c.anthropic {
		c.t.anthropicEventData(event, data, c.now)
	} else {
		c.t.openaiEventData(event, data, c.now)
	}
}

// skippable reports whether an event can change nothing once an answer was
// seen: then only the end marker and errors matter, so the common delta
// events are not decoded at all (the hot path of a long stream). An event
// with the key "error" is never skippable; the caller has looked for it
// (scanKeys).
func (c *Classifier) skippable(event, data []byte) bool {
	if c.anthropic {
		switch string(event) {
		case "content_block_delta", "content_block_start", "content_block_stop", "ping":
			return true
		}
		return false
	}
	switch string(event) {
	case "":
		// A chat chunk: [DONE] is the end marker.
		return string(data) != "[DONE]"
	case "response.completed", "response.incomplete", "response.failed", "error":
		return false
	}
	return true
}

// tokenDelta reports, without decoding, whether a skipped event carries
// output: a text or tool-call delta (R-T5 measures the gaps between them).
func (c *Classifier) tokenDelta(event, data []byte) bool {
	if c.anthropic {
		return string(event) == "content_block_delta"
	}
	switch string(event) {
	case "":
		// A chat chunk: non-empty content, or a tool call.
		if i := bytes.Index(data, []byte(`"content":"`)); i >= 0 && i+11 < len(data) && data[i+11] != '"' {
			return true
		}
		return bytes.Contains(data, []byte(`"tool_calls"`))
	case "response.output_text.delta", "response.refusal.delta", "response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
		return true
	}
	return false
}

// LastProgress is when the latest visible token or tool-call delta came
// (unix ns), 0 before the first.
func (c *Classifier) LastProgress() int64 { return c.t.lastProgress }

// Write feeds one body chunk received at now (unix ns).
func (c *Classifier) Write(chunk []byte, now int64) {
	c.now = now
	switch c.format {
	case formatSSE:
		c.sse.feed(chunk)
	case formatJSON:
		if c.tooLarge {
			return
		}
		if len(c.buf)+len(chunk) > MaxJSONBytes {
			c.tooLarge, c.buf = true, nil
			return
		}
		c.buf = append(c.buf, chunk...)
	}
}

// Finish returns the verdict once the body ended cleanly at now.
func (c *Classifier) Finish(now int64) Body {
	c.now = now
	switch c.format {
	case formatSSE:
		c.sse.close()
		if c.t.events == 0 && c.t.parseErrs == 0 && !c.t.done && c.sse.oversize > 0 {
			return Body{Kind: Unparseable}
		}
		return c.t.body(true)
	case formatJSON:
		if c.tooLarge {
			return Body{Kind: Unparseable}
		}
		if c.anthropic {
			c.t.anthropicJSON(c.buf, now)
		} else {
			c.t.openaiJSON(c.buf, now)
		}
		if bytes.Contains(c.buf, usageKey) {
			c.t.noteUsage(c.buf)
		}
		c.buf = nil
		return c.t.body(false)
	}
	return Body{Kind: NotLLM}
}
