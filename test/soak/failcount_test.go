package main

import (
	"testing"
	"time"
)

// The failure-count check flags a drop within a generation and only
// that: a roll (Redis's counter end, or 20 s into the streak on the memory
// store), a close, an epoch change and a rise pass.
func TestFailureCountCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	cases := []struct {
		name    string
		samples []countSample
		drops   int
	}{
		{"a drop in one generation", []countSample{
			{at: at(0), closed: true, failures: 3, generation: 1},
			{at: at(time.Second), closed: true, failures: 1, generation: 1}}, 1},
		{"a rise", []countSample{
			{at: at(0), closed: true, failures: 1, generation: 1},
			{at: at(time.Second), closed: true, failures: 2, generation: 1}}, 0},
		{"a close", []countSample{
			{at: at(0), closed: true, failures: 2, generation: 1},
			{at: at(time.Second), closed: true, failures: 0, generation: 3}}, 0},
		{"an epoch change", []countSample{
			{at: at(0), closed: true, failures: 2, generation: 1},
			{at: at(time.Second), epoch: 1, closed: true, failures: 0, generation: 1}}, 0},
		{"Redis: the counter's end passed", []countSample{
			{at: at(0), closed: true, failures: 2, generation: 1, rolls: at(500 * time.Millisecond)},
			{at: at(time.Second), closed: true, failures: 0, generation: 1}}, 0},
		{"Redis: before the counter's end", []countSample{
			{at: at(0), closed: true, failures: 2, generation: 1, rolls: at(5 * time.Second)},
			{at: at(time.Second), closed: true, failures: 0, generation: 1}}, 1},
		{"memory: 20 s into the streak", []countSample{
			{at: at(0), closed: true, failures: 1, generation: 1},
			{at: at(19 * time.Second), closed: true, failures: 2, generation: 1},
			{at: at(20 * time.Second), closed: true, failures: 0, generation: 1}}, 0},
		{"memory: 10 s into the streak", []countSample{
			{at: at(0), closed: true, failures: 1, generation: 1},
			{at: at(9 * time.Second), closed: true, failures: 2, generation: 1},
			{at: at(10 * time.Second), closed: true, failures: 0, generation: 1}}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var fc failCounts
			for _, s := range tc.samples {
				fc.add("r", s)
			}
			if len(fc.drops) != tc.drops {
				t.Fatalf("drops %v, want %d", fc.drops, tc.drops)
			}
		})
	}
}
