// Package h2spy forwards HTTP/2 client connections to a server and
// reads the client's frames on the way: the tests that hold our
// Envoy-playing clients (envoysim, wirebench's driver) to what Envoy's
// HTTP/2 codec sends use it to count PING frames and read the SETTINGS.
package h2spy
