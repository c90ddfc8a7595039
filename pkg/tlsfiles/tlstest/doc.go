// Package tlstest makes throw-away certificates for tests: a CA, a server
// certificate for 127.0.0.1 and localhost, and a client certificate, all
// signed by the CA and written as PEM files into a directory.
package tlstest
