package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
)

// Line is one request as the access log line holds it.
type Line struct {
	At         int64 // start, unix ns
	DurationMs int64
	TTFBMs     int64
	Code       int
	Flags      string
	Details    string
	Cluster    string
	// Attempts is Envoy's upstream_request_attempt_count (0: none set).
	Attempts uint32
	Gateway  string
	Route    string // the route fusebox chose (x-fusebox-route), if any
	Model    string
	Decision string
	Action   string
	Outcome  string // class fusebox recorded: success, failure, neither
	Reason   string
	// Tokens is what the provider reported (0 when it did not).
	Tokens int64
	// Replica is the fusebox replica that decided the request (R-FD5: a
	// quorum of replicas for local failures); FP its keyed fingerprint and
	// Again whether it was sent again (request faults, R-FD4). Empty when
	// the line has none (an older fusebox): one replica, no fingerprint.
	Replica string
	FP      string
	Again   bool
	// RateLimit is the quota the provider announced on the response (the
	// shipped format's ratelimit_requests, ratelimit_requests_reset,
	// ratelimit_tokens, ratelimit_tokens_reset; "" when absent), which
	// replay's headroom evaluation reads (R-H5).
	RateLimit [4]string
}

// maxLineBytes bounds one line: Envoy's lines are far smaller (a few
// hundred bytes; a long path or many headers in a custom format reach tens
// of KiB); a line past it is skipped, and the file read on.
const maxLineBytes = 1 << 20

var errLine = errors.New("not an access log line")

// LineError says why a line is not an access log line.
type LineError struct{ Why string }

func (e *LineError) Error() string { return "not an access log line: " + e.Why }

// Is makes every LineError an errLine.
func (e *LineError) Is(target error) bool { return target == errLine }

func notALine(why string) error { return &LineError{Why: why} }

// rawLine is a line's fields as encoding/json reads them (the reference
// fastLine is held to).
type rawLine struct {
	StartTime  json.RawMessage `json:"start_time"`
	DurationMs json.RawMessage `json:"duration_ms"`
	TTFBMs     json.RawMessage `json:"ttfb_ms"`
	Code       json.RawMessage `json:"code"`
	Attempts   json.RawMessage `json:"attempts"`
	Flags      string          `json:"flags"`
	Details    string          `json:"details"`
	Cluster    string          `json:"cluster"`
	Gateway    string          `json:"gateway"`
	Route      string          `json:"route"`
	Fusebox    json.RawMessage `json:"fusebox"`
	RLReq      json.RawMessage `json:"ratelimit_requests"`
	RLReqReset json.RawMessage `json:"ratelimit_requests_reset"`
	RLTok      json.RawMessage `json:"ratelimit_tokens"`
	RLTokReset json.RawMessage `json:"ratelimit_tokens_reset"`
}

// rawFusebox is the fusebox metadata object of a line.
type rawFusebox struct {
	Model    string  `json:"model"`
	Decision string  `json:"decision"`
	Action   string  `json:"action"`
	Outcome  string  `json:"outcome"`
	Reason   string  `json:"reason"`
	In       float64 `json:"tokens_in"`
	Out      float64 `json:"tokens_out"`
	Gateway  string  `json:"gateway"`
	Route    string  `json:"route"`
	Replica  string  `json:"replica"`
	FP       string  `json:"fp"`
	Again    bool    `json:"again"`
}

// ParseLine reads one JSON access log line (the shipped json_format, or
// record-log's). Missing fields are zero: lines of another Envoy's format
// are read where the fields exist. Envoy writes "-" for an absent value.
func ParseLine(b []byte) (Line, error) {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0:
		return Line{}, notALine("empty")
	case len(b) > maxLineBytes:
		return Line{}, notALine("longer than 1 MiB")
	case b[0] != '{':
		return Line{}, notALine("not a JSON object (the access log's json_format writes one per line)")
	}
	raw, fb, fast := fastLine(b)
	if !fast {
		raw = rawLine{}
		if err := json.Unmarshal(b, &raw); err != nil {
			return Line{}, notALine("not JSON, or a field of the wrong type")
		}
	}
	at, ok := seconds(raw.StartTime)
	if !ok {
		return Line{}, notALine("no start_time in unix seconds")
	}
	l := Line{At: at, DurationMs: whole(raw.DurationMs), TTFBMs: whole(raw.TTFBMs), Code: int(whole(raw.Code)),
		Flags: dash(raw.Flags), Details: dash(raw.Details), Cluster: dash(raw.Cluster), Gateway: dash(raw.Gateway), Route: dash(raw.Route),
		Attempts: uint32(min(whole(raw.Attempts), 1<<31))}
	for i, v := range [4]json.RawMessage{raw.RLReq, raw.RLReqReset, raw.RLTok, raw.RLTokReset} {
		// A string or a number (a custom format); null and "-" are none.
		if len(v) > 0 && len(v) <= 64 && string(v) != "null" {
			l.RateLimit[i] = dash(strings.Trim(string(v), `"`))
		}
	}
	if len(raw.Fusebox) > 0 && raw.Fusebox[0] == '{' {
		ok := fast // read with the line
		if !ok {
			fb, ok = fastFusebox(raw.Fusebox)
		}
		if !ok {
			fb = rawFusebox{}
			ok = json.Unmarshal(raw.Fusebox, &fb) == nil
		}
		if ok {
			l.Model, l.Decision, l.Action, l.Outcome, l.Reason = fb.Model, fb.Decision, fb.Action, fb.Outcome, fb.Reason
			l.Replica, l.FP, l.Again = fb.Replica, fb.FP, fb.Again
			// A format without the header fields still names them in
			// fusebox's metadata.
			if l.Gateway == "" {
				l.Gateway = fb.Gateway
			}
			if l.Route == "" {
				l.Route = fb.Route
			}
			if fb.In >= 0 && fb.Out >= 0 && fb.In+fb.Out < 1e12 {
				l.Tokens = int64(fb.In + fb.Out)
			}
		}
	}
	return l, nil
}

func dash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

// seconds reads "1764590400.123" (a string or a number) as unix ns.
func seconds(raw json.RawMessage) (int64, bool) {
	s := strings.Trim(string(raw), `"`)
	if s == "" || s == "-" {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f > 9e9 { // 9e9 s (year 2255) × 1e9 still fits an int64
		return 0, false
	}
	return int64(f * 1e9), true
}

// whole reads a number or a numeric string; anything else is 0.
func whole(raw json.RawMessage) int64 {
	s := strings.Trim(string(raw), `"`)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v > 1e15 {
		return 0
	}
	return int64(v)
}
