// Package fakeprovider serves OpenAI-compatible (chat completions and
// Responses) and Anthropic-compatible endpoints, streaming and not, for
// fusebox's end-to-end tests and demo. Faults are injected per provider at
// run time: statuses, 429 with Retry-After, connection refused, a reset
// before or after headers, a slow first token, dead turns, length caps and
// error events.
package fakeprovider
