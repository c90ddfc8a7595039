package classify

import (
	"unicode/utf8"
)

// chatChunkFast reads the common OpenAI chat-completion chunk without
// encoding/json, which was the largest share of fusebox's own CPU on a
// streamed request (the first chunks are decoded until an answer is seen).
// It accepts only a shape it can read exactly as the general decoder does —
// known keys spelt exactly, each once, strings without escapes, every field
// of the right type — and applies nothing unless it read the whole event;
// anything else answers false and the caller decodes it with
// encoding/json. FuzzChatChunkFast holds the two paths to the same result.
func (t *tally) chatChunkFast(data []byte, now int64) bool {
	p := fastParser{b: data}
	var f chunkFindings
	if !p.chunk(&f) {
		return false
	}
	t.events++
	for _, c := range f.choices[:f.n] {
		if c.visible {
			t.sawVisible(now)
		}
		if c.tool {
			t.sawTool(now)
		}
		if c.reasoning {
			t.reasoning = true
		}
		if c.hasFinish {
			t.setFinish(c.finish)
		}
	}
	return true
}

// fastEnabled lets the differential tests run the general path alone.
var fastEnabled = true

const maxFastChoices = 4

type choiceFindings struct {
	visible, tool, reasoning, hasFinish bool
	finish                              uint8
}

type chunkFindings struct {
	choices [maxFastChoices]choiceFindings
	n       int
}

type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *fastParser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *fastParser) eat(c byte) bool {
	p.ws()
	if p.peek() != c {
		return false
	}
	p.i++
	return true
}

// str reads a string without escapes or control characters, valid UTF-8.
// The bytes are the input's own: nothing is copied.
func (p *fastParser) str() ([]byte, bool) {
	p.ws()
	if p.peek() != '"' {
		return nil, false
	}
	start := p.i + 1
	for j := start; j < len(p.b); j++ {
		switch c := p.b[j]; {
		case c == '"':
			s := p.b[start:j]
			if !utf8.Valid(s) {
				return nil, false
			}
			p.i = j + 1
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

// null reads the literal null if it is next.
func (p *fastParser) null() bool {
	p.ws()
	if len(p.b)-p.i >= 4 && string(p.b[p.i:p.i+4]) == "null" {
		p.i += 4
		return true
	}
	return false
}

// skip passes over any valid JSON value (depth-bounded).
func (p *fastParser) skip(depth int) bool {
	if depth > 32 {
		return false
	}
	p.ws()
	switch c := p.peek(); {
	case c == '"':
		_, ok := p.str()
		return ok
	case c == '{':
		p.i++
		if p.eat('}') {
			return true
		}
		for {
			if _, ok := p.str(); !ok || !p.eat(':') || !p.skip(depth+1) {
				return false
			}
			if p.eat('}') {
				return true
			}
			if !p.eat(',') {
				return false
			}
		}
	case c == '[':
		p.i++
		if p.eat(']') {
			return true
		}
		for {
			if !p.skip(depth + 1) {
				return false
			}
			if p.eat(']') {
				return true
			}
			if !p.eat(',') {
				return false
			}
		}
	case c == 't':
		return p.lit("true")
	case c == 'f':
		return p.lit("false")
	case c == 'n':
		return p.lit("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	return false
}

func (p *fastParser) lit(s string) bool {
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// number accepts a JSON number (RFC 8259 grammar).
func (p *fastParser) number() bool {
	j := p.i
	if j < len(p.b) && p.b[j] == '-' {
		j++
	}
	digits := func() int {
		n := 0
		for j < len(p.b) && p.b[j] >= '0' && p.b[j] <= '9' {
			j++
			n++
		}
		return n
	}
	if j < len(p.b) && p.b[j] == '0' {
		j++
	} else if digits() == 0 {
		return false
	}
	if j < len(p.b) && p.b[j] == '.' {
		j++
		if digits() == 0 {
			return false
		}
	}
	if j < len(p.b) && (p.b[j] == 'e' || p.b[j] == 'E') {
		j++
		if j < len(p.b) && (p.b[j] == '+' || p.b[j] == '-') {
			j++
		}
		if digits() == 0 {
			return false
		}
	}
	p.i = j
	return true
}

// object walks an object's members, calling member for each key; a key seen
// twice fails (the general decoder keeps the last one).
func (p *fastParser) object(member func(key []byte) bool) bool {
	if !p.eat('{') {
		return false
	}
	if p.eat('}') {
		return true
	}
	var seen [12][]byte
	n := 0
	for {
		k, ok := p.str()
		if !ok || !p.eat(':') {
			return false
		}
		for _, s := range seen[:n] {
			if string(s) == string(k) {
				return false
			}
		}
		if n == len(seen) {
			return false
		}
		seen[n] = k
		n++
		if !member(k) {
			return false
		}
		if p.eat('}') {
			return true
		}
		if !p.eat(',') {
			return false
		}
	}
}

// optString reads a string or null into visible (a *string field).
func (p *fastParser) optString() (s []byte, isNull, ok bool) {
	if p.null() {
		return nil, true, true
	}
	s, ok = p.str()
	return s, false, ok
}

func (p *fastParser) chunk(f *chunkFindings) bool {
	ok := p.object(func(k []byte) bool {
		switch string(k) {
		case "choices":
			return p.choices(f)
		case "object":
			_, _, ok := p.optString()
			return ok
		case "id", "created", "model", "system_fingerprint", "service_tier", "usage", "obfuscation":
			return p.skip(0)
		}
		return false // error, type, delta, item, response, … : the general path
	})
	p.ws()
	return ok && p.i == len(p.b)
}

func (p *fastParser) choices(f *chunkFindings) bool {
	if p.null() {
		return true
	}
	if !p.eat('[') {
		return false
	}
	if p.eat(']') {
		return true
	}
	for {
		if f.n == maxFastChoices {
			return false
		}
		c := &f.choices[f.n]
		f.n++
		if !p.choice(c) {
			return false
		}
		if p.eat(']') {
			return true
		}
		if !p.eat(',') {
			return false
		}
	}
}

func (p *fastParser) choice(c *choiceFindings) bool {
	p.ws()
	if p.peek() != '{' {
		return false
	}
	return p.object(func(k []byte) bool {
		switch string(k) {
		case "delta", "message":
			return p.message(c)
		case "text":
			s, _, ok := p.optString()
			c.visible = c.visible || visibleText(s)
			return ok
		case "finish_reason":
			s, isNull, ok := p.optString()
			if ok && !isNull {
				c.hasFinish, c.finish = true, chatFinish(string(s))
			}
			return ok
		case "index", "logprobs":
			return p.skip(0)
		}
		return false
	})
}

func (p *fastParser) message(c *choiceFindings) bool {
	if p.null() {
		return true
	}
	p.ws()
	if p.peek() != '{' {
		return false
	}
	return p.object(func(k []byte) bool {
		switch string(k) {
		case "content", "refusal":
			s, _, ok := p.optString()
			c.visible = c.visible || visibleText(s)
			return ok
		case "reasoning_content", "reasoning":
			s, _, ok := p.optString()
			c.reasoning = c.reasoning || visibleText(s)
			return ok
		case "tool_calls":
			if p.null() {
				return true
			}
			p.ws()
			if p.peek() != '[' {
				return false
			}
			start := p.i
			if !p.skip(0) {
				return false
			}
			// A non-empty array is a tool call.
			inner := p.b[start+1 : p.i-1]
			for _, ch := range inner {
				if ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r' {
					c.tool = true
					break
				}
			}
			return true
		case "function_call":
			if p.null() {
				return true
			}
			c.tool = true
			return p.skip(0)
		case "role", "annotations":
			return p.skip(0)
		}
		return false
	})
}
