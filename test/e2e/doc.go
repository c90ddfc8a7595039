// Package e2e runs fusebox the way it is deployed — Envoy in front (played
// by envoysim, faithful to docs/ext_proc.md), real HTTP to fake providers — through
// outages and recoveries. Time is a fake clock injected into fusebox, so
// no scenario sleeps to wait for a cooldown.
package e2e
