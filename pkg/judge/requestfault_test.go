package judge

import (
	"strings"
	"testing"
)

// TestFaultLedgerJudges holds the R-FD4 rule at its edges, as live and
// replay (R-FD5) both judge with it.
func TestFaultLedgerJudges(t *testing.T) {
	const ttl = int64(600e9)
	pass := func(string) bool { return true }
	fail := func(string) bool { return false }
	type call struct {
		sig, route string
		again      bool
		at         int64
		guard      func(string) bool
		fault      bool
		first      bool
	}
	cases := []struct {
		name  string
		calls []call
	}{
		{"a retry with the same answer is a fault, logged once", []call{
			{"500", "a", false, 0, pass, false, false},
			{"500", "a", true, 1, pass, true, true},
			{"500", "b", true, 2, pass, true, false}}},
		{"not sent again: not one request", []call{
			{"500", "a", false, 0, pass, false, false},
			{"500", "a", false, 1, pass, false, false}}},
		{"another answer", []call{
			{"500", "a", false, 0, pass, false, false},
			{"503", "a", true, 1, pass, false, false}}},
		{"the guard refuses", []call{
			{"500", "a", false, 0, pass, false, false},
			{"500", "a", true, 1, fail, false, false}}},
		{"a remembered fault needs no retry", []call{
			{"500", "a", false, 0, pass, false, false},
			{"500", "a", true, 1, pass, true, true},
			{"500", "a", false, 2, pass, true, false}}},
		{"expired: a first failure again", []call{
			{"500", "a", false, 0, pass, false, false},
			{"500", "a", true, ttl, pass, false, false}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := NewFaultLedger([]byte("k"))
			fp := l.Of("body", "gw", "m", []byte("poison"))
			for i, c := range tc.calls {
				fault, first := l.Judge(fp, c.sig, c.route, c.again, c.at, ttl, c.guard)
				if fault != c.fault || first != c.first {
					t.Fatalf("call %d: fault %v first %v, want %v %v", i, fault, first, c.fault, c.first)
				}
			}
		})
	}
}

// TestFingerprintLoggedForm: the access log's form reads back to the
// fingerprint replay keys its ledger by; nothing else reads.
func TestFingerprintLoggedForm(t *testing.T) {
	l := NewFaultLedger([]byte("k"))
	fp := l.Of("body", "gw", "m", []byte("x"))
	got, ok := ParseLogged(fp.Logged())
	if !ok || got.Logged() != fp.Logged() {
		t.Fatalf("%q read back as %q %v", fp.Logged(), got.Logged(), ok)
	}
	for _, bad := range []string{"", "zz", strings.Repeat("g", 16), fp.Logged() + "00"} {
		if _, ok := ParseLogged(bad); ok {
			t.Errorf("%q read as a fingerprint", bad)
		}
	}
	if l.Of("body", "gw", "m", []byte("x")) != fp || NewFaultLedger([]byte("other")).Of("body", "gw", "m", []byte("x")) == fp {
		t.Fatal("a fingerprint is its key's and its content's")
	}
}

// BenchmarkFingerprint is what a routed request pays for R-FD4: the keyed
// hash of its body (8 KiB, BenchmarkLifecycle's).
func BenchmarkFingerprint(b *testing.B) {
	l := NewFaultLedger([]byte("k"))
	body := []byte(strings.Repeat("x", 8<<10))
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		_ = l.Of("body", "default", "gpt", body)
	}
}
