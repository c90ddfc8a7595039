package classify

// Kind is what a response body delivered.
type Kind uint8

const (
	// Answered: at least one visible character or one tool call, and for a
	// stream a clean end (R-O6). A success.
	Answered Kind = iota
	// NotLLM: a 2xx whose body is not an LLM response shape (embeddings, a
	// model list, audio). A success (R-O6).
	NotLLM
	// DeadTurn: a clean stop with no visible answer, no tool call and no
	// reasoning (R-O4; a failure only on self-hosted routes, R-O10).
	DeadTurn
	// LengthCap: nothing visible because of a length cap (R-O10).
	LengthCap
	// ReasoningOnly: all output was reasoning (R-O10).
	ReasoningOnly
	// ContentFilter: nothing visible because a filter stopped it (the
	// request's own fault, R-O7).
	ContentFilter
	// StreamError: an error event inside the stream, response.failed, or a
	// 2xx body carrying an error object (R-O9).
	StreamError
	// Truncated: the stream ended without its end marker (R-O9).
	Truncated
	// Unparseable: the body is not the shape its content-type promises
	// (R-O11).
	Unparseable
	// NoOutput: nothing visible and no finish reason to explain it.
	NoOutput
)

var kindNames = [...]string{"answered", "not_llm", "dead_turn", "length_cap", "reasoning_only", "content_filter", "stream_error", "truncated", "unparseable", "no_output"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Body is what a response body delivered: the classifier's reading of it,
// before it becomes the attempt's breaker.Result (see Result).
type Body struct {
	Kind Kind
	// FirstVisibleNs is when the first visible character or tool call
	// arrived (unix ns), 0 if none: the time to first token of R-T4.
	FirstVisibleNs int64
}

// finish reasons, normalised across providers.
const (
	finNone uint8 = iota
	finStop
	finLength
	finTool
	finFilter
	finOther
)

// tally accumulates what a body showed so far.
type tally struct {
	visible      bool
	firstVisible int64
	lastProgress int64 // the latest visible token or tool-call delta (R-T5)
	maxGap       int64 // the longest gap between two of them, ns
	toolCall     bool
	reasoning    bool
	finish       uint8
	done         bool // the stream's clean end marker
	errored      bool
	parseErrs    int
	events       int
	notLLM       bool // a whole JSON body of another shape
	usage        Usage
}

func (t *tally) sawVisible(now int64) {
	if !t.visible {
		t.visible, t.firstVisible = true, now
	}
	t.progress(now)
}

func (t *tally) sawTool(now int64) {
	t.toolCall = true
	if t.firstVisible == 0 {
		t.firstVisible = now
	}
	t.progress(now)
}

// progress notes a visible token or tool-call delta at now: the gaps
// between them are what stall_ms measures (R-T5).
func (t *tally) progress(now int64) {
	if t.lastProgress != 0 && now-t.lastProgress > t.maxGap {
		t.maxGap = now - t.lastProgress
	}
	t.lastProgress = now
}

// setFinish keeps the most telling finish reason across choices: a length
// cap explains an empty answer better than a stop does.
func (t *tally) setFinish(f uint8) {
	if f == finNone {
		return
	}
	if t.finish == finNone || f == finLength || (f == finFilter && t.finish != finLength) {
		t.finish = f
	}
}

func (t *tally) body(stream bool) Body {
	v := Body{FirstVisibleNs: t.firstVisible}
	switch {
	case t.errored:
		v.Kind = StreamError
	case t.events == 0 && t.parseErrs > 0:
		v.Kind = Unparseable
	case t.notLLM:
		v.Kind = NotLLM
	case stream && !t.done:
		v.Kind = Truncated
	case t.visible || t.toolCall:
		v.Kind = Answered
	case t.parseErrs > 0:
		v.Kind = Unparseable
	case t.finish == finLength:
		v.Kind = LengthCap
	case t.reasoning:
		v.Kind = ReasoningOnly
	case t.finish == finFilter:
		v.Kind = ContentFilter
	case t.finish == finStop:
		v.Kind = DeadTurn
	default:
		v.Kind = NoOutput
	}
	return v
}

// visibleText reports whether s holds a non-whitespace character.
func visibleText[T string | []byte](s T) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ', '\t', '\n', '\r', '\f', '\v':
		default:
			if s[i] < 0x80 {
				return true
			}
			return hasVisibleRune(string(s[i:]))
		}
	}
	return false
}
