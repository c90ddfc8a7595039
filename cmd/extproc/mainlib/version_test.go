package mainlib

import (
	"strings"
	"testing"
)

// `version` says what the binary was built from: the commit (and whether
// the tree had changes) and the build date, from the link-time values or
// the toolchain's VCS stamp; never only "dev".
func TestVersionNamesCommitAndDate(t *testing.T) {
	defer func(c, d string) { Commit, BuildDate = c, d }(Commit, BuildDate)
	cases := []struct {
		commit, date string
		want         []string
	}{
		{"0123456789abcdef0123456789abcdef01234567", "2026-12-01T12:00:00Z", []string{"(0123456789ab, built 2026-12-01T12:00:00Z)"}},
		{"0123456789abcdef0123456789abcdef01234567-dirty", "2026-12-01T12:00:00Z", []string{"0123456789ab-dirty"}},
	}
	for _, tc := range cases {
		Commit, BuildDate = tc.commit, tc.date
		got := versionString()
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%q: want %q in it", got, w)
			}
		}
	}
	Commit, BuildDate = "", ""
	if got := versionString(); !strings.Contains(got, "commit") && !strings.Contains(got, "(") {
		t.Errorf("without a stamp: %q names no commit at all", got)
	}
}
