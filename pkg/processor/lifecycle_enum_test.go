package processor

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The decision lifecycle's promises, checked on every order of the events
// of each deployment (SPEC R-DL1) and on random sequences against a small
// reference model. The events go through the note's table (step) and its
// encoding, as they do through the store; a harness plays what each
// channel does with the table's answer (meet.go, accesslog.go, observe.go).

// party is who an outcome belongs to: the route role's decision (0) or
// attempt n.
type tally struct{ real, neither map[int]int }

func newTally() tally { return tally{real: map[int]int{}, neither: map[int]int{}} }

// play applies ops in order and tallies what the channels record.
func play(ops []meetOp) tally {
	t := newTally()
	var raw []byte
	for _, op := range ops {
		var cur attemptNote
		if raw != nil {
			if err := decodeAttemptNote(raw, &cur); err != nil {
				panic(err)
			}
		}
		next, act := step(cur, op)
		raw = next.encode()
		if act.older != nil {
			t.real[act.older.N]++
		}
		switch act.how {
		case meetConnErr, meetEntry:
			t.real[act.claim.N]++
		case meetObserved, meetObserveFirst:
			t.real[0]++
		case meetNeither:
			t.neither[act.claim.N]++
		case meetChained:
			t.real[int(op.entry.attempt)]++
		}
		if act.chained != nil {
			t.real[int(act.chained.attempt)]++
		}
	}
	return t
}

// permutations calls f with every order of ops that keeps each expiry
// after its own park.
func permutations(ops []meetOp, f func([]meetOp)) {
	var rec func(done []meetOp, rest []meetOp)
	rec = func(done, rest []meetOp) {
		if len(rest) == 0 {
			f(done)
			return
		}
		for i := range rest {
			op := rest[i]
			if op.expire && !parkedIn(done, op.park) {
				continue
			}
			next := append(append([]meetOp{}, rest[:i]...), rest[i+1:]...)
			rec(append(append([]meetOp{}, done...), op), next)
		}
	}
	rec(nil, ops)
}

func parkedIn(ops []meetOp, p *parkedNote) bool {
	for _, o := range ops {
		if o.park == p && !o.expire {
			return true
		}
	}
	return false
}

func describe(ops []meetOp) string {
	var b []string
	for _, o := range ops {
		switch ev := o.event(); ev {
		case evPark, evExpire:
			b = append(b, fmt.Sprintf("%s%d", ev, o.park.N))
		case evArrive:
			b = append(b, fmt.Sprintf("arrive%d", o.arrive))
		case evEntry:
			b = append(b, fmt.Sprintf("entry%d", o.entry.attempt))
		default:
			b = append(b, ev.String())
		}
	}
	return strings.Join(b, ",")
}

// deployment is one world's events and what must be recorded: real[n] is
// 1 for each party with a real outcome among the events, and neithers
// may only be recorded for parties whose park expired.
type deployment struct {
	name string
	ops  []meetOp
	real map[int]int
}

func deployments() []deployment {
	var out []deployment
	conn := breaker.Result{Kind: breaker.KindConnError}
	// The route role (envoy.yaml): its stream ended with no response and
	// parked the decision; Envoy's entry may come (any replica), the wait
	// may end.
	for _, entry := range []bool{false, true} {
		for _, expire := range []bool{false, true} {
			p := &parkedNote{Gateway: "g", Route: "r", Cluster: "c"}
			ops := []meetOp{{park: p}}
			real := map[int]int{}
			if entry {
				ops = append(ops, meetOp{entry: &entryOutcome{res: conn, cluster: "c"}})
				real[0] = 1
			}
			if expire {
				ops = append(ops, meetOp{park: p, expire: true})
			}
			out = append(out, deployment{fmt.Sprintf("route entry=%v expire=%v", entry, expire), ops, real})
		}
	}
	// The observer profile: the observer always sees the response; the
	// entry and the expiry may come too.
	for _, entry := range []bool{false, true} {
		for _, expire := range []bool{false, true} {
			p := &parkedNote{Gateway: "g", Route: "r", Cluster: "c"}
			ops := []meetOp{{park: p}, {observe: true}}
			if entry {
				ops = append(ops, meetOp{entry: &entryOutcome{res: conn, cluster: "c"}})
			}
			if expire {
				ops = append(ops, meetOp{park: p, expire: true})
			}
			out = append(out, deployment{fmt.Sprintf("observer entry=%v expire=%v", entry, expire), ops, map[int]int{0: 1}})
		}
	}
	// Failover with k attempts: attempts 1..k-1 ended before headers and
	// were retried (attempt n+1 arrived); attempt k ended before headers
	// too and parked: Envoy's entry says what happened to it, or nothing
	// does. Each park may expire.
	for k := 1; k <= 3; k++ {
		for _, entry := range []bool{false, true} {
			for _, expire := range []bool{false, true} {
				var ops []meetOp
				real := map[int]int{}
				for n := 1; n <= k; n++ {
					p := &parkedNote{N: n, Gateway: "g", Route: fmt.Sprint("r", n), Cluster: fmt.Sprint("c", n), RouteGen: uint64(n)}
					ops = append(ops, meetOp{park: p})
					if n > 1 {
						ops = append(ops, meetOp{arrive: n})
						real[n-1] = 1
					}
					if expire {
						ops = append(ops, meetOp{park: p, expire: true})
					}
				}
				if entry {
					ops = append(ops, meetOp{entry: &entryOutcome{res: conn, cluster: fmt.Sprint("c", k), attempt: uint32(k)}})
					real[k] = 1
				}
				out = append(out, deployment{fmt.Sprintf("failover k=%d entry=%v expire=%v", k, entry, expire), ops, real})
			}
		}
	}
	// Failover where the last attempt met no host (UH): no attempt stream,
	// an entry with no cluster settles it against its chain group.
	for k := 1; k <= 3; k++ {
		var ops []meetOp
		real := map[int]int{k: 1}
		for n := 1; n < k; n++ {
			p := &parkedNote{N: n, Gateway: "g", Route: fmt.Sprint("r", n), Cluster: fmt.Sprint("c", n)}
			ops = append(ops, meetOp{park: p})
			if n+1 < k {
				ops = append(ops, meetOp{arrive: n + 1})
			}
			real[n] = 1
		}
		ops = append(ops, meetOp{entry: &entryOutcome{res: conn, attempt: uint32(k), gateway: "g", chain: []string{"r1", "r2", "r3"}}})
		out = append(out, deployment{fmt.Sprintf("failover k=%d ending in UH", k), ops, real})
	}
	return out
}

// TestNoteLifecycleOrders enumerates every order of each deployment's
// events and checks the promises: exactly one real record per party that
// had a real outcome (a real outcome beats an expiry, R-DL2), none for
// one that had not, and at most one neither, only after an expiry.
func TestNoteLifecycleOrders(t *testing.T) {
	orders := 0
	for _, d := range deployments() {
		permutations(d.ops, func(ops []meetOp) {
			orders++
			got := play(ops)
			for n := 0; n <= 3; n++ {
				if got.real[n] != d.real[n] {
					t.Errorf("%s [%s]: party %d recorded %d times, want %d", d.name, describe(ops), n, got.real[n], d.real[n])
				}
				if got.neither[n] > 1 {
					t.Errorf("%s [%s]: party %d: %d neithers", d.name, describe(ops), n, got.neither[n])
				}
			}
		})
	}
	if orders < 1000 {
		t.Fatalf("only %d orders enumerated", orders)
	}
	t.Logf("%d orders", orders)
}

// TestNoteLifecycleModel drives random sequences, duplicates and forged
// events included, against a reference model of the promises: at most one
// real record per party, exactly one when the sequence holds a real
// outcome for it, and nothing for a party with no event of its own.
func TestNoteLifecycleModel(t *testing.T) {
	seed := uint64(1)
	if s := os.Getenv("FUSEBOX_MODEL_SEED"); s != "" {
		fmt.Sscan(s, &seed)
	}
	rng := rand.New(rand.NewPCG(seed, 34))
	conn := breaker.Result{Kind: breaker.KindConnError}
	for run := range 20000 {
		if run%4 == 0 {
			decisionWorld(t, rng, run)
			continue
		}
		k := 1 + rng.IntN(3)
		parks := make([]*parkedNote, k+1)
		for n := 1; n <= k; n++ {
			parks[n] = &parkedNote{N: n, Gateway: "g", Route: fmt.Sprint("r", n), Cluster: fmt.Sprint("c", n)}
		}
		var ops []meetOp
		parked := map[int]bool{}
		realFor := map[int]bool{} // the reference model: who has a real outcome
		for range 2 + rng.IntN(10) {
			n := 1 + rng.IntN(k)
			switch rng.IntN(5) {
			case 0:
				ops = append(ops, meetOp{park: parks[n]})
				parked[n] = true
			case 1:
				if parked[n] {
					ops = append(ops, meetOp{park: parks[n], expire: true})
				}
			case 2:
				if n > 1 {
					ops = append(ops, meetOp{arrive: n})
				}
			case 3:
				ops = append(ops, meetOp{entry: &entryOutcome{res: conn, cluster: fmt.Sprint("c", n), attempt: uint32(n)}})
			case 4:
				// A forged entry: another cluster, or an attempt never made.
				ops = append(ops, meetOp{entry: &entryOutcome{res: conn, cluster: "forged", attempt: uint32(n)}})
			}
		}
		// The model: attempt n has a real outcome when it parked and a later
		// attempt arrived or parked, or an entry of its own came after...
		// any order: the note meets them whatever comes first.
		for n := 1; n <= k; n++ {
			if !parked[n] {
				continue
			}
			for _, op := range ops {
				if op.arrive > n || op.park != nil && !op.expire && op.park.N > n ||
					op.entry != nil && op.entry.cluster == fmt.Sprint("c", n) && int(op.entry.attempt) == n {
					realFor[n] = true
				}
			}
		}
		got := play(ops)
		for n := 0; n <= k; n++ {
			if got.real[n] > 1 {
				t.Fatalf("run %d [%s]: attempt %d recorded %d times", run, describe(ops), n, got.real[n])
			}
			if !parked[n] && got.real[n] != 0 {
				t.Fatalf("run %d [%s]: attempt %d recorded with no park of its own", run, describe(ops), n)
			}
			if realFor[n] && got.real[n] != 1 {
				t.Fatalf("run %d [%s]: attempt %d had a real outcome, recorded %d times", run, describe(ops), n, got.real[n])
			}
			if got.neither[n] > 1 {
				t.Fatalf("run %d [%s]: attempt %d: %d neithers", run, describe(ops), n, got.neither[n])
			}
		}
	}
}

// decisionWorld is the model for a route-role decision (N 0) in the
// route and observer profiles: the park, its expiry, the observer and
// entries, each possibly more than once.
func decisionWorld(t *testing.T, rng *rand.Rand, run int) {
	p := &parkedNote{Gateway: "g", Route: "r", Cluster: "c"}
	conn := breaker.Result{Kind: breaker.KindConnError}
	var ops []meetOp
	parked, real := false, false
	for range 2 + rng.IntN(8) {
		switch rng.IntN(5) {
		case 0:
			ops = append(ops, meetOp{park: p})
			parked = true
		case 1:
			if parked {
				ops = append(ops, meetOp{park: p, expire: true})
			}
		case 2:
			ops = append(ops, meetOp{observe: true})
			real = true
		case 3:
			ops = append(ops, meetOp{entry: &entryOutcome{res: conn, cluster: "c"}})
			real = real || parked
		case 4:
			ops = append(ops, meetOp{entry: &entryOutcome{res: conn, cluster: "forged"}})
		}
	}
	// An entry before any park waits for it; the model counts it real
	// once a park came at all.
	for _, op := range ops {
		if op.entry != nil && op.entry.cluster == "c" && parked {
			real = true
		}
	}
	got := play(ops)
	if got.real[0] > 1 || real && got.real[0] != 1 {
		t.Fatalf("run %d [%s]: the decision recorded %d times (a real outcome: %v)", run, describe(ops), got.real[0], real)
	}
	if got.neither[0] > 1 {
		t.Fatalf("run %d [%s]: %d neithers", run, describe(ops), got.neither[0])
	}
}

// docs/decisions.md holds the note's table as the code has it.
func TestDecisionsDocMatchesTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/decisions.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- table: generated from noteTable (renderNoteTable) -->\n")
	table, _, ok2 := strings.Cut(rest, "<!-- end of table -->")
	if !ok || !ok2 {
		t.Fatal("docs/decisions.md has no table markers")
	}
	if table != renderNoteTable() {
		t.Fatalf("docs/decisions.md's table differs from the code's; it should read:\n%s", renderNoteTable())
	}
}
