//go:build poison

package grpcwire

// poisonBuffers: built with -tags poison, every buffer given back to the
// transport's pools, and every frame an inline handler was shown, is
// overwritten at once, so that a handler that keeps a message past its
// next receive (or an inline chunk past its call) reads garbage and its
// test fails. The race detector cannot see a pool's use-after-free; this
// build can. make test runs the processor and e2e suites under it.
const poisonBuffers = true
