package classify

import "encoding/json"

// OpenAI chat completions (chunks and whole completions) and the Responses
// API (events and whole responses) share the "openai" api.

type chatMsg struct {
	Content          json.RawMessage   `json:"content"`
	ToolCalls        []json.RawMessage `json:"tool_calls"`
	FunctionCall     json.RawMessage   `json:"function_call"`
	ReasoningContent *string           `json:"reasoning_content"`
	Reasoning        *string           `json:"reasoning"`
	Refusal          *string           `json:"refusal"`
}

type chatChoice struct {
	Delta        *chatMsg `json:"delta"`
	Message      *chatMsg `json:"message"`
	Text         *string  `json:"text"` // legacy completions
	FinishReason *string  `json:"finish_reason"`
}

type respItem struct {
	Type    string `json:"type"`
	Content []struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Refusal string `json:"refusal"`
	} `json:"content"`
}

type respBody struct {
	Status            string                   `json:"status"`
	Output            []respItem               `json:"output"`
	IncompleteDetails *struct{ Reason string } `json:"incomplete_details"`
	Error             json.RawMessage          `json:"error"`
}

// openaiEvent is the union of a chat chunk/completion and a Responses
// event/response.
type openaiEvent struct {
	Object  string          `json:"object"`
	Type    string          `json:"type"`
	Choices []chatChoice    `json:"choices"`
	Error   json.RawMessage `json:"error"`
	// Responses API.
	Delta    json.RawMessage `json:"delta"`
	Item     *respItem       `json:"item"`
	Response *respBody       `json:"response"`
	respBody
}

func isNull(r json.RawMessage) bool {
	return len(r) == 0 || string(r) == "null"
}

func chatFinish(s string) uint8 {
	switch s {
	case "stop", "eos", "end_turn":
		return finStop
	case "length", "max_tokens":
		return finLength
	case "tool_calls", "function_call":
		return finTool
	case "content_filter":
		return finFilter
	case "":
		return finNone
	}
	return finOther
}

// contentVisible reads a chat content field: a string, or an array of parts.
func contentVisible(raw json.RawMessage) bool {
	if isNull(raw) {
		return false
	}
	if raw[0] == '"' {
		var s string
		return json.Unmarshal(raw, &s) == nil && visibleText(s)
	}
	if raw[0] == '[' {
		var parts []struct {
			Type, Text, Refusal string
		}
		if json.Unmarshal(raw, &parts) != nil {
			return false
		}
		for _, p := range parts {
			if visibleText(p.Text) || visibleText(p.Refusal) {
				return true
			}
		}
	}
	return false
}

func (t *tally) chatMessage(m *chatMsg, now int64) {
	if m == nil {
		return
	}
	if contentVisible(m.Content) || (m.Refusal != nil && visibleText(*m.Refusal)) {
		t.sawVisible(now)
	}
	if len(m.ToolCalls) > 0 || !isNull(m.FunctionCall) {
		t.sawTool(now)
	}
	if (m.ReasoningContent != nil && visibleText(*m.ReasoningContent)) || (m.Reasoning != nil && visibleText(*m.Reasoning)) {
		t.reasoning = true
	}
}

func (t *tally) respOutput(b *respBody, now int64) {
	for i := range b.Output {
		t.respItem(&b.Output[i], now)
	}
	switch b.Status {
	case "completed":
		t.setFinish(finStop)
	case "incomplete":
		if b.IncompleteDetails != nil && b.IncompleteDetails.Reason == "content_filter" {
			t.setFinish(finFilter)
		} else {
			t.setFinish(finLength)
		}
	case "failed":
		t.errored = true
	}
	if !isNull(b.Error) {
		t.errored = true
	}
}

func (t *tally) respItem(it *respItem, now int64) {
	switch it.Type {
	case "message":
		for _, c := range it.Content {
			if visibleText(c.Text) || visibleText(c.Refusal) {
				t.sawVisible(now)
			}
		}
	case "reasoning":
		t.reasoning = true
	case "":
	default:
		// function_call, custom_tool_call, web_search_call, … : the model
		// acted.
		t.sawTool(now)
	}
}

// openaiEventData handles one SSE event of a chat stream or a Responses
// stream.
func (t *tally) openaiEventData(event, data []byte, now int64) {
	if string(data) == "[DONE]" {
		t.done = true
		return
	}
	if string(event) == "error" {
		t.errored = true
	}
	if fastEnabled && len(event) == 0 && t.chatChunkFast(data, now) {
		return
	}
	var ev openaiEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		t.parseErrs++
		return
	}
	t.events++
	if !isNull(ev.Error) && ev.Type != "response.failed" {
		t.errored = true
	}
	switch ev.Type {
	case "":
		for i := range ev.Choices {
			c := &ev.Choices[i]
			t.chatMessage(c.Delta, now)
			t.chatMessage(c.Message, now)
			if c.Text != nil && visibleText(*c.Text) {
				t.sawVisible(now)
			}
			if c.FinishReason != nil {
				t.setFinish(chatFinish(*c.FinishReason))
			}
		}
	case "response.output_text.delta", "response.refusal.delta":
		var s string
		if json.Unmarshal(ev.Delta, &s) == nil && visibleText(s) {
			t.sawVisible(now)
		}
	case "response.reasoning_text.delta", "response.reasoning_summary_text.delta":
		t.reasoning = true
	case "response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
		t.sawTool(now)
	case "response.output_item.added", "response.output_item.done":
		if ev.Item != nil {
			// An empty message item is not an answer yet.
			t.respItem(ev.Item, now)
		}
	case "response.completed", "response.incomplete":
		t.done = true
		if ev.Response != nil {
			t.respOutput(ev.Response, now)
		}
	case "response.failed", "error":
		t.errored = true
	}
}

// openaiJSON handles a whole (non-streaming) chat completion or response.
func (t *tally) openaiJSON(body []byte, now int64) {
	var ev openaiEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		t.parseErrs++
		return
	}
	t.events++
	switch {
	case !isNull(ev.Error):
		t.errored = true
	case ev.Object == "response" || ev.Status != "":
		t.respOutput(&ev.respBody, now)
	case len(ev.Choices) > 0:
		for i := range ev.Choices {
			c := &ev.Choices[i]
			t.chatMessage(c.Message, now)
			t.chatMessage(c.Delta, now)
			if c.Text != nil && visibleText(*c.Text) {
				t.sawVisible(now)
			}
			if c.FinishReason != nil {
				t.setFinish(chatFinish(*c.FinishReason))
			}
		}
	default:
		t.notLLM = true
	}
}
