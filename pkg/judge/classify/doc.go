// Package classify decides, from a 2xx response body, what an LLM attempt
// really delivered (SPEC §4: R-O4, R-O6, R-O8..R-O11, R-O13, R-O14): an
// answer, a dead turn, a length cap, reasoning only, an error inside the
// stream, a broken stream, or an unparseable body.
//
// Classifiers are incremental: chunks may split an SSE event, a line or a
// UTF-8 sequence at any byte; a stream is never buffered whole and the
// memory a classifier holds is bounded whatever the provider sends. They
// read OpenAI chat completions, OpenAI Responses and Anthropic messages,
// streaming (SSE) and not (JSON). They never log or keep the text they read
// beyond what the current event needs.
package classify
