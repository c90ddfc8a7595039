package storetest

import (
	"fmt"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Journal (breaker.FleetJournal): entries come back newest first, as they
// were written, the newest FleetJournalLen of them and no more.
func testJournal(t *testing.T, f Factory) {
	r := newRig(t, f, pol(nil))
	j, ok := r.st.(breaker.FleetJournal)
	if !ok {
		t.Fatalf("%T keeps no fleet journal", r.st)
	}
	entry := func(i int) string {
		return fmt.Sprintf(`{"id":"r:%d","at":%d,"route":"a:b:c","transition":"closed->open"}`, i, i)
	}
	total := breaker.FleetJournalLen + 44
	for i := 0; i < total-10; i++ {
		if err := j.AppendJournal(ctx, []byte(entry(i))); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	// A batch is appended oldest first, as ten single appends would be.
	var batch [][]byte
	for i := total - 10; i < total; i++ {
		batch = append(batch, []byte(entry(i)))
	}
	if err := j.AppendJournal(ctx, batch...); err != nil {
		t.Fatalf("append a batch: %v", err)
	}
	if err := j.AppendJournal(ctx); err != nil {
		t.Fatalf("append nothing: %v", err)
	}
	got, err := j.RecentJournal(ctx, 3)
	if err != nil || len(got) != 3 || string(got[0]) != entry(total-1) || string(got[2]) != entry(total-3) {
		t.Fatalf("the 3 newest: %q %v", got, err)
	}
	all, err := j.RecentJournal(ctx, 10*breaker.FleetJournalLen)
	if err != nil || len(all) != breaker.FleetJournalLen || string(all[len(all)-1]) != entry(total-breaker.FleetJournalLen) {
		t.Fatalf("all: %d entries, the oldest %q, %v", len(all), all[len(all)-1], err)
	}
}
