package judge

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxRetryAfter bounds what a header can say before the policy's cap
// applies, so arithmetic never overflows.
const maxRetryAfter = 365 * 24 * time.Hour

// RetryAfterDeadline reads the provider's back-off hints (R-A1) and returns
// the deadline they give, as unix ns, or 0 when none is usable:
//   - retry-after-ms and x-ms-retry-after-ms: milliseconds (fractions allowed);
//   - Retry-After: delay-seconds or an HTTP date.
//
// The millisecond forms are more precise and win when present.
func RetryAfterDeadline(now time.Time, retryAfter, retryAfterMs, xmsRetryAfterMs string) int64 {
	for _, v := range []string{retryAfterMs, xmsRetryAfterMs} {
		if d, ok := parseMillis(v); ok {
			return now.Add(d).UnixNano()
		}
	}
	if d, ok := parseRetryAfter(now, retryAfter); ok {
		return now.Add(d).UnixNano()
	}
	return 0
}

func parseMillis(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f <= 0 {
		return 0, false
	}
	d := time.Duration(math.Min(f, float64(maxRetryAfter/time.Millisecond)) * float64(time.Millisecond))
	return d, d > 0
}

// parseRetryAfter parses RFC 9110 Retry-After: a non-negative integer of
// seconds, or an HTTP date. A date in the past or a zero delay gives no
// block.
func parseRetryAfter(now time.Time, v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			// Some providers send fractions ("1.5"); accept them.
			f, ferr := strconv.ParseFloat(v, 64)
			if ferr != nil || math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
				return 0, false
			}
			d := time.Duration(math.Min(f, maxRetryAfter.Seconds()) * float64(time.Second))
			return d, d > 0
		}
		if n == 0 {
			return 0, false
		}
		if n > uint64(maxRetryAfter/time.Second) {
			return maxRetryAfter, true
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now)
	if d <= 0 {
		return 0, false
	}
	if d > maxRetryAfter {
		d = maxRetryAfter
	}
	return d, true
}
