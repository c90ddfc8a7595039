package redisstore

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// Signing (R-L12). Write access to fusebox's Redis keys is admin access:
// whoever can PUBLISH on the feed or HSET the overlays hash can steer every
// replica. With a fleet key (store.redis.hmac_key_file) every feed message
// and overlay document carries an HMAC-SHA256 over what it says and where
// it was written (the channel, or the hash and the gateway), so a message
// cannot be forged, nor a document moved to another gateway; an unsigned
// or badly signed one is dropped, logged and counted. Without a key,
// signed and unsigned values are both read (a fleet turning signing on
// rolls replicas one at a time), and nothing is verified.

// feedMagic starts a signed feed message: the magic, the 32-byte MAC, then
// the Envelope. An Envelope never starts with it (its first byte is a
// protobuf tag, 0x08 for schema_version).
var feedMagic = []byte("fbx1")

// overlayMagic starts a signed overlay document: "fbx1:<hex MAC>:" then the
// document, which is JSON and so never starts with it.
const overlayMagic = "fbx1:"

var errUnsigned = errors.New("unsigned or badly signed")

type signer struct{ key []byte }

func (g signer) on() bool { return len(g.key) > 0 }

func (g signer) mac(domain string, body []byte) []byte {
	m := hmac.New(sha256.New, g.key)
	m.Write([]byte(domain))
	m.Write([]byte{0})
	m.Write(body)
	return m.Sum(nil)
}

// sealFeed frames an Envelope for the feed channel.
func (g signer) sealFeed(channel string, env []byte) []byte {
	if !g.on() {
		return env
	}
	out := make([]byte, 0, len(feedMagic)+sha256.Size+len(env))
	out = append(out, feedMagic...)
	out = append(out, g.mac("feed|"+channel, env)...)
	return append(out, env...)
}

// openFeed returns the Envelope of a feed message; with a key, only a
// message signed with it.
func (g signer) openFeed(channel string, msg []byte) ([]byte, error) {
	signed := bytes.HasPrefix(msg, feedMagic) && len(msg) >= len(feedMagic)+sha256.Size
	if !g.on() {
		if signed {
			return msg[len(feedMagic)+sha256.Size:], nil
		}
		return msg, nil
	}
	if !signed {
		return nil, errUnsigned
	}
	sum, env := msg[len(feedMagic):len(feedMagic)+sha256.Size], msg[len(feedMagic)+sha256.Size:]
	if !hmac.Equal(sum, g.mac("feed|"+channel, env)) {
		return nil, errUnsigned
	}
	return env, nil
}

// sealOverlay frames gateway's overlay document for the overlays hash.
func (g signer) sealOverlay(hash, gateway string, doc []byte) []byte {
	if !g.on() {
		return doc
	}
	sum := hex.EncodeToString(g.mac("overlay|"+hash+"|"+gateway, doc))
	return append([]byte(overlayMagic+sum+":"), doc...)
}

// openOverlay returns gateway's overlay document; with a key, only one
// signed with it for this hash and gateway.
func (g signer) openOverlay(hash, gateway string, v []byte) ([]byte, error) {
	head := len(overlayMagic) + 2*sha256.Size + 1
	signed := bytes.HasPrefix(v, []byte(overlayMagic)) && len(v) >= head && v[head-1] == ':'
	if !g.on() {
		if signed {
			return v[head:], nil
		}
		return v, nil
	}
	if !signed {
		return nil, errUnsigned
	}
	sum, err := hex.DecodeString(string(v[len(overlayMagic) : head-1]))
	if err != nil || !hmac.Equal(sum, g.mac("overlay|"+hash+"|"+gateway, v[head:])) {
		return nil, errUnsigned
	}
	return v[head:], nil
}

// keyFileOK: a regular file, not writable by others.
func keyFileOK(path string, st os.FileInfo) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("store.redis.hmac_key_file: %s is not a regular file (%v)", path, st.Mode().Type())
	}
	if st.Mode().Perm()&0o002 != 0 {
		return fmt.Errorf("store.redis.hmac_key_file: %s may be written by any user (mode %04o): chmod o-w it (0400 or 0600)", path, st.Mode().Perm())
	}
	return nil
}

// MinKeyBytes is the shortest fleet key accepted: 32 bytes, SHA-256's own
// size.
const MinKeyBytes = 32

// ReadKeyFile reads a fleet key (store.redis.hmac_key_file): the file's
// bytes, surrounding whitespace trimmed (a key written by a secret mount
// often ends with a newline), at least MinKeyBytes of them.
//
// The file must be a regular file (a symlink is followed, as a secret
// mount's is) that no other user may write: a FIFO is refused before it is
// opened (before, opening one blocked validate and start-up until a writer
// came), and a key anyone can replace is no fleet key (before, a
// world-writable file was taken without a word). The open is non-blocking,
// so a FIFO swapped in between the check and the open cannot block either.
func ReadKeyFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("store.redis.hmac_key_file: %w", err)
	}
	if err := keyFileOK(path, st); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("store.redis.hmac_key_file: %w", err)
	}
	defer f.Close()
	if st, err = f.Stat(); err != nil {
		return nil, fmt.Errorf("store.redis.hmac_key_file: %w", err)
	}
	if err := keyFileOK(path, st); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("store.redis.hmac_key_file: %w", err)
	}
	key := bytes.TrimSpace(b)
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("store.redis.hmac_key_file: the key is %d bytes; use at least %d random bytes (e.g. openssl rand -hex 32)", len(key), MinKeyBytes)
	}
	return key, nil
}
