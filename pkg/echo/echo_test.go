package echo

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	cases := []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "abc…"},
		{"ééé", 3, "é…"}, // never inside a character
		{"", 0, ""},
	}
	for _, c := range cases {
		if got := Clip(c.in, c.n); got != c.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
	long := strings.Repeat("ü", 1000)
	if got := Name(long); len(got) > MaxName+len("…") || !utf8.ValidString(got) {
		t.Fatalf("Name: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}
