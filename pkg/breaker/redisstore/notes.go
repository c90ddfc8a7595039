package redisstore

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/redis/go-redis/v9"
)

// Notes (breaker/notes.go) live under <prefix>note:<name> with Redis's own
// expiry. The compare-and-set is one script: a GET, a comparison of the
// whole stored value, then SET PX or DEL. Values are signed like overlay
// documents when the fleet has a key: a note names a route and its
// admission, and a forged one must not steer an outcome.

// A (named arguments, R-ST16): prev (absent: the note must not exist),
// next (absent: delete it), ttl_ms.
var swapNote = redis.NewScript(`
local A = cmsgpack.unpack(ARGV[1])
local cur = redis.call('GET', KEYS[1])
local match
if A.prev == nil then match = (cur == false) else match = (cur == A.prev) end
if not match then
  if cur == false then return {0} end
  return {0, cur}
end
if A.next == nil then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], A.next, 'PX', A.ttl_ms) end
return {1}
`)

const noteMagic = "fbn1:"

func (g signer) sealNote(name string, v []byte) []byte { return g.sealIn("note|"+name, v) }

func (g signer) openNote(name string, v []byte) ([]byte, error) { return g.openIn("note|"+name, v) }

// sealIn signs v for domain (with a fleet key; unchanged without one), and
// openIn checks it: a note or a journal entry in Redis is something only
// a replica of the fleet wrote.
func (g signer) sealIn(domain string, v []byte) []byte {
	if v == nil || !g.on() {
		return v
	}
	sum := hex.EncodeToString(g.mac(domain, v))
	return append([]byte(noteMagic+sum+":"), v...)
}

func (g signer) openIn(domain string, v []byte) ([]byte, error) {
	if !g.on() {
		return v, nil
	}
	head := len(noteMagic) + 2*sha256.Size + 1
	if !bytes.HasPrefix(v, []byte(noteMagic)) || len(v) < head || v[head-1] != ':' {
		return nil, errUnsigned
	}
	sum, err := hex.DecodeString(string(v[len(noteMagic) : head-1]))
	if err != nil || !hmac.Equal(sum, g.mac(domain, v[head:])) {
		return nil, errUnsigned
	}
	return v[head:], nil
}

// ErrNoteUnreachable: Redis did not answer a note's compare-and-set.
var ErrNoteUnreachable = errors.New("redisstore: the note's meeting place (Redis) did not answer")

// SwapNote implements breaker.Store. While Redis does not answer, a swap
// reports that, never a success on this replica's own table (R-DL7):
// another replica could claim the same note on its own table, and one
// decision would be recorded twice. The caller holding a real outcome
// records it on its own replica; nothing waits past the op timeout.
func (s *Store) SwapNote(ctx context.Context, name string, prev, next []byte, ttl time.Duration) ([]byte, bool, error) {
	if len(next) > breaker.MaxNoteBytes {
		return nil, false, errors.New("redisstore: note too large")
	}
	if s.sync.localIsTheStore() {
		return nil, false, ErrNoteUnreachable
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	a := args{{"ttl_ms", ttl.Milliseconds()}}
	if prev != nil {
		a = append(a, arg{"prev", s.sign.sealNote(name, prev)})
	}
	if next != nil {
		a = append(a, arg{"next", s.sign.sealNote(name, next)})
	}
	vals, err := swapNote.Run(ctx, s.rdb, []string{s.prefix + "note:" + name}, string(msgpackMap(a))).Slice()
	if err != nil {
		s.count("note")
		return nil, false, fmt.Errorf("%w: %v", ErrNoteUnreachable, err)
	}
	if len(vals) == 0 {
		return nil, false, fmt.Errorf("redisstore: note reply of %d values", len(vals))
	}
	if ok, _ := vals[0].(int64); ok == 1 {
		return nil, true, nil
	}
	if len(vals) < 2 {
		return nil, false, nil
	}
	raw, _ := vals[1].(string)
	cur, err := s.sign.openNote(name, []byte(raw))
	if err != nil {
		s.refused("note_unsigned", "[store] a failover note in Redis without a valid signature was ignored (store.redis.hmac_key_file is set): something other than a fusebox replica of this fleet wrote it")
		return nil, false, err
	}
	return cur, false, nil
}
