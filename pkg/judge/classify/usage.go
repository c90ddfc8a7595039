package classify

import (
	"encoding/json"
)

// Token usage, when the provider reports it (for what-if replay's cost,
// SPEC R-R1): OpenAI chat completions' usage (prompt_tokens,
// completion_tokens: in the body, or the last chunk of a stream with
// stream_options.include_usage), the Responses API's response.usage
// (input_tokens, output_tokens) and Anthropic's usage (message_start's
// input, message_delta's output, or the whole message's). An event without
// the word "usage" is not decoded for it.

var usageKey = []byte(`"usage"`)

type usageCounts struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
}

// Usage is the tokens a response reported (0 when it did not).
type Usage struct {
	InputTokens, OutputTokens int64
}

// noteUsage decodes an event's usage counts; the caller has seen the key
// (scanKeys, or bytes.Contains with usageKey).
func (t *tally) noteUsage(data []byte) {
	var v struct {
		Usage    *usageCounts `json:"usage"`
		Response *struct {
			Usage *usageCounts `json:"usage"`
		} `json:"response"`
		Message *struct {
			Usage *usageCounts `json:"usage"`
		} `json:"message"`
	}
	if json.Unmarshal(data, &v) != nil {
		return
	}
	for _, u := range []*usageCounts{v.Usage, responseUsage(v.Response), messageUsage(v.Message)} {
		if u == nil {
			continue
		}
		t.usage.InputTokens = max(t.usage.InputTokens, u.PromptTokens, u.InputTokens)
		t.usage.OutputTokens = max(t.usage.OutputTokens, u.CompletionTokens, u.OutputTokens)
	}
}

func responseUsage(r *struct {
	Usage *usageCounts `json:"usage"`
}) *usageCounts {
	if r == nil {
		return nil
	}
	return r.Usage
}

func messageUsage(m *struct {
	Usage *usageCounts `json:"usage"`
}) *usageCounts {
	if m == nil {
		return nil
	}
	return m.Usage
}

// Usage reports the tokens the body reported so far.
func (c *Classifier) Usage() Usage { return c.t.usage }
