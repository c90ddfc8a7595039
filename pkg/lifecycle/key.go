package lifecycle

import (
	"strconv"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// RecordKey names a real outcome's record (R-DL11): its decision and its
// attempt (1 without failover), so that whichever channel, replica or
// resend delivers it, a store applies it once. A neither goes unkeyed: it
// counts nothing, and an expiry's neither must not make the real outcome
// that follows it a repeat (R-DL2).
func RecordKey(decision string, attempt int) string {
	return decision + ":" + strconv.Itoa(max(attempt, 1))
}

// RecordKeyLife is how long a key is remembered: twice the longest an
// outcome may still arrive (decision_wait_sec + access_log.wait_ms), at
// least breaker.DefaultRecordKeyLife. A party's park is written again, and
// an unanswered operation sent again, for as long (R-DL12).
func RecordKeyLife(decisionWait, accessLogWait time.Duration) time.Duration {
	return max(2*(decisionWait+accessLogWait), time.Duration(breaker.DefaultRecordKeyLife)*time.Millisecond)
}
