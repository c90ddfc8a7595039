// Package echo owns the bounds on what fusebox repeats back of what it was
// sent (R-L2): a client- or operator-supplied name quoted in an error is cut
// to MaxName bytes, and no error body exceeds MaxErrorBody. The ext_proc
// errors and the admin API both cut through it, so the two never disagree.
package echo
