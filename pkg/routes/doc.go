// Package routes owns fusebox's configuration: the YAML model of SPEC §2, its
// strict decoding and validation (R-P1..R-P8), policy templates and the
// four-level inheritance (R-P3), compilation into an immutable Runtime,
// candidate ordering and the residency filter (R-D1), and hot reload.
//
// It knows nothing of breaker state, Envoy or HTTP: it turns a document into
// a Runtime and publishes it through a Holder. The resolved policy type lives
// in package breaker, which routes depends on and never the other way round.
package routes
