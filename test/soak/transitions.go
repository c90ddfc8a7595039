package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// legalTransition lists the state machine's edges (SPEC §5).
var legalTransition = map[string]bool{"closed->open": true, "open->half_open": true, "half_open->closed": true, "half_open->open": true, "open->closed": true}

// A transition as the log line tells it.
type loggedTransition struct {
	replica, route, tr, by string
	gen                    uint64
	seq                    int // its place in the log
}

// checkTransitions reads the merged logs of the fleet and returns every
// transition that breaks its chain; n counts them all. A breaker has one
// chain per deciding state, and the log line names it (decided_by):
//
//   - memory: one replica's memory store, in log order; a lifetime (a
//     fusebox start) begins closed.
//   - redis: the shared state, whichever replica's script made it. Two
//     replicas write their lines in their own order, not Redis's, so the
//     chain is put in the order of the breaker's generation (which every
//     transition in Redis bumps) before it is read; a Redis emptied or
//     restarted begins the chain again (its first transition is checked
//     for legality only).
//   - local: one replica's local view while Redis was unreachable, from
//     the state it last learned (legality only for the first) until that
//     replica's "Redis is reachable again"; or one breaker's alone, while
//     Redis answered its state with an error (keyerror.go), until that
//     breaker's "a breaker's state in Redis reads again". Either way the
//     view then takes Redis's state without a line of its own.
//     A local line outside such a stretch (after its replica's "Redis is
//     unreachable" and before "reachable again", or after its breaker's
//     "answered one breaker's state with an error" and before "reads
//     again") was admitted while Redis was the store, and is wrong by
//     itself: the store writes each line with the phase that admitted it
//     (#54; before, a line admitted while writing back could follow
//     "reachable again", and fell into the next stretch's chain).
//   - replica: one replica's own view of its egress (scope=replica,
//     R-FD3), in log order; a lifetime begins closed.
//
// The replica is the "[rN] " prefix the rig writes before each replica's
// lines.
//
// excerpt is the log around the first broken chain, from its first
// transition to the broken one: that breaker's lines and the store's, of
// its replica (every replica's for the shared chain), the last
// excerptLines of them. CI keeps only the test's output, and a chain
// broken on a loaded machine may not break again (#54, loaded run F4:
// "open->half_open after half_open" on a local chain, with no log kept).
func checkTransitions(logs string, onRedis bool, n *int) (wrong, excerpt []string) {
	lines := strings.Split(logs, "\n")
	check := func(chain []loggedTransition, prev string) {
		for i, t := range chain {
			from, to, _ := strings.Cut(t.tr, "->")
			if prev == "" {
				prev = from
			}
			if !legalTransition[t.tr] || from != prev {
				wrong = append(wrong, fmt.Sprintf("%s (%s, %s, generation %d): %s after %s", t.route, t.replica, t.by, t.gen, t.tr, prev))
				if excerpt == nil {
					excerpt = chainExcerpt(lines, chain[0].seq, chain[i])
				}
			}
			prev = to
		}
	}
	// Chains being read, keyed by chain: replica|route for memory and
	// local, route for redis.
	memory := map[string][]loggedTransition{}
	local := map[string][]loggedTransition{}
	shared := map[string][]loggedTransition{}
	scoped := map[string][]loggedTransition{}
	flushMemory := func(replica string) {
		for _, chains := range []map[string][]loggedTransition{memory, scoped} {
			for k, c := range chains {
				if replica == "" || strings.HasPrefix(k, replica+"|") {
					check(c, "closed")
					delete(chains, k)
				}
			}
		}
	}
	flushLocal := func(replica string) {
		for k, c := range local {
			if replica == "" || strings.HasPrefix(k, replica+"|") {
				check(c, "")
				delete(local, k)
			}
		}
	}
	// Where each replica's local view is the store: the whole store (by
	// replica) or one breaker (by replica|route).
	away := map[string]bool{}
	keyAway := map[string]bool{}
	flushShared := func() {
		for k, c := range shared {
			sort.SliceStable(c, func(i, j int) bool { return c[i].gen < c[j].gen })
			check(c, "")
			delete(shared, k)
		}
	}
	for seq, line := range lines {
		replica, rest := splitReplica(line)
		switch {
		case rest == "=== fusebox started":
			flushMemory(replica)
			flushLocal(replica)
			continue
		case rest == "=== redis flushed" || rest == "=== redis restarted":
			flushShared()
			continue
		case strings.Contains(rest, "[store] Redis is unreachable"):
			away[replica] = true
			continue
		case strings.Contains(rest, "Redis is reachable again"):
			away[replica] = false
			flushLocal(replica)
			continue
		case strings.Contains(rest, "[store] Redis answered one breaker's state with an error"):
			keyAway[replica+"|"+field(rest, "route")] = true
			continue
		case strings.Contains(rest, "a breaker's state in Redis reads again"):
			k := replica + "|" + field(rest, "route")
			keyAway[k] = false
			check(local[k], "")
			delete(local, k)
			continue
		case !strings.Contains(rest, "[circuit_breaker]"):
			continue
		}
		*n++
		t := loggedTransition{replica: replica, route: field(rest, "route"), tr: field(rest, "transition"), by: field(rest, "decided_by"), seq: seq}
		t.gen, _ = strconv.ParseUint(field(rest, "generation"), 10, 64)
		switch {
		case field(rest, "scope") == "replica" && t.by == "local" && onRedis:
			scoped[replica+"|"+t.route] = append(scoped[replica+"|"+t.route], t)
		case t.by == "redis" && onRedis:
			shared[t.route] = append(shared[t.route], t)
		case t.by == "local" && onRedis:
			k := replica + "|" + t.route
			if !away[replica] && !keyAway[k] {
				wrong = append(wrong, fmt.Sprintf("%s (%s, local, generation %d): %s logged while Redis was the store", t.route, replica, t.gen, t.tr))
				if excerpt == nil {
					excerpt = chainExcerpt(lines, 0, t)
				}
			}
			local[k] = append(local[k], t)
		case t.by == "memory" && !onRedis:
			memory[replica+"|"+t.route] = append(memory[replica+"|"+t.route], t)
		default:
			wrong = append(wrong, fmt.Sprintf("%s (%s): %s decided_by=%q on the %s store", t.route, replica, t.tr, t.by, map[bool]string{true: "Redis", false: "memory"}[onRedis]))
		}
	}
	flushMemory("")
	flushLocal("")
	flushShared()
	return wrong, excerpt
}

// excerptLines bounds a broken chain's excerpt.
const excerptLines = 40

// chainExcerpt is the log from line from to broken's: broken's breaker's
// lines and the store's, of broken's replica (every replica's for a
// shared chain), the last excerptLines of them.
func chainExcerpt(lines []string, from int, broken loggedTransition) []string {
	var out []string
	for _, line := range lines[from : broken.seq+1] {
		if replica, _ := splitReplica(line); broken.by != "redis" && replica != broken.replica {
			continue
		}
		if field(line, "route") == broken.route || strings.Contains(line, "[store]") || strings.Contains(line, "=== ") {
			out = append(out, line)
		}
	}
	if len(out) > excerptLines {
		out = out[len(out)-excerptLines:]
	}
	return out
}

// splitReplica parts a line into its replica (the "[rN] " prefix the rig
// writes; r0 without one) and the rest.
func splitReplica(line string) (replica, rest string) {
	if strings.HasPrefix(line, "[r") {
		if i := strings.Index(line, "] "); i > 0 {
			return line[1:i], line[i+2:]
		}
	}
	return "r0", line
}
