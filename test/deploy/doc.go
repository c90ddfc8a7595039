// Package deploy checks the operations kit under deploy/ with the parsers
// the tools themselves use: Prometheus's rule parser for the alert rules,
// the Kubernetes API types (decoded strictly) for the manifests, and the
// Grafana dashboard against the metric names fusebox exports. It is its own
// module so that those large dependencies stay out of fusebox's go.mod.
package deploy
