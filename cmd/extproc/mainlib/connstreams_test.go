package mainlib

import "testing"

// #50: one connection never takes the whole stream budget: its limit is
// well below limits.max_concurrent_streams. Before, both were one number.
func TestConnStreams(t *testing.T) {
	for _, tc := range []struct {
		total int
		want  uint32
	}{
		{100000, 12500}, // the default: an eighth
		{1000, 125},
		{200, 64}, // at least 64
		{40, 40},  // never more than the whole bound
		{1, 1},
	} {
		if got := connStreams(tc.total); got != tc.want {
			t.Errorf("connStreams(%d) = %d, want %d", tc.total, got, tc.want)
		}
		if tc.total >= 512 && int(connStreams(tc.total)) > tc.total/4 {
			t.Errorf("connStreams(%d): one connection may take a quarter of the budget or more", tc.total)
		}
	}
}
