package lifecycle

import (
	"os/exec"
	"strings"
	"testing"
)

// The lifecycle imports only the breaker (and the standard library): the
// roles call it, never the other way (#49). It fails when an import points
// anywhere else in fusebox.
func TestLifecycleImportsOnlyTheBreaker(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, imp := range strings.Fields(string(out)) {
		if strings.HasPrefix(imp, "github.com/fusebox-llm/fusebox/") && imp != "github.com/fusebox-llm/fusebox/pkg/breaker" {
			t.Errorf("pkg/lifecycle imports %s: only the breaker is allowed", imp)
		}
		if strings.Contains(imp, ".") && !strings.HasPrefix(imp, "github.com/fusebox-llm/fusebox/") {
			t.Errorf("pkg/lifecycle imports %s: no module outside the standard library", imp)
		}
	}
}
