package lifecycle

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
)

// The hand-offs between a decision's streams (R-DL4): the attempt token
// the route role gives the attempt role (x-fusebox-attempt), and the
// observe note it gives the observer (metadata). Both travel sealed
// (seal.go) and are read strictly; FuzzAttemptToken and FuzzObserveNote
// (processor) hold the readers.

// MaxTokenBytes bounds what the attempt role decodes: ten groups of route
// keys fit many times over.
const MaxTokenBytes = 8 << 10

// AttemptToken is the chain as the route role wrote it.
type AttemptToken struct {
	V int `json:"v"`
	// Decision is the route role's decision id: attempts of one request
	// are tied together by it, and the access log entry names it.
	Decision string         `json:"d,omitempty"`
	Gateway  string         `json:"g"`
	Model    string         `json:"m"` // the client's model name
	Path     string         `json:"p"` // the client's :path
	Chain    []AttemptGroup `json:"c"`
	// FP is the request's fingerprint (hex; R-FD4) and Retried whether
	// the client said it is a retry: the attempts judge request faults
	// with them. The token is sealed: neither reaches a provider.
	FP      string `json:"f,omitempty"`
	Retried bool   `json:"rt,omitempty"`
}

// AttemptGroup is one route of the chain with the admission the route role
// took for it: generations, and the probe slot of the first group.
type AttemptGroup struct {
	Route      string `json:"r"`
	RouteGen   uint64 `json:"rg"`
	RouteLease uint64 `json:"rl,omitempty"`
	FleetGen   uint64 `json:"fg,omitempty"`
	FleetLease uint64 `json:"fl,omitempty"`
}

// Payload is the token's plaintext (sealed by Sealer, seal.go).
func (t *AttemptToken) Payload() []byte {
	b, _ := json.Marshal(t) // plain strings and numbers always marshal
	return b
}

// ErrToken is any token this fleet did not seal.
var ErrToken = errors.New("not a fusebox attempt token")

// ParseAttemptPayload reads an opened token strictly.
func ParseAttemptPayload(b []byte) (AttemptToken, error) {
	var t AttemptToken
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil || dec.More() {
		return t, ErrToken
	}
	if t.V != 1 || len(t.Chain) == 0 || len(t.Chain) > 10 || t.Gateway == "" {
		return AttemptToken{}, ErrToken
	}
	for _, g := range t.Chain {
		if g.Route == "" {
			return AttemptToken{}, ErrToken
		}
	}
	return t, nil
}

// Group returns the chain group of attempt n (1-based): Envoy's
// priority_group specifier picks min(n-1, groups-1).
func (t *AttemptToken) Group(n int) int {
	return min(max(n, 1)-1, len(t.Chain)-1)
}

// ObserveAAD binds a sealed observe note to its use (never an attempt
// token's).
var ObserveAAD = []byte("fusebox observe note v2")

// ObserveNote is the one field the observer is forwarded. Envoy sends the
// forwarding namespaces' metadata on every observed message (every chunk
// of a stream), and decoding it is most of an observed message's cost, so
// the observer forwards this namespace alone: one string, the decision id
// included (not the fusebox namespace's many fields).
type ObserveNote struct {
	Decision string
	Parked   Park
	// ReqNs is the request phase as the route role measured it (its own
	// clock), and Replica the process that measured it: the observer
	// times from its own first message plus ReqNs unless it is that
	// process (R-DL6: one clock per measurement).
	ReqNs   int64
	Replica uint64
}

// The note's encoding: its fields in order, each a decimal length, a
// colon, the bytes (no escaping, any byte allowed in a name); version
// first. A tenth of JSON's cost on both sides (pprof under bench-wire).
const ObserveNoteVersion = "o2"

// Encode returns the note's encoding.
func (n ObserveNote) Encode() string { return string(n.AppendTo(make([]byte, 0, 192))) }

// AppendTo appends the note's encoding to b.
func (n ObserveNote) AppendTo(b []byte) []byte {
	p := n.Parked
	for _, f := range []string{ObserveNoteVersion, n.Decision, p.Gateway, p.Route, p.Cluster} {
		b = strconv.AppendInt(b, int64(len(f)), 10)
		b = append(b, ':')
		b = append(b, f...)
	}
	for _, v := range []uint64{p.RouteGen, p.RouteLease, p.FleetGen, p.FleetLease, uint64(p.Start), uint64(n.ReqNs), n.Replica} {
		b = append(b, ' ')
		b = strconv.AppendUint(b, v, 10)
	}
	return b
}

// ParseObserveNote reads an encoded note strictly; ok is false for
// anything else.
func ParseObserveNote(s string) (n ObserveNote, ok bool) {
	var strs [5]string
	var nums [7]uint64
	s, ok = lengthPrefixed(s, strs[:])
	if !ok {
		return n, false
	}
	s, ok = spacedUints(s, nums[:])
	if !ok || s != "" || strs[0] != ObserveNoteVersion || nums[4] > math.MaxInt64 || nums[5] > math.MaxInt64 {
		return n, false
	}
	n.Decision = strs[1]
	n.Parked = Park{Gateway: strs[2], Route: strs[3], Cluster: strs[4], RouteGen: nums[0], RouteLease: nums[1],
		FleetGen: nums[2], FleetLease: nums[3], Start: int64(nums[4])}
	n.ReqNs, n.Replica = int64(nums[5]), nums[6]
	return n, true
}

// lengthPrefixed reads len(strs) strings, each "<len>:<bytes>" with a
// length of at most four digits, and returns the rest of s.
func lengthPrefixed(s string, strs []string) (string, bool) {
	for i := range strs {
		c := strings.IndexByte(s, ':')
		if c <= 0 || c > 4 {
			return s, false
		}
		l, err := strconv.Atoi(s[:c])
		if err != nil || l < 0 || l > len(s)-c-1 {
			return s, false
		}
		strs[i], s = s[c+1:c+1+l], s[c+1+l:]
	}
	return s, true
}

// spacedUints reads len(nums) decimal numbers, each after one space, and
// returns the rest of s.
func spacedUints(s string, nums []uint64) (string, bool) {
	for i := range nums {
		if len(s) == 0 || s[0] != ' ' {
			return s, false
		}
		s = s[1:]
		e := strings.IndexByte(s, ' ')
		if e < 0 {
			e = len(s)
		}
		v, err := strconv.ParseUint(s[:e], 10, 64)
		if err != nil {
			return s, false
		}
		nums[i], s = v, s[e:]
	}
	return s, true
}
