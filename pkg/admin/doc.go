// Package admin owns fusebox's HTTP side: /healthz, /readyz, /metrics, the
// /admin/v1 API behind its bearer-token middleware, and the embedded
// dashboard. It reads breaker state and configuration through narrow
// interfaces and never decides routing itself.
package admin
