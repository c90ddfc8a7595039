//go:build !poison

package processor

// allOnWire is off but under -tags poison (harness_poison_test.go).
const allOnWire = false
