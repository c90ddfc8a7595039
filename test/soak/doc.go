// Command soak is fusebox's soak and fault campaign (make soak): fusebox
// behind the Envoy-playing proxy, in front of fake providers, under a
// bounded number of requests — streaming and not, OpenAI chat, Responses and
// Anthropic — while a fault schedule runs (provider 503 bursts, refused
// connections, resets mid-stream, slow first tokens, 429s with Retry-After,
// config reloads with alternating policies, admin force-open/close, fusebox
// killed and restarted). Every run checks its invariants and fails when
// one breaks; the report says what happened.
package main
