// Package lifecycle owns the decision's note: the one table of transitions
// that every channel of every replica drives (SPEC §4b, R-DL1, R-DL2), the
// note's types and its encoding. A decision and each attempt of a failover
// decision are parties; the events that reach a party's note are its park
// (the route role's stream ended with no response, or an attempt ended
// before headers), the park's end, the next attempt's arrival, an access
// log entry and the observer. Step applies one event to a note and says
// what its caller records; the caller swaps the note in the store
// (breaker.Store.SwapNote, a compare-and-set), so exactly one replica claims
// what a note holds.
//
// A second table (wait.go, WaitStep) is the replica-local half: where a
// party held on a replica is (live, parking, in its note, alone because the
// store did not answer, expiring, gone, late, done) and what each event
// does to it, the store's answers (applied, refused, unknown) included
// (R-DL12, R-DL13). Operations that can claim carry an id; the note
// remembers its claims by id, so an operation sent again after an unknown
// answer gets the answer it got.
//
// It also owns what a decision hands from one stream to another and how
// its outcomes are named: the sealer (seal.go, AES-GCM with the fleet key),
// the attempt token and the observe note (handoff.go, read strictly), and
// the record key with its life (key.go, R-DL11).
//
// It also runs the note operations against the store (notes.go, Notes):
// the compare-and-set from a guess, the operation sent again until the
// note answers (R-DL12), the budget of early-entry notes (R-DL5), and the
// ids that name decisions and operations (ids.go); and the gate an
// attempt's record waits at for its arrival's answer (gate.go).
//
// It imports only the breaker (TestLifecycleImportsOnlyTheBreaker): the
// roles that receive the channels' events, hold the parties and run their
// timers live in the processor (decision_wait.go, meet.go), which calls both
// tables. docs/decisions.md's tables are RenderTable's and RenderWaitTable's
// output (TestDecisionsDocMatchesTable, TestDecisionsDocMatchesWaitTable);
// TestNoteLifecycleOrders enumerates every order of each deployment's events
// against the note's promises, and TestTwoReplicasStoreAnswers every order
// over two replicas times every store answer.
package lifecycle
