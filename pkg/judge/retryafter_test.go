package judge

import (
	"testing"
	"time"
)

func TestRetryAfterDeadline(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name        string
		ra, ms, xms string
		want        time.Duration // 0 = none
	}{
		{"seconds", "30", "", "", 30 * time.Second},
		{"seconds with spaces", " 7 ", "", "", 7 * time.Second},
		{"fraction seconds", "1.5", "", "", 1500 * time.Millisecond},
		{"http date", "Sun, 29 Nov 2026 12:01:00 GMT", "", "", time.Minute},
		{"rfc850 date", "Sunday, 29-Nov-26 12:00:10 GMT", "", "", 10 * time.Second},
		{"asctime date", "Sun Nov 29 12:00:05 2026", "", "", 5 * time.Second},
		{"date in the past", "Sun, 29 Nov 2026 11:00:00 GMT", "", "", 0},
		{"zero", "0", "", "", 0},
		{"negative", "-5", "", "", 0},
		{"garbage", "soon", "", "", 0},
		{"retry-after-ms", "", "250", "", 250 * time.Millisecond},
		{"retry-after-ms fraction", "", "12.5", "", 12500 * time.Microsecond},
		{"x-ms-retry-after-ms", "", "", "1000", time.Second},
		{"ms wins over seconds", "30", "500", "", 500 * time.Millisecond},
		{"bad ms falls back", "3", "x", "", 3 * time.Second},
		{"huge is capped", "99999999999999999999", "", "", maxRetryAfter},
		{"huge ms capped", "", "1e300", "", maxRetryAfter},
		{"NaN", "", "NaN", "", 0},
		{"none", "", "", "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := RetryAfterDeadline(now, tc.ra, tc.ms, tc.xms)
			var want int64
			if tc.want > 0 {
				want = now.Add(tc.want).UnixNano()
			}
			if got != want {
				t.Fatalf("got %v, want %v", time.Duration(got-now.UnixNano()), tc.want)
			}
		})
	}
}

func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"30", "Sun, 29 Nov 2026 12:01:00 GMT", "1.5", "-1", "", "1e9", "NaN", "Inf"} {
		f.Add(s, s)
	}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ra, ms string) {
		d := RetryAfterDeadline(now, ra, ms, "")
		if d == 0 {
			return
		}
		if d <= now.UnixNano() || d > now.Add(maxRetryAfter).UnixNano() {
			t.Fatalf("deadline out of range: %v for %q %q", time.Duration(d-now.UnixNano()), ra, ms)
		}
	})
}
