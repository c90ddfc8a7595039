package classify

import "encoding/json"

type anthBlock struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Thinking string `json:"thinking"`
}

type anthEvent struct {
	Type         string     `json:"type"`
	ContentBlock *anthBlock `json:"content_block"`
	Delta        *struct {
		Type       string `json:"type"`
		Text       string `json:"text"`
		Thinking   string `json:"thinking"`
		StopReason string `json:"stop_reason"`
	} `json:"delta"`
	Error      json.RawMessage `json:"error"`
	Content    []anthBlock     `json:"content"`
	StopReason string          `json:"stop_reason"`
}

func anthFinish(s string) uint8 {
	switch s {
	case "end_turn", "stop_sequence":
		return finStop
	case "max_tokens", "model_context_window_exceeded":
		return finLength
	case "tool_use":
		return finTool
	case "refusal":
		return finFilter
	case "":
		return finNone
	}
	return finOther
}

func (t *tally) anthBlock(b *anthBlock, now int64) {
	switch b.Type {
	case "text":
		if visibleText(b.Text) {
			t.sawVisible(now)
		}
	case "thinking", "redacted_thinking":
		t.reasoning = true
	case "tool_use", "server_tool_use", "mcp_tool_use":
		t.sawTool(now)
	}
}

// anthropicEventData handles one SSE event of a Messages stream.
func (t *tally) anthropicEventData(event, data []byte, now int64) {
	if string(event) == "error" {
		t.errored = true
	}
	var ev anthEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		t.parseErrs++
		return
	}
	t.events++
	switch ev.Type {
	case "content_block_start":
		if ev.ContentBlock != nil {
			t.anthBlock(ev.ContentBlock, now)
		}
	case "content_block_delta":
		if d := ev.Delta; d != nil {
			switch d.Type {
			case "text_delta":
				if visibleText(d.Text) {
					t.sawVisible(now)
				}
			case "thinking_delta", "signature_delta":
				t.reasoning = true
			case "input_json_delta":
				t.sawTool(now)
			}
		}
	case "message_delta":
		if ev.Delta != nil {
			t.setFinish(anthFinish(ev.Delta.StopReason))
		}
	case "message_stop":
		t.done = true
	case "error":
		t.errored = true
	}
}

// anthropicJSON handles a whole (non-streaming) Messages response.
func (t *tally) anthropicJSON(body []byte, now int64) {
	var ev anthEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		t.parseErrs++
		return
	}
	t.events++
	switch {
	case ev.Type == "error" || !isNull(ev.Error):
		t.errored = true
	case ev.Type == "message":
		for i := range ev.Content {
			t.anthBlock(&ev.Content[i], now)
		}
		t.setFinish(anthFinish(ev.StopReason))
	default:
		t.notLLM = true
	}
}
