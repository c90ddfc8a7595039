// Package tlsfiles serves TLS from certificate files that are re-read when
// they change (R-L5): a rotated certificate (cert-manager, a Kubernetes
// secret's symlink swap) is picked up by the next handshake, with no
// restart. It owns nothing else.
package tlsfiles
