// Package envoy holds the Envoy configurations fusebox ships, embedded so
// that tools (extproc simulate) play the same file the deployment uses.
package envoy

import _ "embed"

// Default is envoy.yaml, the deployment (no failover).
//
//go:embed envoy.yaml
var Default []byte
