//go:build !poison

package grpcwire

// poisonBuffers is off in every build but -tags poison (poison_on.go).
const poisonBuffers = false
