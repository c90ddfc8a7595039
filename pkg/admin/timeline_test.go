package admin

import (
	"fmt"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The state bands walk back from the state now through the transitions,
// newest first, within the chart's 15 minutes.
func TestStateBands(t *testing.T) {
	tr := func(at float64, transition string) breaker.JournalEntry {
		return breaker.JournalEntry{At: at, Transition: transition}
	}
	cases := []struct {
		name    string
		state   string
		entries []breaker.JournalEntry
		want    string
	}{
		{"no transition", "closed", nil, "[{100 1000 closed}]"},
		{"open now", "open", []breaker.JournalEntry{tr(400, "closed->open")}, "[{100 400 closed} {400 1000 open}]"},
		{"an episode", "closed", []breaker.JournalEntry{tr(700, "half_open->closed"), tr(600, "open->half_open"), tr(300, "closed->open")},
			"[{100 300 closed} {300 600 open} {600 700 half_open} {700 1000 closed}]"},
		{"older than the chart", "open", []breaker.JournalEntry{tr(500, "half_open->open"), tr(50, "open->half_open"), tr(20, "closed->open")},
			"[{100 500 half_open} {500 1000 open}]"},
		{"newer than now is left out", "closed", []breaker.JournalEntry{tr(1200, "closed->open")}, "[{100 1000 closed}]"},
		// A probe admitted and answered in one tick, reported in either
		// order (the chart drew half_open where the route was open).
		{"same instant, in order", "closed", []breaker.JournalEntry{tr(700, "half_open->closed"), tr(700, "open->half_open"), tr(300, "closed->open")},
			"[{100 300 closed} {300 700 open} {700 1000 closed}]"},
		{"same instant, reversed", "closed", []breaker.JournalEntry{tr(700, "open->half_open"), tr(700, "half_open->closed"), tr(300, "closed->open")},
			"[{100 300 closed} {300 700 open} {700 1000 closed}]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := fmt.Sprint(bands(c.state, c.entries, 100, 1000))
			if got != c.want {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
}
