// Package replicav1 is the generated Go of replica.proto: the versioned
// schema of what fusebox replicas exchange through a shared store (breaker
// snapshots, transition events, overlay changes; SPEC R-ST5). Only
// replica.proto is edited by hand; `make proto` regenerates replica.pb.go.
package replicav1
