package lifecycle

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
)

// The attempt token is sealed (SPEC R-X10). x-fusebox-attempt stays on the
// request for every attempt (docs/envoy.md: an upstream header_mutation
// that removed it would remove it for the next attempt too), so it reaches
// every provider of the chain. Sealed with AES-256-GCM, it tells a provider
// nothing: not the gateway (the tenant), not the client's path or model,
// not the other routes. Every replica that may see an attempt must open
// what another replica sealed, so a fleet shares the key (TokenKey).

// TokenAAD binds a sealed token to its use.
var TokenAAD = []byte("fusebox attempt token v1")

// Sealer seals and opens the hand-offs between streams (R-DL4): attempt
// tokens and observe notes.
type Sealer struct{ aead cipher.AEAD }

// NewSealer returns a sealer keyed by key (any length: the AES key is
// derived from it, so a fleet key file can serve), or by a random key when
// key is empty (one process: nothing else must open its tokens).
func NewSealer(key []byte) Sealer {
	var k [32]byte
	if len(key) == 0 {
		_, _ = crand.Read(k[:])
	} else {
		m := hmac.New(sha256.New, key)
		m.Write([]byte("fusebox attempt token key"))
		copy(k[:], m.Sum(nil))
	}
	block, _ := aes.NewCipher(k[:]) // a 32-byte key is always valid
	aead, _ := cipher.NewGCM(block)
	return Sealer{aead: aead}
}

// Seal seals an attempt token.
func (s Sealer) Seal(plain []byte) string { return s.SealFor(TokenAAD, plain) }

// SealFor seals plain for the use aad names.
func (s Sealer) SealFor(aad, plain []byte) string {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	_, _ = crand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, plain, aad))
}

var errSealed = errors.New("not a token sealed with this key")

// Open opens an attempt token.
func (s Sealer) Open(tok string) ([]byte, error) { return s.OpenFor(TokenAAD, tok) }

// OpenFor opens what SealFor sealed for aad.
func (s Sealer) OpenFor(aad []byte, tok string) ([]byte, error) {
	if len(tok) == 0 || len(tok) > MaxTokenBytes {
		return nil, errSealed
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < s.aead.NonceSize()+s.aead.Overhead() {
		return nil, errSealed
	}
	n := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, b[:n], b[n:], aad)
	if err != nil {
		return nil, errSealed
	}
	return plain, nil
}
