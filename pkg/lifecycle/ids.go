package lifecycle

import (
	crand "crypto/rand"
	"encoding/hex"
	mrand "math/rand/v2"
	"strconv"
	"sync"
)

// idSources are ChaCha8 generators, each seeded from crypto/rand: a
// cryptographically secure stream (unguessable while the seed is secret) at
// a fraction of a getrandom call per decision.
var idSources = sync.Pool{New: func() any {
	var seed [32]byte
	_, _ = crand.Read(seed[:])
	return mrand.NewChaCha8(seed)
}}

// NewDecisionID returns 128 random bits in hex (R-AL2: at least 96).
func NewDecisionID() string {
	var b [16]byte
	src := idSources.Get().(*mrand.ChaCha8)
	_, _ = src.Read(b[:])
	idSources.Put(src)
	return hex.EncodeToString(b[:])
}

// ParkID names a park as a note operation: the attempt and its start, so
// that the same park sent again gets the answer it got (Note.Claims), and a
// replayed token's attempt (another start) does not.
func ParkID(p *Park) string {
	return "p" + strconv.Itoa(p.N) + "." + strconv.FormatInt(p.Start, 36)
}

// NewOpID names one event's note operation (an entry, an arrival): 64
// random bits after its kind.
func NewOpID(kind byte) string {
	var b [8]byte
	src := idSources.Get().(*mrand.ChaCha8)
	_, _ = src.Read(b[:])
	idSources.Put(src)
	return string(kind) + hex.EncodeToString(b[:])
}
