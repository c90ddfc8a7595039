package main

import (
	"fmt"
	"strings"
	"testing"
)

// unreachable is the line with which a replica's store turns degraded
// (replica "" for r0).
func unreachable(replica string) string {
	l := `time=x level=ERROR msg="[store] Redis is unreachable: deciding and recording on this replica's local state until it returns" op=rec`
	if replica != "" {
		l = "[" + replica + "] " + l
	}
	return l
}

// keyError is the line with which one breaker goes on its replica's local
// state alone.
func keyError(replica, route string) string {
	return "[" + replica + `] time=x level=ERROR msg="[store] Redis answered one breaker's state with an error: that breaker decides and records on this replica's local state until it reads again; the others are not affected" gateway=default route=` + route
}

// line is a transition's log line, replica's ("" for a lone fusebox).
func line(replica, tr, by string, gen int) string {
	l := fmt.Sprintf(`time=x level=INFO msg="[circuit_breaker] %s" transition=%s route=openai:us:m generation=%d decided_by=%s`, tr, tr, gen, by)
	if replica != "" {
		l = "[" + replica + "] " + l
	}
	return l
}

func TestCheckTransitions(t *testing.T) {
	for _, c := range []struct {
		name    string
		onRedis bool
		lines   []string
		wrong   int
	}{
		{"memory: a lifetime's chain", false, []string{
			line("", "closed->open", "memory", 2), line("", "open->half_open", "memory", 3), line("", "half_open->closed", "memory", 4),
		}, 0},
		{"memory: a lifetime begins closed", false, []string{
			line("", "closed->open", "memory", 2), "=== fusebox started", line("", "open->half_open", "memory", 2),
		}, 1},
		{"memory: a skipped state", false, []string{
			line("", "closed->open", "memory", 2), line("", "half_open->closed", "memory", 4),
		}, 1},
		// Two replicas write their lines in their own order: r1's
		// half_open->closed (generation 4) reaches the log after r0's
		// closed->open (generation 5) that followed it in Redis.
		{"redis: the fleet's lines out of Redis's order", true, []string{
			line("", "closed->open", "redis", 2), line("r1", "open->half_open", "redis", 3),
			line("", "closed->open", "redis", 5), line("r1", "half_open->closed", "redis", 4),
		}, 0},
		// CI, stop 32: r1 tripped on its local view during a stall, then
		// r0's script opened the shared state.
		{"redis: a local chain is its replica's own", true, []string{
			unreachable("r1"), line("r1", "closed->open", "local", 2), line("", "closed->open", "redis", 2),
			line("r1", "open->half_open", "local", 3), "[r1] level=INFO msg=\"[store] Redis is reachable again: local opens written back\"",
			unreachable("r1"), line("r1", "half_open->open", "local", 9),
		}, 0},
		// #54: the store writes a local line with the phase that admitted
		// it, inside the stretch in which its view was the store.
		{"redis: a local line while Redis was the store", true, []string{
			line("r1", "closed->open", "local", 2),
		}, 1},
		{"redis: a local line after its stretch ended", true, []string{
			unreachable("r1"), line("r1", "closed->open", "local", 2),
			"[r1] level=INFO msg=\"[store] Redis is reachable again: local opens written back\"",
			line("r1", "open->half_open", "local", 3),
		}, 1},
		{"redis: another replica's stretch", true, []string{
			unreachable(""), line("r1", "closed->open", "local", 2),
		}, 1},
		{"redis: one breaker's stretch is its own", true, []string{
			keyError("r1", "openai:us:m"), line("r1", "closed->open", "local", 2),
			keyError("r1", "anthropic:us:m"), strings.Replace(line("r1", "closed->open", "local", 2), "openai:us:m", "azure:us:m", 1),
		}, 1},
		{"redis: two opens in a row in Redis", true, []string{
			line("", "closed->open", "redis", 2), line("r1", "closed->open", "redis", 3),
		}, 1},
		{"redis: an emptied Redis begins again", true, []string{
			line("", "closed->open", "redis", 7), "=== redis flushed", line("r1", "closed->open", "redis", 2),
			line("", "open->half_open", "redis", 8), "=== redis restarted", line("", "closed->open", "redis", 2),
		}, 0},
		{"redis: a local chain that skips", true, []string{
			unreachable("r1"), line("r1", "closed->open", "local", 2), line("r1", "half_open->closed", "local", 4),
		}, 1},
		// One breaker on its local view alone (a key error), until that
		// breaker reads again: its view then takes Redis's state without
		// a line, and a later local chain begins from it. Another
		// breaker's reading again ends nothing of this one's.
		{"redis: one breaker's local chain ends as it reads again", true, []string{
			keyError("r1", "openai:us:m"), line("r1", "open->half_open", "local", 3),
			`[r1] time=x level=INFO msg="[store] a breaker's state in Redis reads again" gateway=default route=openai:us:m`,
			keyError("r1", "openai:us:m"), line("r1", "open->half_open", "local", 5),
		}, 0},
		{"redis: another breaker's reading again ends nothing", true, []string{
			keyError("r1", "openai:us:m"), line("r1", "open->half_open", "local", 3),
			`[r1] time=x level=INFO msg="[store] a breaker's state in Redis reads again" gateway=default route=anthropic:us:m`,
			line("r1", "open->half_open", "local", 5),
		}, 1},
		{"redis: a memory store's line", true, []string{line("", "closed->open", "memory", 2)}, 1},
		{"memory: an illegal edge", false, []string{line("", "closed->half_open", "memory", 2)}, 1},
		// R-FD3: a replica's own open is a chain of its own, beside its
		// local view's and the shared one.
		{"redis: a replica-scoped chain is its own", true, []string{
			unreachable("r1"), line("r1", "closed->open", "local", 2) + " scope=replica", line("", "closed->open", "redis", 2),
			line("r1", "open->half_open", "local", 3) + " scope=replica", line("r1", "closed->open", "local", 2),
			line("r1", "half_open->closed", "local", 4) + " scope=replica",
		}, 0},
		{"redis: a replica-scoped chain begins closed", true, []string{
			line("r1", "open->half_open", "local", 3) + " scope=replica",
		}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := 0
			wrong, excerpt := checkTransitions(strings.Join(c.lines, "\n"), c.onRedis, &n)
			if len(wrong) != c.wrong {
				t.Fatalf("%d wrong, want %d: %v", len(wrong), c.wrong, wrong)
			}
			// A broken chain ("… after …") or a local line outside its
			// stretch comes with its log; a line on the wrong store is no
			// chain.
			broken := len(wrong) > 0 && (strings.Contains(wrong[0], " after ") || strings.Contains(wrong[0], "while Redis was the store"))
			if broken != (len(excerpt) > 0) {
				t.Fatalf("%v, and an excerpt of %d lines", wrong, len(excerpt))
			}
		})
	}
}

// A broken chain comes with its log: the broken replica's lines for that
// breaker and its store's, from the chain's first transition to the
// broken one, and nothing of another replica's or another breaker's.
func TestBrokenChainComesWithItsLog(t *testing.T) {
	lines := []string{
		unreachable("r1"), unreachable(""),
		line("r1", "closed->open", "local", 2),
		"[r1] time=x level=ERROR msg=\"[store] Redis is unreachable\"",
		line("r0", "closed->open", "local", 2),
		"[r1] time=x level=INFO msg=\"[circuit_breaker] x\" transition=closed->open route=anthropic:us:m generation=1 decided_by=local",
		line("r1", "open->half_open", "local", 3),
		line("r1", "open->half_open", "local", 4),
		line("r1", "half_open->closed", "local", 5),
	}
	n := 0
	wrong, excerpt := checkTransitions(strings.Join(lines, "\n"), true, &n)
	want := []string{lines[2], lines[3], lines[6], lines[7]}
	if len(wrong) != 1 || strings.Join(excerpt, "\n") != strings.Join(want, "\n") {
		t.Fatalf("wrong %v\nexcerpt:\n%s\nwant:\n%s", wrong, strings.Join(excerpt, "\n"), strings.Join(want, "\n"))
	}
}
