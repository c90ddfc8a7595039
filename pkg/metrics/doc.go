// Package metrics owns fusebox's Prometheus collectors. The metric and label
// names are the fixed ones of SPEC §9; every other package records through
// the fields of Metrics and never registers collectors of its own.
package metrics
