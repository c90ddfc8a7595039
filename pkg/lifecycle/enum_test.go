package lifecycle

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
// channel does with the table's answer (processor: meet.go, accesslog.go, observe.go).

// party is who an outcome belongs to: the route role's decision (0) or
// attempt n.
type tally struct{ real, neither map[int]int }

func newTally() tally { return tally{real: map[int]int{}, neither: map[int]int{}} }

// play applies ops in order and tallies what the channels record.
func play(ops []Op) tally {
	t := newTally()
	var raw []byte
	for _, op := range ops {
		var cur Note
		if raw != nil {
			if err := Decode(raw, &cur); err != nil {
				panic(err)
			}
		}
		next, act := Step(cur, op)
		raw = next.Encode()
		if act.Older != nil {
			t.real[act.Older.N]++
		}
		switch act.How {
		case HowConnErr, HowEntry:
			t.real[act.Claim.N]++
		case HowObserved, HowObserveFirst:
			t.real[0]++
		case HowNeither:
			t.neither[act.Claim.N]++
		case HowChained:
			t.real[int(op.Entry.Attempt)]++
		}
		if act.Chained != nil {
			t.real[int(act.Chained.Attempt)]++
		}
	}
	return t
}

// permutations calls f with every order of ops that keeps each expiry
// after its own park.
func permutations(ops []Op, f func([]Op)) {
	var rec func(done []Op, rest []Op)
	rec = func(done, rest []Op) {
		if len(rest) == 0 {
			f(done)
			return
		}
		for i := range rest {
			op := rest[i]
			if op.Expire && !parkedIn(done, op.Park) {
				continue
			}
			next := append(append([]Op{}, rest[:i]...), rest[i+1:]...)
			rec(append(append([]Op{}, done...), op), next)
		}
	}
	rec(nil, ops)
}

func parkedIn(ops []Op, p *Park) bool {
	for _, o := range ops {
		if o.Park == p && !o.Expire {
			return true
		}
	}
	return false
}

func describe(ops []Op) string {
	var b []string
	for _, o := range ops {
		switch ev := o.Event(); ev {
		case EvPark, EvExpire:
			b = append(b, fmt.Sprintf("%s%d", ev, o.Park.N))
		case EvArrive:
			b = append(b, fmt.Sprintf("arrive%d", o.Arrive))
		case EvEntry:
			b = append(b, fmt.Sprintf("entry%d", o.Entry.Attempt))
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
	ops  []Op
	real map[int]int
}

// routeDeployment is the route role's decision, on the route profile or
// the observer's, with or without its entry and its expiry.
func routeDeployment(observer, entry, expire bool) deployment {
	conn := breaker.Result{Kind: breaker.KindConnError}
	p := &Park{Gateway: "g", Route: "r", Cluster: "c"}
	ops := []Op{{Park: p}}
	real := map[int]int{}
	name := "route"
	if observer {
		ops = append(ops, Op{Observe: true})
		real[0], name = 1, "observer"
	}
	if entry {
		ops = append(ops, Op{Entry: &Entry{Res: conn, Cluster: "c"}})
		real[0] = 1
	}
	if expire {
		ops = append(ops, Op{Park: p, Expire: true})
	}
	return deployment{fmt.Sprintf("%s entry=%v expire=%v", name, entry, expire), ops, real}
}

// failoverDeployment is failover with k attempts: attempts 1..k-1 ended
// before headers and were retried (attempt n+1 arrived); attempt k ended
// before headers too and parked: Envoy's entry says what happened to it,
// or nothing does. Each park may expire.
func failoverDeployment(k int, entry, expire bool) deployment {
	conn := breaker.Result{Kind: breaker.KindConnError}
	var ops []Op
	real := map[int]int{}
	for n := 1; n <= k; n++ {
		p := &Park{N: n, Gateway: "g", Route: fmt.Sprint("r", n), Cluster: fmt.Sprint("c", n), RouteGen: uint64(n)}
		ops = append(ops, Op{Park: p})
		if n > 1 {
			ops = append(ops, Op{Arrive: n})
			real[n-1] = 1
		}
		if expire {
			ops = append(ops, Op{Park: p, Expire: true})
		}
	}
	if entry {
		ops = append(ops, Op{Entry: &Entry{Res: conn, Cluster: fmt.Sprint("c", k), Attempt: uint32(k)}})
		real[k] = 1
	}
	return deployment{fmt.Sprintf("failover k=%d entry=%v expire=%v", k, entry, expire), ops, real}
}

func deployments() []deployment {
	var out []deployment
	conn := breaker.Result{Kind: breaker.KindConnError}
	// The route role (envoy.yaml): its stream ended with no response and
	// parked the decision; Envoy's entry may come (any replica), the wait
	// may end. The observer profile: the observer always sees the
	// response; the entry and the expiry may come too.
	for _, observer := range []bool{false, true} {
		for _, entry := range []bool{false, true} {
			for _, expire := range []bool{false, true} {
				out = append(out, routeDeployment(observer, entry, expire))
			}
		}
	}
	// Failover with k attempts (failoverDeployment).
	for k := 1; k <= 3; k++ {
		for _, entry := range []bool{false, true} {
			for _, expire := range []bool{false, true} {
				out = append(out, failoverDeployment(k, entry, expire))
			}
		}
	}
	// Failover where the last attempt met no host (UH): no attempt stream,
	// an entry with no cluster settles it against its chain group.
	for k := 1; k <= 3; k++ {
		var ops []Op
		real := map[int]int{k: 1}
		for n := 1; n < k; n++ {
			p := &Park{N: n, Gateway: "g", Route: fmt.Sprint("r", n), Cluster: fmt.Sprint("c", n)}
			ops = append(ops, Op{Park: p})
			if n+1 < k {
				ops = append(ops, Op{Arrive: n + 1})
			}
			real[n] = 1
		}
		ops = append(ops, Op{Entry: &Entry{Res: conn, Attempt: uint32(k), Chained: true}})
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
		permutations(d.ops, func(ops []Op) {
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
	for run := range 20000 {
		if run%4 == 0 {
			decisionWorld(t, rng, run)
			continue
		}
		attemptWorld(t, rng, run)
	}
}

// attemptWorld is the model for the attempts of a failover decision: up
// to three, each parked, expired, arrived after, or named by an entry
// (its own, or a forged one), in any order.
func attemptWorld(t *testing.T, rng *rand.Rand, run int) {
	t.Helper()
	k := 1 + rng.IntN(3)
	ops, parked := randomAttemptOps(rng, k)
	realFor := attemptsWithRealOutcome(ops, parked, k)
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

// randomAttemptOps draws the events of k attempts, and which parked.
func randomAttemptOps(rng *rand.Rand, k int) ([]Op, map[int]bool) {
	conn := breaker.Result{Kind: breaker.KindConnError}
	parks := make([]*Park, k+1)
	for n := 1; n <= k; n++ {
		parks[n] = &Park{N: n, Gateway: "g", Route: fmt.Sprint("r", n), Cluster: fmt.Sprint("c", n)}
	}
	var ops []Op
	parked := map[int]bool{}
	for range 2 + rng.IntN(10) {
		n := 1 + rng.IntN(k)
		switch rng.IntN(5) {
		case 0:
			ops = append(ops, Op{Park: parks[n]})
			parked[n] = true
		case 1:
			if parked[n] {
				ops = append(ops, Op{Park: parks[n], Expire: true})
			}
		case 2:
			if n > 1 {
				ops = append(ops, Op{Arrive: n})
			}
		case 3:
			ops = append(ops, Op{Entry: &Entry{Res: conn, Cluster: fmt.Sprint("c", n), Attempt: uint32(n)}})
		case 4:
			// A forged Entry: another cluster, or an attempt never made.
			ops = append(ops, Op{Entry: &Entry{Res: conn, Cluster: "forged", Attempt: uint32(n)}})
		}
	}
	return ops, parked
}

// attemptsWithRealOutcome is the reference model: attempt n has a real
// outcome when it parked and a later attempt arrived or parked, or an
// entry of its own came, in any order: the note meets them whatever comes
// first.
func attemptsWithRealOutcome(ops []Op, parked map[int]bool, k int) map[int]bool {
	realFor := map[int]bool{}
	for n := 1; n <= k; n++ {
		if !parked[n] {
			continue
		}
		for _, op := range ops {
			if op.Arrive > n || op.Park != nil && !op.Expire && op.Park.N > n ||
				op.Entry != nil && op.Entry.Cluster == fmt.Sprint("c", n) && int(op.Entry.Attempt) == n {
				realFor[n] = true
			}
		}
	}
	return realFor
}

// decisionWorld is the model for a route-role decision (N 0) in the
// route and observer profiles: the park, its expiry, the observer and
// entries, each possibly more than once.
func decisionWorld(t *testing.T, rng *rand.Rand, run int) {
	t.Helper()
	ops, real := randomDecisionOps(rng)
	got := play(ops)
	if got.real[0] > 1 || real && got.real[0] != 1 {
		t.Fatalf("run %d [%s]: the decision recorded %d times (a real outcome: %v)", run, describe(ops), got.real[0], real)
	}
	if got.neither[0] > 1 {
		t.Fatalf("run %d [%s]: %d neithers", run, describe(ops), got.neither[0])
	}
}

// randomDecisionOps draws a decision's events and says whether it has a
// real outcome: the observer saw it, or an entry of its own came and a
// park came at all (an entry before any park waits for it).
func randomDecisionOps(rng *rand.Rand) (ops []Op, real bool) {
	p := &Park{Gateway: "g", Route: "r", Cluster: "c"}
	conn := breaker.Result{Kind: breaker.KindConnError}
	parked := false
	for range 2 + rng.IntN(8) {
		switch rng.IntN(5) {
		case 0:
			ops = append(ops, Op{Park: p})
			parked = true
		case 1:
			if parked {
				ops = append(ops, Op{Park: p, Expire: true})
			}
		case 2:
			ops = append(ops, Op{Observe: true})
			real = true
		case 3:
			ops = append(ops, Op{Entry: &Entry{Res: conn, Cluster: "c"}})
			real = real || parked
		case 4:
			ops = append(ops, Op{Entry: &Entry{Res: conn, Cluster: "forged"}})
		}
	}
	for _, op := range ops {
		if op.Entry != nil && op.Entry.Cluster == "c" && parked {
			real = true
		}
	}
	return ops, real
}

// docs/decisions.md holds the note's table as the code has it.
func TestDecisionsDocMatchesTable(t *testing.T) {
	docMatches(t, "table: generated from the lifecycle table (lifecycle.RenderTable)", "end of table", RenderTable())
}

// docs/decisions.md holds the replica-local table as the code has it.
func TestDecisionsDocMatchesWaitTable(t *testing.T) {
	docMatches(t, "wait table: generated from the replica-local table (lifecycle.RenderWaitTable)", "end of wait table", RenderWaitTable())
}

// docMatches checks that docs/decisions.md holds want between the
// comments <!-- start --> and <!-- end -->.
func docMatches(t *testing.T, start, end, want string) {
	t.Helper()
	doc, err := os.ReadFile("../../docs/decisions.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- "+start+" -->\n")
	table, _, ok2 := strings.Cut(rest, "<!-- "+end+" -->")
	if !ok || !ok2 {
		t.Fatalf("docs/decisions.md has no %q markers", start)
	}
	if table != want {
		t.Fatalf("docs/decisions.md's table (%s) differs from the code's; it should read:\n%s", start, want)
	}
}
