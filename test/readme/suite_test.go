package readme

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSuiteRunsEveryStep (#54): make test runs every step whatever the
// ones before it did, and ends with a summary naming each failed step.
// Played with a go that fails vet and the observer e2e run: every later
// step still runs, the summary marks both FAIL, and the run exits 1.
// Before, make stopped at the first failing line, so the compose, deploy
// and browser suites never ran after a red race run.
func TestSuiteRunsEveryStep(t *testing.T) {
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	fakeGo := filepath.Join(dir, "go")
	script := `#!/bin/sh
echo "$(pwd) $* $FUSEBOX_E2E_PROFILE" >> ` + calls + `
case "$1" in
vet) [ "$(basename "$(pwd)")" = bench ] && exit 0; exit 2 ;;
test) [ "$FUSEBOX_E2E_PROFILE" = observer ] && exit 1; exit 0 ;;
esac
cat >/dev/null
exit 0
`
	if err := os.WriteFile(fakeGo, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "../suite.sh")
	cmd.Env = append(os.Environ(), "GO="+fakeGo, "FUSEBOX_E2E_PROFILE=")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1:\n%s", err, out)
	}
	log, _ := os.ReadFile(calls)
	for _, want := range []string{"/test/compose test", "/test/deploy test", "/test/browser test", "/test/bench vet"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("a step after the failing ones did not run (%q):\n%s", want, log)
		}
	}
	summary := string(out[strings.LastIndex(string(out), "=== make test: every step"):])
	for _, want := range []string{"vet            FAIL", "e2e observer   FAIL", "race           ok", "browser        ok", "make test: FAILED"} {
		if !strings.Contains(summary, want) {
			t.Errorf("the summary lacks %q:\n%s", want, summary)
		}
	}
}
