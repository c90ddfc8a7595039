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
// It imports only the breaker: the roles that receive the channels' events,
// the replica-local waits and the keyed record (R-DL11) live in the
// processor, which calls it. docs/decisions.md's table is RenderTable's
// output; TestDecisionsDocMatchesTable holds them together, and
// TestNoteLifecycleOrders enumerates every order of each deployment's
// events against the table's promises.
package lifecycle
