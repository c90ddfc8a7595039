package readme

import (
	"os/exec"
	"strings"
	"testing"
)

// conventionBase is the last commit before the commit convention
// (CONTRIBUTING.md) began: every commit after it is held to it.
const conventionBase = "0fb541e"

// TestCommitSubjects holds the commits since the convention to it: a
// subject of at most 72 characters with no period at its end, and a body
// set off by a blank line. Before it, subjects had a median length of 339
// characters (#51), and git log --oneline could not be read.
func TestCommitSubjects(t *testing.T) {
	if err := exec.Command("git", "-C", "../..", "cat-file", "-e", conventionBase+"^{commit}").Run(); err != nil {
		t.Skipf("this checkout's history does not reach %s (a shallow clone, or no git): %v", conventionBase, err)
	}
	out, err := exec.Command("git", "-C", "../..", "log", "--format=%h%x00%B%x01", conventionBase+"..HEAD").Output()
	if err != nil {
		t.Fatalf("git log: %v", err)
	}
	n := 0
	for _, rec := range strings.Split(string(out), "\x01") {
		rec = strings.TrimLeft(rec, "\n")
		if rec == "" {
			continue
		}
		hash, msg, _ := strings.Cut(rec, "\x00")
		lines := strings.Split(strings.TrimRight(msg, "\n"), "\n")
		subject := lines[0]
		n++
		if len(subject) > 72 {
			t.Errorf("%s: a subject of %d characters (at most 72): %q", hash, len(subject), subject)
		}
		if strings.HasSuffix(subject, ".") {
			t.Errorf("%s: the subject ends in a period: %q", hash, subject)
		}
		if len(lines) > 1 && lines[1] != "" {
			t.Errorf("%s: no blank line between the subject and the body", hash)
		}
	}
	t.Logf("%d commits since %s", n, conventionBase)
}
