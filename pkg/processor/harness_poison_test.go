//go:build poison

package processor

// allOnWire: under the poison build every harness serves on fusebox's own
// transport, whose pooled buffers that build overwrites once given back.
const allOnWire = true
