// Package extproc owns fusebox's side of Envoy's ext_proc wire: the gRPC
// codec with its hand decoders and encoders (codec*.go, held to proto by
// their tests and fuzz targets), the replies fusebox writes (wire.go:
// CONTINUE of each kind, header and body mutations, immediate responses,
// the fusebox dynamic metadata), the error bodies in each client dialect
// (errors.go), and the scan and rewrite of a request body's model field
// (modelscan.go).
//
// It is a leaf of fusebox: it imports no fusebox package but echo (the
// echoing of client text in error bodies); the roles in pkg/processor call
// it (TestImportDirection in test/layout).
package extproc
