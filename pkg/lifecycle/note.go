package lifecycle

import "github.com/fusebox-llm/fusebox/pkg/breaker"

// Note is the note of one decision. Fields may coexist: a later
// attempt's arrival and an early access log entry wait for a parking.
type Note struct {
	Parked *Park      `json:"p,omitempty"`
	Later  int        `json:"l,omitempty"` // the latest attempt seen arriving
	Entry  *EntryNote `json:"e,omitempty"` // an access log entry that came first
	// More are further early entries (at most maxEarlyEntries in all): an
	// entry that names another cluster or attempt must not crowd out the
	// one the parking attempt will match.
	More []EntryNote `json:"em,omitempty"`
	// Obs: the observer role took the decision's response (processor/observe.go):
	// it records; a later park or entry of the decision records nothing.
	Obs bool `json:"o,omitempty"`
	// Done: a route-role decision (N 0) was recorded from its parking (an
	// entry, or a neither at its end): an observer that comes later
	// records nothing.
	Done bool `json:"x,omitempty"`
	// Expired: the parked party's wait ended (a neither freed its probe
	// slot); it stays, so that a real outcome that comes later is still
	// recorded, late (R-DL2).
	Expired bool `json:"xp,omitempty"`
	// Rec: the attempts (bit n) whose outcome was recorded through the
	// note: one record per attempt number (R-DL4).
	Rec uint64 `json:"rc,omitempty"`
	// Arr: the attempts (bit n) whose arrival the note was told of: an
	// attempt number that arrives twice is a replayed token (R-DL4).
	Arr uint64 `json:"ar,omitempty"`
	// Claims are the claims this note made for operations that carry an
	// id (at most maxClaims, the latest): the same operation sent again,
	// because its answer was lost, gets the same answer (R-DL12). Before,
	// a claim whose reply was lost after the script ran was answered
	// "settled already" when it was sent again, and the outcome it had
	// claimed was recorded nowhere (TestTwoReplicasStoreAnswers).
	Claims []Claim `json:"k,omitempty"`
}

// Claim is what the note answered an operation that claimed a party.
type Claim struct {
	ID        string    `json:"i"`
	How       How       `json:"h"`
	Claim     *Park     `json:"c,omitempty"`
	Res       EntryNote `json:"r"`
	Late      bool      `json:"l,omitempty"`
	Older     *Park     `json:"o,omitempty"`
	OlderLate bool      `json:"ol,omitempty"`
	Chained   bool      `json:"ch,omitempty"`
}

// maxClaims bounds the claims one note remembers: one per attempt a
// request makes, in practice.
const maxClaims = 4

// Park is a parked attempt, or a route-role decision waiting for
// its access log entry (N 0: any attempt count): enough to record it on
// any replica.
type Park struct {
	N          int    `json:"n"`
	Gateway    string `json:"g"`
	Route      string `json:"r"`
	Cluster    string `json:"c"`
	RouteGen   uint64 `json:"rg"`
	RouteLease uint64 `json:"rl,omitempty"`
	FleetGen   uint64 `json:"fg,omitempty"`
	FleetLease uint64 `json:"fl,omitempty"`
	Start      int64  `json:"s"` // when the attempt began (ns, the parking replica's clock)
	// Elapsed is how long the attempt ran until it parked (ms, measured on
	// the parking replica: one clock, R-DL6).
	Elapsed int64 `json:"e,omitempty"`
	// Expect is the attempt's per-try timeout as the router announced it
	// (ms, x-envoy-expected-rq-timeout-ms; 0 unknown): a retried attempt
	// that ran that long was timed out, not refused (recordRetried).
	Expect int64 `json:"x,omitempty"`
}

// EntryNote is an access log entry kept in a note until the party it
// speaks for parks (an entry that came first).
type EntryNote struct {
	Res     breaker.Result `json:"res"`
	Cluster string         `json:"c,omitempty"`
	Attempt uint32         `json:"a,omitempty"`
}

// Outcome is the kept entry as the table reads it.
func (e *EntryNote) Outcome() Entry {
	return Entry{Res: e.Res, Cluster: e.Cluster, Attempt: e.Attempt}
}

// Entry is what an access log entry says of its request, as far as the
// table reads it (the processor's entryOutcome carries the rest).
type Entry struct {
	Res     breaker.Result
	Cluster string // upstream_cluster: "" when no host was picked (NC, UH)
	Attempt uint32 // upstream_request_attempt_count, 0 unknown
	// Chained: an NC/UH entry of a failover decision whose chain its sealed
	// token gave (R-AL5): its own attempt's outcome, charged to its group.
	Chained bool
}

// Matches reports whether the entry speaks for the parked party p: its
// attempt (or none) and its cluster (or none).
func (o Entry) Matches(p *Park) bool {
	return (o.Attempt == 0 || p.N == 0 || int(o.Attempt) == p.N) && (o.Cluster == "" || o.Cluster == p.Cluster)
}

func (n *Note) empty() bool {
	return n.Parked == nil && n.Later == 0 && n.Entry == nil && len(n.More) == 0 && !n.Obs && !n.Done && !n.Expired && n.Rec == 0 && n.Arr == 0 && len(n.Claims) == 0
}

// How is what an operation on a note did.
type How uint8

const (
	HowNone         How = iota
	HowParked           // the attempt waits in the note
	HowConnErr          // claimed: Envoy retried it
	HowEntry            // claimed: the access log entry says what happened
	HowNeither          // claimed: its park time ended
	HowEarly            // an entry for no parked attempt, kept in the note
	HowMismatch         // an entry that names another cluster or attempt
	HowFailed           // the store refused (full, forged): settled here
	HowObserved         // the observer claimed the parked decision: it records
	HowObserveFirst     // the observer came before the park: it records
	HowByObserver       // a park or entry after the observer: nothing to record
	HowDuplicate        // an event that came again: nothing to record (counted)
	HowUnreachable      // the meeting place did not answer (R-DL7)
	HowChained          // an NC/UH entry that is its own attempt's outcome (R-AL5)
)

// Act is what an operation did, and what its caller records.
type Act struct {
	How   How
	Claim *Park // the party to record (How is ConnErr, Entry, Neither)
	Res   Entry
	// Late: the claimed party's wait had ended (its slot was freed): it is
	// recorded without its lease (R-DL2).
	Late bool
	// Older is an earlier attempt of the request found parked by a park:
	// Envoy retried it (OlderLate: its wait had ended).
	Older     *Park
	OlderLate bool
	// Chained is an NC/UH entry for a later attempt than the claimed one
	// (R-AL5): Envoy made no upstream request for it, so no attempt stream
	// will record it; the entry does, against its chain group.
	Chained *Entry
	Row     int // the table row that applied (tests)
	// Again: the operation was sent again and had claimed already: the
	// answer is the one it got then.
	Again bool
}

// claims reports whether act makes its operation's caller record.
func (a *Act) claims() bool {
	switch a.How {
	case HowConnErr, HowEntry, HowChained:
		return true
	}
	return a.Older != nil
}

// Op is one event that reached a decision's note.
type Op struct {
	// ID names the operation, so that sending it again after an unknown
	// answer gets the answer it got (Claims); "" for one never sent again.
	ID     string
	Park   *Park // park (or expire, with Expire set)
	Expire bool
	Arrive int
	Entry  *Entry
	// Observe: the observer role saw the decision's response begin.
	Observe bool
}
