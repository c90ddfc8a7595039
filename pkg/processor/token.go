package processor

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

// tokenAAD binds a sealed token to its use.
var tokenAAD = []byte("fusebox attempt token v1")

// tokenSealer seals and opens attempt tokens.
type tokenSealer struct{ aead cipher.AEAD }

// newTokenSealer returns a sealer keyed by key (any length: the AES key is
// derived from it, so a fleet key file can serve), or by a random key when
// key is empty (one process: nothing else must open its tokens).
func newTokenSealer(key []byte) tokenSealer {
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
	return tokenSealer{aead: aead}
}

func (s tokenSealer) seal(plain []byte) string { return s.sealFor(tokenAAD, plain) }

// sealFor seals plain for the use aad names.
func (s tokenSealer) sealFor(aad, plain []byte) string {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	_, _ = crand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, plain, aad))
}

var errSealed = errors.New("not a token sealed with this key")

func (s tokenSealer) open(tok string) ([]byte, error) { return s.openFor(tokenAAD, tok) }

// openFor opens what sealFor sealed for aad.
func (s tokenSealer) openFor(aad []byte, tok string) ([]byte, error) {
	if len(tok) == 0 || len(tok) > maxTokenBytes {
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
