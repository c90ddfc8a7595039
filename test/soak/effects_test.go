package main

import "testing"

// Over two cycles of the schedule every step faults each primary
// provider once, whatever the schedule's length: the memory soak's 8
// steps, the Redis soak's 9, the fleet's 12. With (i + cycle) the Redis
// soak's odd length began every cycle on the first provider, so its
// refused, slow-first-token and 503 faults never met the second.
func TestEveryFaultMeetsBothProviders(t *testing.T) {
	for _, steps := range []int{8, 9, 12} {
		met := map[[2]int]int{}
		for i := 0; i < 2*steps; i++ {
			met[[2]int{i % steps, faultTarget(i, steps)}]++
		}
		for s := 0; s < steps; s++ {
			for p := range primaryProviders {
				if met[[2]int{s, p}] != 1 {
					t.Errorf("%d steps: step %d met %s %d times in two cycles, want 1", steps, s, primaryProviders[p], met[[2]int{s, p}])
				}
			}
		}
	}
}

// A provider fault the load's end cut short before any request met it is
// listed as cut short and neither injected nor judged; one that bit
// counts either way; one whose whole window passed unmet is a fault that
// never took effect.
func TestTallyJudgesOnlyWholeWindows(t *testing.T) {
	for _, tc := range []struct {
		name          string
		ok, cut       bool
		injected, eff int
		noEffect, cs  int
	}{
		{"bit", true, false, 1, 1, 0, 0},
		{"bit, then cut", true, true, 1, 1, 0, 0},
		{"never bit in its window", false, false, 1, 0, 1, 0},
		{"cut before a request met it", false, true, 0, 0, 0, 1},
	} {
		rep := &Report{Faults: map[string]int{}, FaultEffects: map[string]int{}}
		rep.tally("slow_first_token", "openai_us", tc.ok, tc.cut, "the provider answered no slow_first_token")
		if rep.Faults["slow_first_token"] != tc.injected || rep.FaultEffects["slow_first_token"] != tc.eff || len(rep.NoEffect) != tc.noEffect || len(rep.CutShort) != tc.cs {
			t.Errorf("%s: injected %d, took effect %d, no effect %v, cut short %v; want %d, %d, %d, %d",
				tc.name, rep.Faults["slow_first_token"], rep.FaultEffects["slow_first_token"], rep.NoEffect, rep.CutShort, tc.injected, tc.eff, tc.noEffect, tc.cs)
		}
	}
}
