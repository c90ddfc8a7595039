package processor

import (
	"fmt"
	"testing"
	"time"
)

// An idle decision table lets go: the done generations rotate on time and
// a live map that held a burst is made again at its size.
func TestDecisionTableTidy(t *testing.T) {
	tab := newDecisionTable()
	for i := 0; i < 3000; i++ {
		tab.add(&stream{decisionID: fmt.Sprint("d", i)})
	}
	for i := 0; i < 3000; i++ {
		tab.forget(fmt.Sprint("d", i), 2*time.Second, true, false)
	}
	if done, _ := tab.wasDone("d1"); !done {
		t.Fatal("a decision just done is not remembered")
	}
	now := time.Now()
	tab.tidy(now.Add(3 * time.Second))
	tab.tidy(now.Add(6 * time.Second))
	if done, _ := tab.wasDone("d1"); done {
		t.Fatal("an idle table still remembers a decision two generations old")
	}
	if tab.peak != 0 || tab.len() != 0 {
		t.Fatalf("live map kept at peak %d (%d live)", tab.peak, tab.len())
	}
}
