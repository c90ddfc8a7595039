// Package envoyconfig loads the shipped Envoy configuration (envoy/*.yaml)
// into go-control-plane's Bootstrap, resolving every typed_config and
// running ValidateAll, and derives the Envoy-playing harness's settings
// from it, so that the harness and the deployment cannot drift.
package envoyconfig
