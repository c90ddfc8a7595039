package breaker

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
)

// Mode says how much a breaker is allowed to do (SPEC R-M1..R-M3).
type Mode string

const (
	ModeOff    Mode = "off"
	ModeShadow Mode = "shadow"
	ModeProd   Mode = "prod"
)

// Window kinds of the failure-count trigger (R-W1, R-W2).
const (
	WindowTumbling = "tumbling"
	WindowSliding  = "sliding"
)

// Retry-After handling (R-A1).
const (
	RetryAfterBlock  = "block"
	RetryAfterIgnore = "ignore"
)

// What to do when every candidate is unhealthy (R-F3).
const (
	WhenAllOpenTryAll   = "try_all"
	WhenAllOpenFailFast = "fail_fast"
)

// DefaultFailureStatusCodes is the failure list a policy gets when none is
// set, and the fail-closed fallback of R-P2.
var DefaultFailureStatusCodes = []int{500, 502, 503, 504}

// Policy is a fully resolved circuit_breaker object: every field has a value.
// Field names and JSON names follow SPEC §3 exactly; the JSON form is also the
// canonical form hashed into Version (R-P4). A Policy is immutable once
// Finish has been called; breakers share it by pointer.
type Policy struct {
	Enabled             bool    `json:"enabled"`
	FailureThreshold    int     `json:"failure_threshold"`
	WindowSec           int     `json:"window_sec"`
	CooldownMs          int64   `json:"cooldown_ms"`
	FailureStatusCodes  []int   `json:"failure_status_codes"`
	Mode                Mode    `json:"mode"`
	Window              string  `json:"window"`
	ConsecutiveFailures int     `json:"consecutive_failures"`
	FailureRatePercent  float64 `json:"failure_rate_percent"`
	RateWindowSec       int     `json:"rate_window_sec"`
	MinimumRequests     int     `json:"minimum_requests"`
	SlowCallMs          int64   `json:"slow_call_ms"`
	SlowCallRatePercent float64 `json:"slow_call_rate_percent"`
	StallMs             int64   `json:"stall_ms"`
	BaselineMultiplier  float64 `json:"slow_call_baseline_multiplier"`
	HalfOpenMaxProbes   int     `json:"half_open_max_probes"`
	ProbeTimeoutMs      int64   `json:"probe_timeout_ms"`
	BackoffMultiplier   float64 `json:"backoff_multiplier"`
	MaxCooldownMs       int64   `json:"max_cooldown_ms"`
	OpenOnStatusCodes   []int   `json:"open_on_status_codes"`
	RetryAfter          string  `json:"retry_after"`
	MaxRetryAfterSec    int     `json:"max_retry_after_sec"`
	MaxEjectionPercent  int     `json:"max_ejection_percent"`
	WhenAllOpen         string  `json:"when_all_open"`
	// FailFastClientRetry lets clients' SDKs retry a fail_fast answer after
	// its retry-after (no x-should-retry: false, R-F3).
	FailFastClientRetry bool `json:"fail_fast_client_retry"`
	// RecoveryRampSec and RecoveryRampStartPercent: after half_open→closed
	// the route earns its traffic back over this time, from this share
	// (R-D8); 0 = off.
	RecoveryRampSec          int     `json:"recovery_ramp_sec"`
	RecoveryRampStartPercent float64 `json:"recovery_ramp_start_percent"`
	// Headroom skips a route whose provider announces less quota left
	// than these floors, until the announced reset (R-H2); nil = off
	// (absent from the canonical JSON, so that a policy without it keeps
	// its version).
	Headroom *Headroom `json:"headroom,omitempty"`
	// LocalOriginQuorum is how many replicas sharing a store must each see
	// locally originated failures of a route in its window before those
	// failures count for every replica (R-FD2); below it they open the
	// seeing replica's own view only. 1 = everywhere at once.
	LocalOriginQuorum int `json:"local_origin_quorum"`
	// RequestFaultTTLSec is how long a request judged at fault (its
	// failures are its own, not the route's: R-FD4) is remembered by its
	// fingerprint; 0 = request faults are not judged.
	RequestFaultTTLSec int `json:"request_fault_ttl_sec"`

	// Version is the first 8 hex characters of the SHA-256 of the canonical
	// JSON above (R-P4). Set by Finish.
	Version string `json:"-"`

	failSet statusSet
	openSet statusSet
}

// Headroom is the headroom policy's floors: a route is saturated while its
// provider's last announced remaining requests (tokens) are below
// MinRequests (MinTokens). A floor of 0 is never crossed.
type Headroom struct {
	MinRequests int64 `json:"min_requests"`
	MinTokens   int64 `json:"min_tokens"`
}

// DefaultPolicy returns the SPEC §3 defaults.
func DefaultPolicy() Policy {
	return Policy{
		Enabled:             false,
		FailureThreshold:    5,
		WindowSec:           60,
		CooldownMs:          30000,
		FailureStatusCodes:  slices.Clone(DefaultFailureStatusCodes),
		Mode:                ModeProd,
		Window:              WindowTumbling,
		ConsecutiveFailures: 0,
		FailureRatePercent:  0,
		RateWindowSec:       30,
		MinimumRequests:     5,
		SlowCallMs:          0,
		SlowCallRatePercent: 50,
		StallMs:             0,
		BaselineMultiplier:  0,
		HalfOpenMaxProbes:   1,
		ProbeTimeoutMs:      120000,
		BackoffMultiplier:   1,
		MaxCooldownMs:       300000,
		OpenOnStatusCodes:   []int{},
		RetryAfter:          RetryAfterBlock,
		MaxRetryAfterSec:    300,
		MaxEjectionPercent:  100,
		WhenAllOpen:         WhenAllOpenTryAll,

		RecoveryRampStartPercent: 10,
		LocalOriginQuorum:        2,
		RequestFaultTTLSec:       600,
	}
}

// Finish normalises the status lists (sorted, deduplicated), builds the
// lookup sets and computes Version. Call it once, after every field is set.
func (p *Policy) Finish() *Policy {
	p.FailureStatusCodes = normaliseCodes(p.FailureStatusCodes)
	p.OpenOnStatusCodes = normaliseCodes(p.OpenOnStatusCodes)
	p.failSet = makeStatusSet(p.FailureStatusCodes)
	p.openSet = makeStatusSet(p.OpenOnStatusCodes)
	b, err := json.Marshal(p)
	if err != nil { // cannot happen: every field is a plain value
		panic(err)
	}
	sum := sha256.Sum256(b)
	p.Version = hex.EncodeToString(sum[:4])
	return p
}

// TracksSlow reports whether any slow-call signal is on (R-T4..R-T6).
func (p *Policy) TracksSlow() bool {
	return p.SlowCallMs > 0 || p.StallMs > 0 || p.BaselineMultiplier > 0
}

// Active reports whether the breaker is consulted at all (R-M1).
func (p *Policy) Active() bool { return p != nil && p.Enabled && p.Mode != ModeOff }

// IsFailureStatus reports whether status is in failure_status_codes.
func (p *Policy) IsFailureStatus(status int) bool { return p.failSet.has(status) }

// IsOpenStatus reports whether status is in open_on_status_codes (R-T3).
func (p *Policy) IsOpenStatus(status int) bool { return p.openSet.has(status) }

func normaliseCodes(c []int) []int {
	out := slices.Clone(c)
	if out == nil {
		out = []int{}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// statusSet is a bitmap of HTTP statuses 0..599: a lookup on the hot path
// without a map.
type statusSet [10]uint64

func makeStatusSet(codes []int) statusSet {
	var s statusSet
	for _, c := range codes {
		if c >= 0 && c < 640 {
			s[c/64] |= 1 << (uint(c) % 64)
		}
	}
	return s
}

func (s *statusSet) has(c int) bool {
	if c < 0 || c >= 640 {
		return false
	}
	return s[c/64]&(1<<(uint(c)%64)) != 0
}
