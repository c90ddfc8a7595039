// Command extproc is fusebox: an Envoy ext_proc sidecar that keeps a circuit
// breaker per LLM route. The wiring lives in mainlib so tests can run it
// in-process; this file only turns signals into a context.
package main
