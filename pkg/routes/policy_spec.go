package routes

import (
	"fmt"
	"slices"
	"sort"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"go.yaml.in/yaml/v3"
)

// PolicySpec is one level of a `circuit_breaker` object as written: every
// field is optional (nil = not set at this level, so the level above
// applies). It decodes itself from YAML or JSON strictly, field by field, so
// that every error can name the field (R-P1); decoding never stops at the
// first bad field.
type PolicySpec struct {
	Enabled             *bool
	FailureThreshold    *int64
	WindowSec           *int64
	CooldownMs          *int64
	FailureStatusCodes  []int // nil = unset
	Mode                *string
	Window              *string
	ConsecutiveFailures *int64
	FailureRatePercent  *float64
	RateWindowSec       *int64
	MinimumRequests     *int64
	SlowCallMs          *int64
	SlowCallRatePercent *float64
	StallMs             *int64
	BaselineMultiplier  *float64
	RecoveryRampSec     *int64
	RecoveryRampStart   *float64
	LocalOriginQuorum   *int64
	RequestFaultTTLSec  *int64
	HalfOpenMaxProbes   *int64
	ProbeTimeoutMs      *int64
	BackoffMultiplier   *float64
	MaxCooldownMs       *int64
	OpenOnStatusCodes   []int // nil = unset
	RetryAfter          *string
	MaxRetryAfterSec    *int64
	MaxEjectionPercent  *int64
	WhenAllOpen         *string
	FailFastClientRetry *bool
	// Headroom is set (non-nil) when the level writes `headroom`; a
	// HeadroomOff value is `headroom: null`, which turns it off below an
	// inherited one.
	Headroom *breaker.Headroom
	Policy   string

	// errs are the field errors found while decoding; validation reports
	// them with the gateway/model/route they belong to.
	errs []fieldError
	// codeErrs holds malformed status lists separately so that a lenient
	// load of stored config can fall back to the default (R-P2).
	codeErrs []fieldError
	line     int
	silent   bool
	// lenient: decoded from stored config written by someone else; a
	// malformed status list falls back to the default (R-P2) instead of
	// failing the load.
	lenient bool
}

type fieldError struct {
	field string
	line  int
	msg   string
}

func (e fieldError) String() string {
	if e.line > 0 {
		return fmt.Sprintf("circuit_breaker.%s: %s (line %d)", e.field, e.msg, e.line)
	}
	return fmt.Sprintf("circuit_breaker.%s: %s", e.field, e.msg)
}

// fieldKind is how one policy field is read and range-checked.
type policyField struct {
	name string
	set  func(s *PolicySpec, n *yaml.Node) error
}

func intField(name string, min, max int64, dst func(*PolicySpec) **int64) policyField {
	return policyField{name, func(s *PolicySpec, n *yaml.Node) error {
		v, err := wholeNumber(n)
		if err != nil {
			return err
		}
		if v < min || v > max {
			return rangeErr(min, max, v)
		}
		*dst(s) = &v
		return nil
	}}
}

func rangeErr(min, max, v int64) error {
	if max == maxWhole {
		return fmt.Errorf("must be a whole number ≥%d, got %d", min, v)
	}
	return fmt.Errorf("must be a whole number in %d..%d, got %d", min, max, v)
}

func floatField(name string, min, max float64, dst func(*PolicySpec) **float64) policyField {
	return policyField{name, func(s *PolicySpec, n *yaml.Node) error {
		v, err := number(n)
		if err != nil {
			return err
		}
		if v < min || v > max {
			if max > 1e300 {
				return fmt.Errorf("must be a number ≥%g, got %g", min, v)
			}
			return fmt.Errorf("must be a number in %g..%g, got %g", min, max, v)
		}
		*dst(s) = &v
		return nil
	}}
}

func enumField(name string, allowed []string, dst func(*PolicySpec) **string) policyField {
	return policyField{name, func(s *PolicySpec, n *yaml.Node) error {
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			return fmt.Errorf("must be one of %v, got %s", allowed, nodeKind(n))
		}
		if !slices.Contains(allowed, n.Value) {
			return fmt.Errorf("must be one of %v, got %q", allowed, n.Value)
		}
		v := n.Value
		*dst(s) = &v
		return nil
	}}
}

func codesField(name string, dst func(*PolicySpec) *[]int) policyField {
	return policyField{name, func(s *PolicySpec, n *yaml.Node) error {
		codes, set, err := ParseStatusCodes(n)
		if err != nil {
			return errStatusList{err}
		}
		if set {
			*dst(s) = codes
		}
		return nil
	}}
}

// errStatusList marks a malformed status list (R-P2 treats it specially).
type errStatusList struct{ error }

const maxWhole = int64(1) << 53

var policyFields = func() map[string]policyField {
	fs := []policyField{
		boolField("enabled", func(s *PolicySpec) **bool { return &s.Enabled }),
		boolField("fail_fast_client_retry", func(s *PolicySpec) **bool { return &s.FailFastClientRetry }),
		intField("failure_threshold", 1, 1000000, func(s *PolicySpec) **int64 { return &s.FailureThreshold }),
		intField("window_sec", 1, 86400, func(s *PolicySpec) **int64 { return &s.WindowSec }),
		intField("cooldown_ms", 1, 86400000, func(s *PolicySpec) **int64 { return &s.CooldownMs }),
		codesField("failure_status_codes", func(s *PolicySpec) *[]int { return &s.FailureStatusCodes }),
		enumField("mode", []string{"off", "shadow", "prod"}, func(s *PolicySpec) **string { return &s.Mode }),
		enumField("window", []string{breaker.WindowTumbling, breaker.WindowSliding}, func(s *PolicySpec) **string { return &s.Window }),
		intField("consecutive_failures", 0, 1000000, func(s *PolicySpec) **int64 { return &s.ConsecutiveFailures }),
		floatField("failure_rate_percent", 0, 100, func(s *PolicySpec) **float64 { return &s.FailureRatePercent }),
		intField("rate_window_sec", 1, 3600, func(s *PolicySpec) **int64 { return &s.RateWindowSec }),
		intField("minimum_requests", 1, 1000000, func(s *PolicySpec) **int64 { return &s.MinimumRequests }),
		intField("slow_call_ms", 0, 3600000, func(s *PolicySpec) **int64 { return &s.SlowCallMs }),
		floatField("slow_call_rate_percent", 0, 100, func(s *PolicySpec) **float64 { return &s.SlowCallRatePercent }),
		intField("stall_ms", 0, 3600000, func(s *PolicySpec) **int64 { return &s.StallMs }),
		floatField("slow_call_baseline_multiplier", 0, 100, func(s *PolicySpec) **float64 { return &s.BaselineMultiplier }),
		intField("half_open_max_probes", 0, 10000, func(s *PolicySpec) **int64 { return &s.HalfOpenMaxProbes }),
		intField("probe_timeout_ms", 1, 3600000, func(s *PolicySpec) **int64 { return &s.ProbeTimeoutMs }),
		floatField("backoff_multiplier", 1, 100, func(s *PolicySpec) **float64 { return &s.BackoffMultiplier }),
		intField("max_cooldown_ms", 1, 86400000, func(s *PolicySpec) **int64 { return &s.MaxCooldownMs }),
		codesField("open_on_status_codes", func(s *PolicySpec) *[]int { return &s.OpenOnStatusCodes }),
		enumField("retry_after", []string{breaker.RetryAfterBlock, breaker.RetryAfterIgnore}, func(s *PolicySpec) **string { return &s.RetryAfter }),
		intField("max_retry_after_sec", 1, 86400, func(s *PolicySpec) **int64 { return &s.MaxRetryAfterSec }),
		intField("max_ejection_percent", 0, 100, func(s *PolicySpec) **int64 { return &s.MaxEjectionPercent }),
		enumField("when_all_open", []string{breaker.WhenAllOpenTryAll, breaker.WhenAllOpenFailFast}, func(s *PolicySpec) **string { return &s.WhenAllOpen }),
		intField("recovery_ramp_sec", 0, 3600, func(s *PolicySpec) **int64 { return &s.RecoveryRampSec }),
		floatField("recovery_ramp_start_percent", 1, 100, func(s *PolicySpec) **float64 { return &s.RecoveryRampStart }),
		intField("local_origin_quorum", 1, 1000, func(s *PolicySpec) **int64 { return &s.LocalOriginQuorum }),
		intField("request_fault_ttl_sec", 0, 86400, func(s *PolicySpec) **int64 { return &s.RequestFaultTTLSec }),
		{"headroom", decodeHeadroom},
		{"policy", func(s *PolicySpec, n *yaml.Node) error {
			if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
				return fmt.Errorf("must be a policy name, got %s", nodeKind(n))
			}
			s.Policy = n.Value
			return nil
		}},
	}
	m := make(map[string]policyField, len(fs))
	for _, f := range fs {
		m[f.name] = f
	}
	return m
}()

// PolicyFieldNames lists every circuit_breaker field name, for messages.
func PolicyFieldNames() []string {
	names := make([]string, 0, len(policyFields))
	for k := range policyFields {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// UnmarshalYAML implements yaml.Unmarshaler. It never returns an error for a
// bad field: it records it, so that every error of a file is reported.
func (s *PolicySpec) UnmarshalYAML(n *yaml.Node) error {
	*s = PolicySpec{line: n.Line}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		s.errs = append(s.errs, fieldError{field: "", line: n.Line, msg: "must be an object, got " + nodeKind(n)})
		return nil
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := k.Value
		f, ok := policyFields[name]
		if !ok {
			s.errs = append(s.errs, fieldError{field: name, line: k.Line, msg: unknownField(name, "a circuit_breaker", policyFieldNames())})
			continue
		}
		if seen[name] {
			s.errs = append(s.errs, fieldError{field: name, line: k.Line, msg: "set twice"})
			continue
		}
		seen[name] = true
		if err := f.set(s, v); err != nil {
			fe := fieldError{field: name, line: v.Line, msg: err.Error()}
			if _, isCodes := err.(errStatusList); isCodes {
				s.codeErrs = append(s.codeErrs, fe)
			} else {
				s.errs = append(s.errs, fe)
			}
		}
	}
	return nil
}

// Errors returns every decode error of this level, status-list errors
// included, as text that starts with "circuit_breaker.<field>".
func (s *PolicySpec) Errors() []string {
	out := make([]string, 0, len(s.errs)+len(s.codeErrs))
	for _, e := range s.errs {
		out = append(out, e.String())
	}
	for _, e := range s.codeErrs {
		out = append(out, e.String())
	}
	return out
}

// applyTo overlays the fields set at this level onto p.
func (s *PolicySpec) applyTo(p *breaker.Policy) {
	if s.Enabled != nil {
		p.Enabled = *s.Enabled
	}
	setInt(&p.FailureThreshold, s.FailureThreshold)
	setInt(&p.WindowSec, s.WindowSec)
	setInt64(&p.CooldownMs, s.CooldownMs)
	if s.FailureStatusCodes != nil {
		p.FailureStatusCodes = slices.Clone(s.FailureStatusCodes)
	}
	if s.Mode != nil {
		p.Mode = breaker.Mode(*s.Mode)
	}
	if s.Window != nil {
		p.Window = *s.Window
	}
	setInt(&p.ConsecutiveFailures, s.ConsecutiveFailures)
	setFloat(&p.FailureRatePercent, s.FailureRatePercent)
	setInt(&p.RateWindowSec, s.RateWindowSec)
	setInt(&p.MinimumRequests, s.MinimumRequests)
	setInt64(&p.SlowCallMs, s.SlowCallMs)
	setFloat(&p.SlowCallRatePercent, s.SlowCallRatePercent)
	setInt64(&p.StallMs, s.StallMs)
	setFloat(&p.BaselineMultiplier, s.BaselineMultiplier)
	setInt(&p.HalfOpenMaxProbes, s.HalfOpenMaxProbes)
	setInt64(&p.ProbeTimeoutMs, s.ProbeTimeoutMs)
	setFloat(&p.BackoffMultiplier, s.BackoffMultiplier)
	setInt64(&p.MaxCooldownMs, s.MaxCooldownMs)
	if s.OpenOnStatusCodes != nil {
		p.OpenOnStatusCodes = slices.Clone(s.OpenOnStatusCodes)
	}
	if s.RetryAfter != nil {
		p.RetryAfter = *s.RetryAfter
	}
	setInt(&p.MaxRetryAfterSec, s.MaxRetryAfterSec)
	setInt(&p.MaxEjectionPercent, s.MaxEjectionPercent)
	if s.WhenAllOpen != nil {
		p.WhenAllOpen = *s.WhenAllOpen
	}
	if s.FailFastClientRetry != nil {
		p.FailFastClientRetry = *s.FailFastClientRetry
	}
	setInt(&p.RecoveryRampSec, s.RecoveryRampSec)
	setFloat(&p.RecoveryRampStartPercent, s.RecoveryRampStart)
	setInt(&p.LocalOriginQuorum, s.LocalOriginQuorum)
	setInt(&p.RequestFaultTTLSec, s.RequestFaultTTLSec)
	switch {
	case s.Headroom == headroomOff:
		p.Headroom = nil
	case s.Headroom != nil:
		h := *s.Headroom
		p.Headroom = &h
	}
}

// headroomOff is what `headroom: null` decodes to.
var headroomOff = &breaker.Headroom{MinRequests: -1, MinTokens: -1}

// decodeHeadroom reads `headroom: {min_requests: N, min_tokens: N}` (R-H2):
// whole numbers ≥0, either may be left out (no floor on that kind); null
// turns an inherited headroom off. The object is one value: a level that
// sets it replaces the one above whole.
func decodeHeadroom(s *PolicySpec, n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		s.Headroom = headroomOff
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("must be an object {min_requests, min_tokens} or null, got %s", nodeKind(n))
	}
	h := breaker.Headroom{}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		var dst *int64
		switch k.Value {
		case "min_requests":
			dst = &h.MinRequests
		case "min_tokens":
			dst = &h.MinTokens
		default:
			return fmt.Errorf("unknown field %q: headroom takes min_requests and min_tokens", k.Value)
		}
		if seen[k.Value] {
			return fmt.Errorf("%s set twice", k.Value)
		}
		seen[k.Value] = true
		x, err := wholeNumber(v)
		if err != nil {
			return fmt.Errorf("%s: %v", k.Value, err)
		}
		if x < 0 || x > 1e12 {
			return fmt.Errorf("%s: must be a whole number in 0..1000000000000, got %d", k.Value, x)
		}
		*dst = x
	}
	s.Headroom = &h
	return nil
}

// boolField decodes a true/false field.
func boolField(name string, at func(*PolicySpec) **bool) policyField {
	return policyField{name, func(s *PolicySpec, n *yaml.Node) error {
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			return fmt.Errorf("must be true or false, got %s", nodeKind(n))
		}
		var b bool
		if err := n.Decode(&b); err != nil {
			return err
		}
		*at(s) = &b
		return nil
	}}
}

func setInt(dst *int, v *int64) {
	if v != nil {
		*dst = int(*v)
	}
}

func setInt64(dst *int64, v *int64) {
	if v != nil {
		*dst = *v
	}
}

func setFloat(dst *float64, v *float64) {
	if v != nil {
		*dst = *v
	}
}

// policyFieldNames are the circuit_breaker fields, sorted.
func policyFieldNames() []string {
	out := make([]string, 0, len(policyFields))
	for n := range policyFields {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
